"""`python -m lmshard` and the `lmshard` command. A Ctrl-C while the command line interface is
still importing ends quietly with exit 130, as one during a run does (cli/commands.py)."""

import os
import sys


def main() -> None:
    # numpy's OpenBLAS starts a thread pool when imported, which lmshard's commands never use:
    # without it the process runs one thread, so prepare can fork its workers (pool.start_method).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: before the command started, nothing was done\n")
        raise SystemExit(130) from None
    run()


if __name__ == "__main__":
    main()
