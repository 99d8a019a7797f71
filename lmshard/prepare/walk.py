"""Which files an input names: a file itself, a glob's matches, or the walk of a directory, and
a count, by reason, of the files a walk leaves out.

A directory walk reads every file of a known type (by suffix, `files.known_type`; any file
with --format) and leaves out, counting them:
- hidden entries (a name starting with "."): `.git`, `.venv`, `.cache`, editor swaps. A hidden
  directory is not entered, so it counts once; `include_hidden` takes them;
- lmshard's own outputs: a dataset (a directory holding dataset_metadata.json and
  tokenizer_state.json), a build (_PREPARE_IN_PROGRESS), and the entries a run keeps beside its
  output (`.NAME.lmshard-partial/`, `-work/`, `-lock`, ...), even with `include_hidden`: a
  dataset written inside its own input directory is never read back as input;
- files of an unknown type, counted by suffix (".png", ".1.gz"). A few files of each suffix are
  sniffed so that the fix can name --format text when they look like text.
A file named on the command line is always read, hidden or not. Globs follow Python's `glob`:
`*` matches no hidden name unless `include_hidden`.

Memory model: the paths taken (the run needs them all) and a few sample paths per skipped
suffix; a sniff reads SNIFF_BYTES of one file.
"""

from __future__ import annotations

import codecs
import glob
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError, LmshardError
from ..format import IN_PROGRESS_FILE, METADATA_FILE, TOKENIZER_FILE, SkippedInputs
from .files import NO_SUFFIX, Source, compression_of, known_type, read_prefix, type_suffix

SNIFF_BYTES = 4096  # decompressed bytes of a skipped file read to tell text from binary
SNIFF_FILES = 3  # files of each skipped suffix sniffed: text when some are and none is binary
CONTROL_PER_MILLE = 10  # text has at most this many control characters per 1000 (tab, newline excepted)
_TEXT_CONTROLS = "\t\n\r\f\v\b\x1b"  # in text: troff's backspaces, ANSI colours in logs
# What lmshard keeps beside an output: staging.py's build, lock, retired and trash entries,
# taskplan.py's work directory, interop's staging, the packing plan cache.
_LMSHARD_ENTRY = re.compile(r"\.(?:.+\.)?lmshard-(?:partial|work|retired|lock|cache|(?:trash|interop|replaced)-.+)")
FORMATS_FIX = (
    "name files .txt, .md, .jsonl, .json, .csv, .parquet or .arrow (optionally .gz/.zst/.bz2/.xz), or pass "
    "--format to read every file as one format"
)


@dataclass
class Walk:
    """What an input named: the files to read, and counts of the files a walk left out."""

    taken: list[str] = field(default_factory=list)
    unknown: Counter[str] = field(default_factory=Counter)  # type suffix → files
    samples: dict[str, list[str]] = field(default_factory=dict)  # type suffix → up to SNIFF_FILES paths
    hidden_files: int = 0
    hidden_dirs: int = 0
    lmshard: int = 0
    excluded: int = 0
    unreadable_dirs: int = 0

    def skipped(self) -> SkippedInputs:
        unknown = dict(sorted(self.unknown.items(), key=lambda kv: (-kv[1], kv[0])))
        return SkippedInputs(unknown_type=unknown, hidden_files=self.hidden_files, hidden_dirs=self.hidden_dirs,
                             lmshard=self.lmshard, excluded=self.excluded,
                             unreadable_dirs=self.unreadable_dirs)  # fmt: skip

    def enters(self, name: str, include_hidden: bool) -> bool:
        """Whether the walk goes into the directory `name`; counts it when not."""
        if _LMSHARD_ENTRY.fullmatch(name):
            self.lmshard += 1
        elif name.startswith(".") and not include_hidden:
            self.hidden_dirs += 1
        else:
            return True
        return False

    def consider(self, path: Path, fmt_override: str | None, include_hidden: bool) -> None:
        """Take the file `path`, or count why not."""
        if _LMSHARD_ENTRY.fullmatch(path.name):
            self.lmshard += 1
        elif path.name.startswith(".") and not include_hidden:
            self.hidden_files += 1
        elif not path.is_file():
            pass  # a FIFO, socket or dangling link: nothing a walk should open
        elif known_type(path, fmt_override):
            self.taken.append(str(path))
        else:
            suffix = type_suffix(path)
            self.unknown[suffix] += 1
            if len(sample := self.samples.setdefault(suffix, [])) < SNIFF_FILES:
                sample.append(str(path))


def find(spec: str, fmt_override: str | None, include_hidden: bool) -> Walk:
    """The files `spec` names: a directory's walk, a file itself, or a glob's matches (sorted)."""
    if os.path.isdir(spec):
        return walk(spec, fmt_override, include_hidden)
    if os.path.exists(spec):
        return Walk(taken=[spec])
    matches = glob.glob(spec, recursive=True, include_hidden=include_hidden)
    return Walk(taken=sorted(p for p in matches if os.path.isfile(p)))


def walk(root: str, fmt_override: str | None, include_hidden: bool) -> Walk:
    """The files under `root` that prepare reads, sorted by path, and counts of the rest (see
    the module doc). Linked directories are not followed."""
    found = Walk()

    def unreadable(e: OSError) -> None:
        if e.filename == root:
            raise InputError(f"{root}: cannot list the directory ({e.strerror})")
        found.unreadable_dirs += 1

    for top, dirs, files in os.walk(root, onerror=unreadable):
        if IN_PROGRESS_FILE in files or (METADATA_FILE in files and TOKENIZER_FILE in files):
            found.lmshard += 1  # a dataset, or a build of one: not entered
            dirs.clear()
            continue
        dirs[:] = [d for d in sorted(dirs) if found.enters(d, include_hidden)]
        for name in sorted(files):
            found.consider(Path(top, name), fmt_override, include_hidden)
    found.taken.sort()
    return found


def nothing_to_read(spec: str, found: Walk) -> InputError:
    """The error for an input that names no file to read: what was skipped and the fix."""
    skipped = found.skipped()
    if not os.path.isdir(spec):
        return InputError(f"{spec}: no input files found (check the path, glob or --exclude)")
    if not skipped:
        return InputError(f"{spec}: the directory holds no files (check the path)")
    return InputError(f"{spec}: nothing to read: skipped {describe(skipped)}; {_fix(found, skipped)}")


def _fix(found: Walk, skipped: SkippedInputs) -> str:
    if hint := text_hint([found]):
        return hint
    if skipped.unknown_type:
        return FORMATS_FIX
    if skipped.hidden_dirs or skipped.hidden_files:
        return "pass --include-hidden to read hidden files and directories"
    if skipped.excluded:
        return "check --exclude"
    if skipped.unreadable_dirs:
        return "check the directories' permissions"
    return "prepare does not read lmshard's own datasets and work directories; name the files they were made from"


def describe(skipped: SkippedInputs) -> str:
    """ "17,867 files of unknown type (.1.gz 17,867), 2 hidden directories, 1 hidden file"."""
    parts = []
    if skipped.unknown_type:
        parts.append(f"{_n(sum(skipped.unknown_type.values()), 'file')} of unknown type "
                     f"({by_suffix(skipped.unknown_type)})")  # fmt: skip
    for n, one, many in (
        (skipped.hidden_dirs, "hidden directory", "hidden directories"),
        (skipped.hidden_files, "hidden file", "hidden files"),
        (skipped.lmshard, "lmshard dataset or work directory", "lmshard datasets or work directories"),
        (skipped.excluded, "file matching --exclude", "files matching --exclude"),
        (skipped.unreadable_dirs, "unreadable directory", "unreadable directories"),
    ):
        if n:
            parts.append(_n(n, one, many))
    return ", ".join(parts)


def by_suffix(counts: dict[str, int], top: int = 4) -> str:
    """ ".1.gz 17,867, .png 3 and 2 more suffixes": the most common first."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{suffix} {n:,}" for suffix, n in ranked[:top])
    more = len(ranked) - top
    return shown + (f" and {_n(more, 'more suffix', 'more suffixes')}" if more > 0 else "")


def _n(n: int, one: str, many: str = "") -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def text_hint(walks: list[Walk]) -> str | None:
    """The fix for skipped files that look like text: --format text, with --exclude for the
    skipped suffixes that do not; None when no skipped suffix looks like text."""
    counts: Counter[str] = sum((w.unknown for w in walks), Counter())
    samples: dict[str, list[str]] = {}
    for w in walks:
        for suffix, paths in w.samples.items():
            samples.setdefault(suffix, []).extend(paths)
    ranked = [suffix for suffix, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    text = [suffix for suffix in ranked if looks_like_text(samples[suffix][:SNIFF_FILES])]
    if not text:
        return None
    names = ["suffix-less" if suffix == NO_SUFFIX else suffix for suffix in text]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3:,} more" if len(names) > 3 else "")
    others = [suffix for suffix in ranked if suffix not in text and suffix != NO_SUFFIX]
    exclude = "".join(f" --exclude '*{suffix}'" for suffix in others[:3])
    rest = f" (and --exclude for {_n(len(others) - 3, 'more suffix', 'more suffixes')})" if len(others) > 3 else ""
    return (f"the skipped {shown} files look like text: pass --format text{exclude}{rest} to read them (it reads "
            "every file as text)")  # fmt: skip


def looks_like_text(paths: list[str]) -> bool:
    """Whether files read as text: some of them are UTF-8 text, and none is binary."""
    verdicts = [v for v in map(_sniff, paths) if v is not None]
    return bool(verdicts) and all(verdicts)


def _sniff(path: str) -> bool | None:
    """Whether a file's first SNIFF_BYTES (decompressed) are UTF-8 text with few control
    characters; None for an empty or unreadable file (no evidence either way)."""
    try:
        data = read_prefix(Source(path, "text", compression_of(path), 0), SNIFF_BYTES)[:SNIFF_BYTES]
    except (LmshardError, OSError):
        return None
    if not data.strip():
        return None
    if b"\x00" in data:
        return False
    try:  # not final: the prefix may end inside a character
        text = codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return False
    controls = sum(1 for c in text if c < " " and c not in _TEXT_CONTROLS)
    return controls * 1000 <= CONTROL_PER_MILLE * len(text)
