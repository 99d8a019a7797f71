"""`make demo`: prepare → inspect → loader batches → a short training run, on the embedded
demo corpus (Python's standard library sources; nothing to download)."""

from __future__ import annotations

import os
import pprint
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "demo"
BIN = Path(sys.executable).parent


def banner(text: str) -> None:
    """A bold heading on a terminal; plain text in a pipe or a log, and with NO_COLOR set."""
    bold = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    print(f"\n\033[1m=== {text}\033[0m" if bold else f"\n=== {text}", flush=True)


def run(*cmd: str) -> None:
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def show_batches() -> None:
    from lmshard import TokenDataset
    from lmshard.tokenizers import load_tokenizer

    train = TokenDataset(DATA, split="train")
    batches = train.random_batches(batch_size=4, seq_len=32, seed=1337, cu_seqlens=True)
    print(f"{train}\n{batches}")
    tok = load_tokenizer(train.meta.tokenizer.name if train.meta else "gpt2")
    for _ in range(2):
        batch = next(batches)
        x, y = batch
        print(f"step {batch.step}: x {tuple(x.shape)} {x.dtype}, y = x shifted by {batch.shift}\n"
              f"  row offsets {batch.offsets.tolist()}\n  cu_seqlens {batch.cu_seqlens.tolist()}")  # fmt: skip
        print(f"  row 0 decoded: {tok.decode(x[0].tolist())!r}")
    state = batches.state_dict()
    shown = pprint.pformat(state, width=76, sort_dicts=False).replace("\n", "\n  ")
    print(f"resumable from batches.state_dict():\n  {shown}")


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    banner("1/4 prepare: Python's standard library sources → GPT-2 token shards")
    run(str(BIN / "lmshard"), "prepare", "--demo", "--out", str(DATA), "--overwrite")
    banner("2/4 inspect: verify every shard against the metadata, show what is inside")
    run(str(BIN / "lmshard"), "inspect", str(DATA), "--sample", "1", "--top", "8")
    banner("3/4 runtime loader: batches as train.py sees them")
    show_batches()
    banner("4/4 a tiny GPT trained for a few steps from these batches (loss should fall)")
    run(sys.executable, "scripts/train_tiny_gpt.py", "--dataset_dir", str(DATA), "--steps", "120", "--log-every", "20")
    banner("done")
    print(f"dataset: {DATA}\nnext:\n"
          f"  lmshard prepare YOUR_FILES --out data/mine   # txt/jsonl/json/csv/parquet/arrow\n"
          f"  lmshard inspect data/mine --sample 3\n"
          f"  python scripts/train_tiny_gpt.py --dataset_dir data/mine\n"
          f"  python scripts/train_tiny_gpt.py --input_file input.txt   # small text, no prepare\n"
          f"  from lmshard import TokenDataset                          # in your train.py\n"
          f"  make test / make bench")  # fmt: skip


if __name__ == "__main__":
    main()
