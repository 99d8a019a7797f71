"""scripts/bench_cluster.py's reading of an strace log: what docs/scaling.md's file-operation
tables are made of."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_cluster  # noqa: E402

W = "/r/.out.lmshard-work"
# Two processes (strace -f): a call of one is cut by a call of the other and resumed after it, as
# strace writes it, the rest padded with spaces before its " = ".
LOG = f"""\
7040  openat(AT_FDCWD</r>, "{W}/select/.unit_000001.json.x.tmp", O_RDWR|O_CREAT|O_EXCL|O_CLOEXEC, 0600 <unfinished ...>
7049  openat(AT_FDCWD</r>, "{W}/lines/.unit_000000.bin.h.tmp", O_RDWR|O_CREAT|O_CLOEXEC, 0666 <unfinished ...>
7040  <... openat resumed>)             = 5</r/.out.lmshard-work/select/.unit_000001.json.x.tmp>
7049  <... openat resumed>)             = 14</r/.out.lmshard-work/lines/.unit_000000.bin.h.tmp>
7049  newfstatat(AT_FDCWD</r>, "{W}/lines/.unit_000000.bin.h.tmp",  <unfinished ...>
7040  rename("{W}/select/.unit_000001.json.x.tmp", "{W}/select/unit_000001.json") = 0
7049  <... newfstatat resumed>{{st_mode=S_IFREG|0644, st_size=0, ...}}, 0) = 0
7049  newfstatat(14</r/.out.lmshard-work/lines/.unit_000000.bin.h.tmp>, "", {{st_mode=S_IFREG|0644}}, AT_EMPTY_PATH) = 0
7049  rename("{W}/lines/.unit_000000.bin.h.tmp", "{W}/lines/unit_000000.bin") = 0
7049  mkdir("{W}/tokenize", 0777)          = -1 EEXIST (File exists)
7040  openat(AT_FDCWD</r>, "/usr/lib/python3.11/os.py", O_RDONLY|O_CLOEXEC) = 3</usr/lib/python3.11/os.py>
"""


def test_calls_cut_by_another_process_and_resumed_are_counted():
    roots = bench_cluster.Roots(inputs="/in", work=W, run="/r", cwd="/r")
    counts = bench_cluster.count_trace(iter(LOG.splitlines(True)), roots)
    # by hand: 2 opens (both creating), 1 stat by name (the fstat of an open file is no lookup),
    # 2 renames and 1 mkdir (creates); the interpreter's own file is outside the run
    assert (counts["opens"], counts["stats"], counts["creates"], counts["unlinks"]) == (2, 1, 5, 0)
    assert counts["meta"] == 2 + 1 + 2 + 1
