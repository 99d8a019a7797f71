"""`python -m lmshard` and the `lmshard` command. A Ctrl-C while the command line interface is
still importing ends quietly with exit 130, as one during a run does (cli.py)."""

import sys


def main() -> None:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    run()


if __name__ == "__main__":
    main()
