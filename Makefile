# One dev loop: the same targets locally and in .ci/run.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.lmshard-setup
INTEROP := $(VENV)/interop
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: setup test test-engines lint bench demo clean

setup: $(STAMP)

# Re-runs only when the dependencies (or these install lines) change. torch is pinned to the build on local disk: any
# other spec would pull a multi-GB CUDA wheel. The export tests read back with the real libraries: litdata (its
# lightning-utilities, tifffile and obstore are in the test extra) without the torchvision it names, as PyPI's
# torchvision is built for CUDA torch and breaks every import of it beside the CPU build (transformers' among them);
# MosaicML streaming and OLMo-core, which pin numpy < 2.2 and rich < 14, in an environment of their own (INTEROP).
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q "torch==2.13.0"
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[test,zstd,hf,tokenizers,sentencepiece,fast,torch,plot,s3,http,lang]"
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps "litdata==0.2.76"
	test -x $(INTEROP)/bin/python || $(PYTHON) -m venv $(INTEROP)
	$(INTEROP)/bin/python -m pip install --disable-pip-version-check -q "torch==2.13.0" "mosaicml-streaming==0.13.0" \
	  "ai2-olmo-core==3.0.0"
	$(INTEROP)/bin/python -m pip uninstall --disable-pip-version-check -y -q torchvision
	$(BIN)/lmshard tokenizer fetch gpt2
	touch $(STAMP)

# Two pytest processes (pytest-xdist), each taking whole test files, so that module fixtures are built once: the
# suite is mostly one busy process at a time (its subprocesses aside), and halves its time on two cores. The package is
# compiled first (only what changed): with PYTHONDONTWRITEBYTECODE set, as on these machines, every lmshard command and
# pool worker a test starts would compile it again (0.3 s each; a fifth of test_stage_safety.py's time).
test: setup
	@echo "make test: every test but the real-engine ones (make test-engines); about 7 min on 2 quiet cores, in two processes, counted as it goes; the 15 slowest are listed at the end"
	$(BIN)/python -m compileall -q lmshard
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not engines" -n 2 --dist loadfile -o console_output_style=count --durations=15

# Scale-out on real engines started by the tests (a single-node Slurm cluster on loopback, a local Ray
# cluster). Installs Debian's Slurm packages when missing (as root) and the ray extra; fails, not skips, without them.
test-engines: setup
	@command -v slurmctld >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge; }
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[ray]"
	$(BIN)/python -m compileall -q lmshard
	LMSHARD_REQUIRE_ENGINES=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m engines

lint: setup
	$(BIN)/ruff check lmshard tests scripts
	$(BIN)/mypy

# bench_cluster.py counts each task's file operations under strace, which is installed (as root) when missing.
# bench_minhash.py and bench_decon.py run datatrove in a virtual environment of its own, so the project's stays as pinned;
# when datatrove cannot be installed, the benchmark says so and measures lmshard alone.
DATATROVE := $(VENV)/bench-datatrove

bench: setup
	$(BIN)/python scripts/bench_prepare.py
	$(BIN)/python scripts/bench_loader.py
	$(BIN)/python scripts/bench_schedule.py
	$(BIN)/python scripts/bench_attributes.py
	$(BIN)/python scripts/bench_tokenizers.py
	$(BIN)/python scripts/bench_llama.py
	$(BIN)/python scripts/bench_packing.py
	git worktree prune; git worktree list | grep -q /tmp/lmshard-reader || git worktree add --detach /tmp/lmshard-reader 8f3b906
	$(BIN)/python scripts/bench_scaleout.py --reader /tmp/lmshard-reader
	$(BIN)/python scripts/bench_scaleout.py --reader /tmp/lmshard-reader --dedup-lines
	$(BIN)/python scripts/bench_scaling.py
	command -v strace >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends strace; }; $(BIN)/python scripts/bench_cluster.py && $(BIN)/python scripts/bench_cluster.py --dedup-lines && $(BIN)/python scripts/bench_retokenize_tasks.py
	$(BIN)/python scripts/bench_retokenize_tasks.py --speed
	$(BIN)/python scripts/bench_remote.py
	$(BIN)/python scripts/bench_stream.py
	$(BIN)/python scripts/bench_encodings.py
	test -x $(DATATROVE)/bin/python || { $(BIN)/python -m venv $(DATATROVE) && $(DATATROVE)/bin/python -m pip install \
	  --disable-pip-version-check -q "datatrove==0.10.1" "spacy==3.8.18" "xxhash<4" regex tokenizers; } || rm -rf $(DATATROVE)
	$(BIN)/python scripts/bench_minhash.py --datatrove-python $(DATATROVE)/bin/python
	$(BIN)/python scripts/bench_decon.py --datatrove-python $(DATATROVE)/bin/python
	$(BIN)/python scripts/bench_near_clusters.py

demo: setup
	$(BIN)/python scripts/demo.py

clean:
	rm -rf $(VENV) data/demo .pytest_cache
