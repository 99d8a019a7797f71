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
  sniffed, and the suffixes whose files look like text are recorded: when such files are at
  least as many as the files read, the warning (or the error, when nothing is read) names
  --format text (`SkippedInputs.text_hint`).
A file named on the command line is read, hidden or not (unless excluded). Globs follow `glob`:
`*` matches no hidden name unless `include_hidden`.

Memory model: the paths taken (the run needs them all) and a few sample paths per skipped
suffix; a sniff reads SNIFF_BYTES of one file.
"""

from __future__ import annotations

import codecs
import fnmatch
import functools
import glob
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ...errors import InputError, LmshardError
from ...format import IN_PROGRESS_FILE, METADATA_FILE, TOKENIZER_FILE
from ...format.skipped import NO_SUFFIX, SkippedInputs
from ...remote.urls import is_url, redact
from .files import Source, compression_of, known_type, read_prefix, type_suffix

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


@dataclass(frozen=True)
class Rules:
    """What a walk takes: `fmt_override` (--format: every file), `include_hidden`, and the
    `exclude` globs (fnmatch against the whole path: `*` also matches "/"). `own`: the run's
    `--out` (absolute), whose dataset, build and work folder a walk leaves out without counting
    them, so that a dataset written inside its input directory records the same skipped inputs
    whether the walk found them (a resumed run, a cluster's finish) or not (a new run)."""

    fmt_override: str | None = None
    include_hidden: bool = False
    exclude: tuple[str, ...] = ()
    own: str | None = None

    def owns(self, top: str, name: str) -> bool:
        """Whether `top`/`name` is the run's own: its `--out`, or an entry it keeps beside it
        (their folders compared as the filesystem resolves them: a link to either is the same)."""
        if self.own is None:
            return False
        out = os.path.basename(self.own)
        if name != out and not name.startswith(f".{out}.lmshard-"):
            return False
        return _real(top or ".") == _real(os.path.dirname(self.own))


@dataclass
class Walk:
    """What an input named: the files to read, and counts of the files a walk left out."""

    rules: Rules
    taken: list[str] = field(default_factory=list)
    unknown: Counter[str] = field(default_factory=Counter)  # type suffix → files
    samples: dict[str, list[str]] = field(default_factory=dict)  # type suffix → up to SNIFF_FILES paths
    hidden_files: int = 0
    hidden_dirs: int = 0
    lmshard: int = 0
    excluded: int = 0
    unreadable_dirs: int = 0
    unreadable: list[str] = field(default_factory=list)  # the first few directories it could not list
    matched: set[str] = field(default_factory=set)  # the --exclude patterns that left a file out

    def skipped(self) -> SkippedInputs:
        """The counts as the metadata records them; sniffs the samples of each skipped suffix."""
        unknown = dict(sorted(self.unknown.items(), key=lambda kv: (-kv[1], kv[0])))
        text_like = [suffix for suffix in unknown if looks_like_text(self.samples[suffix])]
        return SkippedInputs(unknown_type=unknown, hidden_files=self.hidden_files, hidden_dirs=self.hidden_dirs,
                             lmshard=self.lmshard, excluded=self.excluded, unreadable_dirs=self.unreadable_dirs,
                             text_like=text_like)  # fmt: skip

    def enters(self, name: str) -> bool:
        """Whether the walk goes into the directory `name`; counts it when not."""
        if _LMSHARD_ENTRY.fullmatch(name):
            self.lmshard += 1
        elif name.startswith(".") and not self.rules.include_hidden:
            self.hidden_dirs += 1
        else:
            return True
        return False

    def consider(self, path: Path) -> None:
        """Take the file `path`, or count why not: an excluded file counts as excluded, whatever
        its type."""
        self.consider_named(str(path), path.name, path.is_file)

    def consider_named(self, path: str, name: str, regular: Callable[[], bool] = lambda: True) -> None:
        """`consider` for a file called `name` at `path` (a local path, or a URL found by a
        listing), which `regular` says is a regular file."""
        if _LMSHARD_ENTRY.fullmatch(name):
            self.lmshard += 1
        elif name.startswith(".") and not self.rules.include_hidden:
            self.hidden_files += 1
        elif not regular():
            pass  # a FIFO, socket or dangling link: nothing a walk should open
        elif self._excluded(shown(path)):
            self.excluded += 1
        elif known_type(PurePosixPath(name), self.rules.fmt_override):
            self.taken.append(path)
        else:
            suffix = type_suffix(PurePosixPath(name)) or NO_SUFFIX
            self.unknown[suffix] += 1
            if len(sample := self.samples.setdefault(suffix, [])) < SNIFF_FILES:
                sample.append(path)

    def take(self, paths: list[str]) -> Walk:
        """Take named files (a file itself, a glob's matches), leaving out the excluded ones."""
        self.taken = [p for p in paths if not self._excluded(shown(p))]
        self.excluded = len(paths) - len(self.taken)
        return self

    def _excluded(self, path: str) -> bool:
        """Whether an --exclude pattern matches `path` (each that does is recorded)."""
        hits = [pattern for pattern in self.rules.exclude if fnmatch.fnmatch(path, pattern)]
        self.matched.update(hits)
        return bool(hits)

    def absorb(self, other: Walk) -> None:
        """Add the walk of a directory a glob matched: its files and its counts."""
        self.taken += other.taken
        self.unknown += other.unknown
        for suffix, paths in other.samples.items():
            self.samples[suffix] = (self.samples.get(suffix, []) + paths)[:SNIFF_FILES]
        self.hidden_files += other.hidden_files
        self.hidden_dirs += other.hidden_dirs
        self.lmshard += other.lmshard
        self.excluded += other.excluded
        self.unreadable_dirs += other.unreadable_dirs
        self.unreadable = (self.unreadable + other.unreadable)[:3]
        self.matched |= other.matched


@functools.lru_cache(maxsize=256)
def _real(folder: str) -> str:
    """A folder as the filesystem resolves it (links followed), once per folder of a walk."""
    return os.path.realpath(folder)


def shown(path: str) -> str:
    """How a path is shown and matched by --exclude: a URL without its credentials."""
    return redact(path) if is_url(path) else path


def find(spec: str, rules: Rules) -> Walk:
    """The files `spec` names: a directory's walk, a file itself, or a glob's matches (sorted by
    path; a directory it matches walked, as one named on the command line is)."""
    if os.path.isdir(spec):
        return walk(spec, rules)
    if os.path.exists(spec):
        return Walk(rules).take([spec])
    matches = [p for p in sorted(glob.glob(spec, recursive=True, include_hidden=rules.include_hidden))
               if not rules.owns(os.path.dirname(p), os.path.basename(p))]  # fmt: skip
    found = Walk(rules)
    found.lmshard += sum(1 for p in matches if _LMSHARD_ENTRY.fullmatch(os.path.basename(p)))
    matches = [p for p in matches if not _LMSHARD_ENTRY.fullmatch(os.path.basename(p))]
    found.take([p for p in matches if os.path.isfile(p)])
    for directory in (p for p in matches if os.path.isdir(p)):
        found.absorb(walk(directory, rules))
    found.taken.sort()
    return found


def walk(root: str, rules: Rules) -> Walk:
    """The files under `root` that prepare reads, sorted by path, and counts of the rest (see
    the module doc). Linked directories are not followed."""
    found = Walk(rules)

    def unreadable(e: OSError) -> None:
        if e.filename == root:
            raise InputError(f"{root}: cannot list the directory ({e.strerror})")
        found.unreadable_dirs += 1
        if len(found.unreadable) < 3:
            found.unreadable.append(f"{e.filename} ({e.strerror})")

    for top, dirs, files in os.walk(root, onerror=unreadable):
        if IN_PROGRESS_FILE in files or (METADATA_FILE in files and TOKENIZER_FILE in files):
            found.lmshard += 1  # a dataset, or a build of one: not entered
            dirs.clear()
            continue
        dirs[:] = [d for d in sorted(dirs) if not rules.owns(top, d) and found.enters(d)]
        for name in sorted(files):
            if not rules.owns(top, name):
                found.consider(Path(top, name))
    found.taken.sort()
    return found


def nothing_to_read(spec: str, found: Walk) -> InputError:
    """The error for an input that names no file to read: what was skipped and the fix."""
    skipped = found.skipped()
    try:
        os.stat(spec)
    except PermissionError as e:  # a file in a directory it may not enter: not "no such file"
        return InputError(f"{spec}: cannot reach it ({e.strerror}); check the permissions of the directories "
                          "on its path")  # fmt: skip
    except OSError:
        pass
    if not os.path.isdir(spec):
        return InputError(f"{spec}: no input files found (check the path, glob or --exclude)")
    if not skipped:
        return InputError(f"{spec}: the directory holds no files (check the path)")
    fix = skipped_fix(skipped)
    if skipped.text_hint(files_read=0):  # the per-input form reads this one as text and leaves the others be
        fix += f"; or read this input alone as text: text:{spec}"
    return InputError(f"{spec}: nothing to read: skipped {describe(skipped)}; {fix}")


def skipped_fix(skipped: SkippedInputs) -> str:
    if hint := skipped.text_hint(files_read=0):
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


def looks_like_text(paths: list[str]) -> bool:
    """Whether files read as text: some of them are UTF-8 text, and none is binary."""
    verdicts = [v for v in map(_sniff, paths) if v is not None]
    return bool(verdicts) and all(verdicts)


def _sniff(path: str) -> bool | None:
    """Whether a file's first SNIFF_BYTES (decompressed) are UTF-8 text with few control
    characters; None for an empty or unreadable file (no evidence either way)."""
    url = path if is_url(path) else ""  # a URL found by a listing: read through its redacted name
    src = Source(shown(path), "text", compression_of(path), 0, url=url)
    try:
        data = read_prefix(src, SNIFF_BYTES)[:SNIFF_BYTES]
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
