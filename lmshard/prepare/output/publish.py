"""`prepare --out URL`: the dataset is built in a local work directory by the ordinary run (with
its lock, staging, swap and resume) and published to the object store, which has no rename, by
an explicit commit (docs/format.md, "Datasets in object stores"):

1. **One writer.** `URL/_lmshard_writer.json` is created with a conditional put (If-None-Match:
   * on S3): a second run finds it and stops, naming the holder. The run removes it when done; a
   run that died leaves it: a later run of the same machine whose pid is gone takes it over.
   It resumes that run's work with --resume; without, while that run's build is there, the run
   is refused (as a local --out refuses); --overwrite, or a deleted build, discards it: the objects
   it uploaded and never committed are removed first.
2. **Data first.** Shards are uploaded while the run builds (each once its `.bin`, `.idx` and
   `.sums` are complete), then every other file. A new dataset goes at the prefix itself, in the
   local layout. A replaced one (`--overwrite`) goes whole under a new generation prefix
   `URL/g-<id>/`, so the old one is never touched while it is still the dataset.
3. **The metadata last: the commit.** `URL/dataset_metadata.json` is written last (for a new
   generation: `URL/g-<id>/dataset_metadata.json`, then the redirect at `URL/`). A reader sees the
   old dataset or the new one, whole.
4. **Then the old objects go**: the files the replaced dataset's metadata names, and nothing
   lmshard did not write.

`--append` adds new shard and key objects beside the old ones and commits a new metadata object;
the old objects are not rewritten. The work directory is `$LMSHARD_CACHE_DIR/publish/<hash of the
URL>/` (~/.cache/lmshard; `LMSHARD_PUBLISH_DIR` moves it); `publish.json` and `publish.log`
there record the run and its uploads, so `--resume` skips them.

Memory model: the file lists and the journal (a few hundred bytes per object, each upload one
appended line on disk); uploads stream from disk.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import ConfigError, LmshardError, warn
from ...format import METADATA_FILE, DatasetMeta, dataset_files, file_checksums, file_xxh3, shard_file_sizes
from ...remote import Remote, RemoteError, redact
from ...remote.dataset import open_remote
from ...remote.urls import output_url
from ..config import PrepareConfig
from ..execution.taskplan import work_dir
from .build import Progress
from .journal import JOURNAL, UPLOADED, Journal, holder_state, refuse_to_discard, work_root
from .staging import Interrupted, OutputPaths

LOCK_OBJECT = "_lmshard_writer.json"
UPLOADERS = 8  # concurrent uploads
POLL_SECONDS = 1.0  # how often the build is checked for finished shards


@dataclass(frozen=True)
class _Flags:
    overwrite: bool
    append: bool
    resume: bool


class Publisher:
    """One run writing a dataset to a URL (`prepare`, `import`): the claim of the prefix, the
    uploads, the commit. Build the dataset in `mirror` between `claim()` and `publish(meta)`."""

    def __init__(self, url: str, *, overwrite: bool = False, append: bool = False, resume: bool = False,
                 retry: Any = None, hint: str = "pass --overwrite to replace it, --append to add to it, or --resume "
                 "to finish an interrupted run", resumable: bool = True, source: str = "") -> None:  # fmt: skip
        output_url(url)
        self.config, self.url, self.hint = _Flags(overwrite, append, resume), url.rstrip("/"), hint
        self.replaces: dict[str, Any] | None = None  # an --overwrite's replaced dataset: its root and files
        self.complete: DatasetMeta | None = None  # --resume of a dataset already committed
        self.remote = Remote(self.url, retry=retry)
        self.root = work_root(self.url)
        self.mirror = self.root / "ds"
        self.previous: DatasetMeta | None = None
        self.previous_remote: Remote | None = None
        self.generation = ""
        self.journal: Journal | None = None
        self.discarded: str | None = None  # what an interrupted run left that this one cleared
        self.resumable = resumable
        self.source = source  # what a copy uploads (an identity of its source), so a copy run again resumes it
        self._stop = threading.Event()

    # -- claim ---------------------------------------------------------------------------------
    def claim(self) -> None:
        """Take the writer lock, read what the prefix holds, and decide where the new objects go."""
        old = Journal.load(self.root / JOURNAL) if self.config.resume else None
        if old is not None and self.resumable and not old.state.get("resumable", True):
            old = None  # an interrupted copy's or import's: not this run's to go on with (cleared below)
        run = old.state["run"] if old else f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        holder = {"run": run, "host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        if not self.remote.create(LOCK_OBJECT, json.dumps(holder).encode()):
            held = self._holder()
            state = holder_state(held)
            if state == "alive" or (state == "unknown" and not (old and held.get("run") == run)):
                who = ", ".join(f"{k} {held[k]}" for k in ("host", "pid", "run") if held.get(k) is not None)
                since = f", since {time.ctime(held['since'])}" if isinstance(held.get("since"), int | float) else ""
                raise ConfigError(f"{redact(self.url)}: another prepare is writing here ({who or 'holder unknown'}"
                                  f"{since}); wait for it, or if it died: run it again with --resume on its machine, "
                                  f"or delete {redact(self.url)}/{LOCK_OBJECT} and the objects it uploaded, and run "
                                  "again")  # fmt: skip
            self.remote.put(LOCK_OBJECT, json.dumps(holder).encode())  # a dead holder's, or this run's own
        if self.remote.create(LOCK_OBJECT, json.dumps(holder).encode()):  # the lock is there: this must be refused
            warn(f"{redact(self.url)}: the store accepted a conditional PUT of an object that exists, so it does not "
                 "keep a second prepare from writing here at the same time; make sure only one does")  # fmt: skip
        try:
            self._survey(old, run)
        except BaseException:
            if not old:
                self.remote.delete([LOCK_OBJECT])
            raise

    def _holder(self) -> dict[str, Any]:
        try:
            held = json.loads(self.remote.read(LOCK_OBJECT, 1 << 16))
            return held if isinstance(held, dict) else {}
        except (ValueError, OSError):
            return {}

    def _survey(self, old: Journal | None, run: str) -> None:
        listing = self._listing()
        if METADATA_FILE in listing:
            self.previous, self.previous_remote = open_remote(self.url, retry=self.remote.retry)
        if old is None and self.config.resume and self.previous is not None and not (
                self.config.overwrite or self.config.append):  # fmt: skip
            self.complete = self.previous  # a run that finished and committed: nothing to resume
            return
        if old is not None:  # --resume: only uploads whose objects are there count as done
            self.generation, self.replaces = old.state.get("generation", ""), old.state.get("replaces")
            self.journal = old
            for rel in [r for r in old.uploaded if self._key(r) not in listing]:
                del old.uploaded[rel]
            return
        flags = self.config
        if flags.append and self.previous is None:
            raise ConfigError(f"{redact(self.url)}: --append: no dataset here to append to; leave --append out to "
                              "create one")  # fmt: skip
        left = [p for p in self._build_paths() if p.exists()]
        refuse_to_discard(self.root, redact(self.url), left, flags.overwrite, flags.append, self.resumable)
        if self._clear_unfinished(listing):
            listing = self._listing()
        if self.previous is not None and not (flags.overwrite or flags.append):
            raise ConfigError(f"{redact(self.url)}: already holds a dataset; {self.hint}")
        if self.previous is None and listing:
            shown = ", ".join(sorted(listing)[:3])
            if all(UPLOADED.fullmatch(k) for k in listing):
                raise ConfigError(f"{redact(self.url)}: holds lmshard's shard objects ({shown}...) but no "
                                  "dataset_metadata.json: the uploads of a prepare that never committed, whose work "
                                  "directory is not on this machine; run that prepare again with --resume where it "
                                  "ran, or delete these objects and run again")  # fmt: skip
            raise ConfigError(f"{redact(self.url)}: holds objects but no dataset_metadata.json ({shown}...), so "
                              "nothing here is known to be lmshard's; choose an empty prefix")  # fmt: skip
        if self.previous is not None and flags.overwrite:
            self.generation = time.strftime("g-%Y%m%dT%H%M%S-", time.gmtime()) + os.urandom(3).hex()
            self.replaces = {"root": self._old_generation(), "files": dataset_files(self.previous)}
        elif self.previous is not None:  # --append: beside the old objects, in the generation the dataset is in
            self.generation = self._old_generation()
        shutil.rmtree(self.root, ignore_errors=True)  # an earlier run's work: not resumed, so not needed
        self.root.mkdir(parents=True, exist_ok=True)
        self.journal = Journal.create(self.root / JOURNAL, {"run": run, "generation": self.generation,
                                                            "replaces": self.replaces,
                                                            "resumable": self.resumable,
                                                            "source": self.source})  # fmt: skip
        if flags.append and self.previous is not None:
            self._seed_append()

    def _listing(self) -> dict[str, int]:
        listing = self.remote.listing()
        listing.pop(LOCK_OBJECT, None)
        return listing

    def _old_generation(self) -> str:
        assert self.previous_remote is not None
        where = self.previous_remote.url
        return where[len(self.url) + 1 :] if where != self.url else ""

    def _clear_unfinished(self, listing: dict[str, int]) -> bool:
        """Finish what an earlier, unfinished run to this URL from this machine left (its journal
        lists it), as it is not resumed now: remove the objects it began to upload that are not
        the dataset's, and, where its replacement was committed, the replaced dataset's objects."""
        stale = Journal.load(self.root / JOURNAL)
        if stale is None:
            return False
        where = stale.state.get("generation", "")
        current = self._old_generation() if self.previous_remote is not None else None
        keep = set(dataset_files(self.previous)) if self.previous is not None and where == current else set()
        keys = [f"{where}/{rel}" if where else rel for rel in stale.started if rel not in keep]
        gone = [k for k in keys if k in listing]
        self.remote.delete(gone)
        when = time.ctime((self.root / JOURNAL).stat().st_mtime)
        self.discarded = f"discarded an interrupted run of this machine (started {when}): {len(gone):,} uncommitted " \
                         "objects removed"
        replaced = stale.state.get("replaces")
        if replaced and where == current:  # committed, then cut short before removing the old objects
            self._remove(replaced)
        stale.forget()
        return True

    def _seed_append(self) -> None:
        """The appended-to dataset in the work directory, as the local append needs it: its
        metadata, tokenizer files and dedup keys in full; its shards as sparse placeholders of
        their sizes (linked into the build, never read, never uploaded: the objects exist)."""
        meta, remote = self.previous, self.previous_remote
        assert meta is not None and remote is not None
        for rel in dataset_files(meta):
            target = self.mirror / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shard = next((s for s in meta.shards if rel in s.files()), None)
            if shard is None:
                target.write_bytes(remote.read(rel))
            else:
                size = next(expected for path, _, _, expected in shard_file_sizes(shard) if path == rel)
                with open(target, "wb") as f:
                    f.truncate(size)

    # -- uploads -------------------------------------------------------------------------------
    def _key(self, rel: str) -> str:
        return f"{self.generation}/{rel}" if self.generation else rel

    def _kept(self) -> set[str]:
        """An appended-to dataset's own files (but its metadata): in place already, and in the
        work directory only as placeholders, so never uploaded."""
        if self.previous is None or not self.config.append or self._replacing():
            return set()
        return set(dataset_files(self.previous)) - {METADATA_FILE}

    def _replacing(self) -> bool:
        return bool(self.replaces)

    def upload(self, base: Path, rel: str, expected: str | None = None) -> None:
        """Upload one file unless the journal has it with these bytes; `expected`: the xxh3-64 the
        metadata records: a file of other bytes is refused, never sent."""
        assert self.journal is not None
        if expected and self.journal.uploaded.get(rel) == expected:  # sent already with the bytes it must have
            return
        path = base / rel
        digest = file_xxh3(path)
        if expected and digest != expected:
            raise LmshardError(f"{path}: its bytes differ from the checksum its metadata records (damaged on disk?); "
                               "run again with --overwrite")  # fmt: skip
        if self.journal.uploaded.get(rel) == digest:
            return
        self.journal.begin(rel)
        self.remote.put_file(self._key(rel), path)
        if expected or file_xxh3(path) == digest:  # a finished build's files do not change while sent
            self.journal.record(rel, digest)

    def upload_finished(self) -> int:
        """Upload the shards the build has finished (`.bin`, `.idx`, `.sums`, `.blocks`, `.src`, `.attr` in
        place) and not yet uploaded; the number of files sent. A failure is left to the final publish, which
        sends what is missing and reports what cannot be sent."""
        assert self.journal is not None
        staging = OutputPaths.of(str(self.mirror)).staging
        done, sent = self.journal.uploaded.keys() | self._kept(), 0
        for sums in sorted(staging.glob("*/shard_*.sums")):
            trio = [sums.with_suffix(s) for s in (".bin", ".idx", ".sums")]
            for extra in (".blocks", ".src", ".attr"):  # (zstd block offsets, provenance, attributes: before .bin)
                if sums.with_suffix(extra).exists():
                    trio.append(sums.with_suffix(extra))
            rels = [str(p.relative_to(staging)) for p in trio]
            if not all(p.exists() for p in trio) or any(r in done for r in rels):
                continue
            try:
                for rel in rels:
                    self.upload(staging, rel)
                    sent += 1
            except Exception:  # (OSError, RemoteError, a file renamed by a resume meanwhile)
                continue
        return sent

    def watch(self) -> threading.Thread:
        """Upload finished shards while the local build runs (checked every POLL_SECONDS)."""

        def loop() -> None:
            while not self._stop.wait(POLL_SECONDS):
                self.upload_finished()

        thread = threading.Thread(target=loop, name="lmshard-upload", daemon=True)
        thread.start()
        return thread

    def stop_watching(self, thread: threading.Thread) -> None:
        self._stop.set()
        thread.join()

    # -- commit --------------------------------------------------------------------------------
    def publish(self, meta: DatasetMeta) -> None:
        """Every data object, then the metadata (the commit), then the replaced objects removed."""
        assert self.journal is not None
        files, expected = dataset_files(meta), file_checksums(meta)
        kept = self._kept()
        data = [r for r in files[:-1] if r not in kept]
        with ThreadPoolExecutor(UPLOADERS) as pool:
            list(pool.map(lambda rel: self.upload(self.mirror, rel, expected.get(rel)), data))
        missing = [r for r in data if r not in self.journal.uploaded]
        if missing:
            raise ConfigError(f"{self.mirror / missing[0]}: changed while it was uploaded; run again with --resume")
        # The run record names where the dataset went, not the work directory.
        published = replace(meta, run=replace(meta.run, out=redact(self.url)))
        body = (json.dumps(published.to_json(), indent=2) + "\n").encode()
        self.remote.put(self._key(METADATA_FILE), body)  # the commit (of an --append, or a new dataset)
        if self._replacing():  # the commit of a replacement: the redirect to its generation
            self.remote.put(METADATA_FILE, json.dumps({"format": "lmshard", "redirect": self.generation}).encode())
        self._remove_replaced()
        self.remote.delete([LOCK_OBJECT])
        shutil.rmtree(self.root, ignore_errors=True)

    def _remove_replaced(self) -> None:
        if self.replaces:
            self._remove(self.replaces)

    def _remove(self, replaced: dict[str, Any]) -> None:
        """The objects of a replaced dataset: the files its metadata named, under its root (its
        metadata too, unless it was at the prefix itself, where the redirect is now)."""
        root = replaced.get("root") or ""
        files = [r for r in replaced.get("files", []) if isinstance(r, str) and (root or r != METADATA_FILE)]
        self.remote.delete([f"{root}/{r}" if root else r for r in files])

    def abandon(self) -> None:
        """After a run that failed before uploading anything: the prefix is free again, and a run
        that built nothing either leaves nothing to resume."""
        if self.journal is not None and not self.journal.uploaded:
            self.remote.delete([LOCK_OBJECT])
            if not (self.journal.started or self.config.resume or self._work_left(seeded=self.config.append)):
                shutil.rmtree(self.root, ignore_errors=True)

    def named(self, e: LmshardError) -> LmshardError:
        """A refusal of the options (ConfigError) that names the dataset by its work directory's
        copy names it by the URL the user gave; every other error keeps its local paths (a full
        disk is the work directory's)."""
        prefix = f"{self.mirror}: "
        if not isinstance(e, ConfigError) or not str(e).startswith(prefix):
            return e
        named = copy.copy(e)
        named.args = (redact(self.url) + ": " + str(e).removeprefix(prefix),)
        return named

    def _build_paths(self) -> list[Path]:
        """Where the local build keeps its work: the dataset, its staging, its scale-out work folder."""
        return [self.mirror, OutputPaths.of(str(self.mirror)).staging, work_dir(self.mirror)]

    def _work_left(self, seeded: bool = False) -> bool:
        """Whether the local build left work to resume: its staging, its scale-out work folder, or
        a finished build (`seeded`: the copy there is an --append's seed of the old dataset)."""
        built = not seeded and (self.mirror / METADATA_FILE).exists()
        return built or any(p.exists() for p in self._build_paths()[1:])


def prepare_remote(config: PrepareConfig, on_progress: Any,
                   run_local: Callable[[PrepareConfig, Any], DatasetMeta]) -> DatasetMeta:  # fmt: skip
    """Build the dataset in the work directory with `run_local`, then publish it to `config.out`."""
    publisher = Publisher(config.out, overwrite=config.overwrite, append=config.append, resume=config.resume)
    publisher.claim()
    if publisher.complete is not None:
        publisher.remote.delete([LOCK_OBJECT])
        if on_progress is not None:
            on_progress(Progress(note=f"resuming: {redact(publisher.url)} is already complete; nothing to do"))
        return publisher.complete
    if publisher.discarded and on_progress is not None:
        on_progress(Progress(note=publisher.discarded))
    appending = bool(publisher.previous and config.append)
    local = replace(config, out=str(publisher.mirror), overwrite=False, append=appending,
                    resume=config.resume and publisher.mirror.parent.exists())  # fmt: skip
    watcher = publisher.watch()
    try:
        try:
            meta = run_local(local, on_progress)
        finally:
            publisher.stop_watching(watcher)
    except LmshardError as e:
        publisher.abandon()
        named = publisher.named(e)
        if named is e:
            raise
        raise named from e
    except Interrupted as e:  # (one as the local build was put in place: complete there, not yet sent)
        if e.complete:
            raise Interrupted(f"the dataset is built in {publisher.root}, not yet sent", e.signum) from None
        raise
    if on_progress is not None:
        on_progress(Progress(note=f"publishing to {redact(publisher.url)}"))
    try:
        publisher.publish(meta)
    except RemoteError as e:  # the store failed: the build and the uploads so far are kept
        raise RemoteError(f"{e}; the dataset is built in {publisher.root} and what was sent is recorded: run the same "
                          "command with --resume to finish the upload") from None  # fmt: skip
    return meta
