"""What every stage of a planned run works from (`Run`: the plan, its inputs, the tokenizer,
and each stage's items, markers, summaries and the steps done once; runplan.py makes or
validates the plan). An item is done when its marker is there or its task's mark (barrier.py); a
stage is complete when its summary is; the task that completes a stage does what follows it
once (`Run.after`), and every task removes what its mark made redundant (`Run.tidy`).

Memory model: the plan's head and a few rows of its tables; the layout once the write stage
reads it; the select summary (6 integers per unit) for the layout and the totals; one select
task's duplicates (8 bytes each).
"""

from __future__ import annotations

import bisect
import functools
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...format import METADATA_FILE
from ...format.encoding import Encoding
from ...tokenizers import Tokenizer
from ..config import PrepareConfig
from ..documents.worker import WorkerConfig
from ..domains import field_of
from ..output.build import Totals
from ..output.claim import bos_written
from ..output.dictfile import run_encoding
from ..output.staging import OutputPaths, WriterLock, read_run, recover
from .barrier import count_join, forget, is_complete, marks, read_summary, task_finished, write_summary
from .buckets import groups_of, resolve
from .finish import finish
from .keyfiles import line_keys_path, previous_keys_path, task_keys_path, write_previous_keys, write_task_keys
from .layout import LAYOUT_FILE, STREAMS, ensure_layout, select_join, select_summary, select_unit
from .layoutfiles import Layout
from .linenumbers import absolute, record_number
from .linestage import hash_unit, unit_lines_path, write_previous_lines, write_task_lines
from .maxdocs import near_examples
from .nearstage import near_summary
from .owners import seal_piece, sealed_entries, write_join, write_part
from .planclaim import unclaimed
from .plantables import PlanSources, task_of_unit
from .runplan import finish_sources, plan_run, worker_config
from .stagereads import Reads
from .taskplan import PLAN_FILE, SWAPPED_FILE, remove_work, swapped, work_dir
from .unitfiles import tokenize_unit
from .valby import val_rows

STAGES = ("tokenize", "dedup", "select", "write", "finish")  # a run's stages, in order
LINE_STAGES = ("lines", "linedup")  # with --dedup-lines, before them
# Where each item's marker is: (folder in the work directory, name); "seal": a sealed piece.
_MARKERS = {"lines": ("lines", "unit_{:06d}.bin"), "linedup": ("lines", "group_{:06d}.done"),
            "tokenize": ("tokenize", "unit_{:06d}.done"), "dedup": ("dedup", "group_{:06d}.done"),
            "select": ("select", "unit_{:06d}.json"), "write": ("write", "part_{:06d}.done"),
            "seal": ("write", "piece_{:06d}.json")}  # fmt: skip
JOINS = {"lines": count_join, "linedup": count_join, "tokenize": count_join, "dedup": count_join,
         "select": select_join, "write": write_join}  # fmt: skip


def run_stages(config: PrepareConfig) -> tuple[str, ...]:
    """A run's stages, in order: the line stages with --dedup-lines only."""
    return (*LINE_STAGES, *STAGES) if config.dedup_lines else STAGES


@dataclass
class Run(Reads):
    """What every stage of a planned run works from: the plan, its inputs, the tokenizer."""

    config: PrepareConfig
    plan: dict[str, Any]
    sources: Any
    tokenizer: Tokenizer
    work: Path
    wcfg: WorkerConfig
    _layout: Layout | None = None
    _dups: tuple[int, Any] | None = None  # (task, its documents' duplicates): read once per select task
    _repeats: tuple[int, Any] | None = None  # (task, its lines met before): read once per tokenize task
    _paths: OutputPaths | None = None

    @classmethod
    def of(cls, config: PrepareConfig, n_tasks: int, unit_bytes: int | None = None, loaded: Any = None,
           adopt: bool = False, tokenizer: Tokenizer | None = None) -> Run:  # fmt: skip
        plan, sources, tokenizer = plan_run(config, n_tasks, unit_bytes, loaded, adopt, tokenizer)
        return cls(config, plan, sources, tokenizer, work_dir(config.out), worker_config(config, sources, tokenizer))

    @property
    def paths(self) -> OutputPaths:
        """The output's paths (a symlinked --out followed), found once per process."""
        if self._paths is None:
            self._paths = OutputPaths.of(self.config.out)
        return self._paths

    @property
    def stages(self) -> tuple[str, ...]:
        return run_stages(self.config)

    @functools.cached_property
    def encoding(self) -> Encoding:
        """The shards' encoding: the option's, or with --append the dataset's own; found once."""
        return run_encoding(self.config, self.tokenizer.n_vocab, self.previous_meta(), self.paths.staging)

    @property
    def bos(self) -> int | None:
        return bos_written(self.config, self.tokenizer)

    @property
    def specials(self) -> int:
        """Separator tokens each document gets: EOT, and BOS where it is written."""
        return 1 if self.bos is None else 2

    @property
    def n_units(self) -> int:
        return len(self.plan["units"])

    def layout(self) -> Layout:
        """The layout (made once the select stage is complete), read once per process."""
        if self._layout is None:
            if (self.work / LAYOUT_FILE).exists():
                self._layout = Layout(self.work, self.plan["tasks"], STREAMS)
            else:

                def rows() -> tuple[list[list[int]], dict[str, Any] | None]:  # (--max-docs: as the cut left them)
                    if self.config.val_by:  # valby.py
                        return val_rows(self.summary("select"), self.config.seed, self.config.val_by)
                    cut = self.config.max_docs is not None
                    return list(self.cut()["streams"] if cut else self.summary("select")["streams"]), None

                first = (self.plan.get("previous") or {}).get("first")
                self._layout = ensure_layout(self.work, self.plan["tasks"], rows, self.config.tokens_per_shard,
                                             self.specials, self.dedup, self.near_hashes, first,
                                             self.config.dedup_lines, self.plan["units"],
                                             len(getattr(self.previous_meta(), "sources", ())),
                                             self.config.attr_columns())  # fmt: skip
        return self._layout

    def items(self, stage: str, task: int) -> Sequence[int]:
        """Task `task`'s share of a stage: its units, its groups of buckets, the parts of shards and key
        files from its units (finish: task 0)."""
        if stage in ("lines", "tokenize", "select"):
            return range(*self.plan["tasks"][task])
        if stage == "linedup":
            return groups_of(self.plan["groups"], self.plan["n_tasks"], task) if self.config.dedup_lines else range(0)
        if stage == "dedup":
            return groups_of(self.plan["groups"], self.plan["n_tasks"], task) if self.bucketed else range(0)
        if stage == "write":  # parts of shards and key files: those of its units
            return self.layout()["tasks"][task]
        return range(1 if task == 0 else 0)

    @property
    def near_hashes(self) -> int:
        """Values per MinHash signature with --near-dedup, else 0."""
        return self.config.minhash_config().n_hashes if self.config.near_dedup else 0

    @property
    def bucketed(self) -> bool:
        """Whether the run has a dedup stage: exact or near deduplication."""
        return self.dedup or self.config.near_dedup

    def task_of(self, u: int) -> int:
        """The plan task that holds unit u."""
        return task_of_unit(self.plan["tasks"], u)

    def missing(self, stage: str, items: Sequence[int] | None = None) -> list[int]:
        """The items of `stage` (tokenize, dedup, select, write, seal, finish) not done yet, of
        `items` (default: all; none once the stage is complete; for the write stage, [-1] until
        the layout exists). An item is done when its marker is there, or the mark of the task that
        holds it (a task that did its share may remove its items' markers): a stat each."""
        if stage == "write" and not (self.work / LAYOUT_FILE).exists():
            return [-1]
        if items is None and stage in JOINS and is_complete(self.work, stage):
            return []
        if stage == "linekeys":  # the tasks that hashed lines and have not gathered their keys
            if is_complete(self.work, "lines"):
                return []
            tasks = range(self.plan["n_tasks"] if self.config.dedup_lines else 0) if items is None else items
            return [t for t in tasks if self._has_units(t) and not line_keys_path(self.work, t).exists()
                    or t < self.previous_line_tasks and not line_keys_path(self.work, t, True).exists()]  # fmt: skip
        if stage == "keys":  # the tasks that tokenized units and have not gathered their keys
            if is_complete(self.work, "tokenize"):  # (marked after its key file: removed once selected)
                return []
            tasks = range(self.plan["n_tasks"] if self.bucketed else 0) if items is None else items
            return [t for t in tasks if self._has_units(t) and not task_keys_path(self.work, t).exists()
                    or self.has_previous(t) and not previous_keys_path(self.work, t).exists()]  # fmt: skip
        if stage == "finish":  # its one item is done once the dataset is in place
            return [] if (Path(self.config.out) / METADATA_FILE).exists() else list(items or range(1))
        if items is None:
            n = {"lines": self.n_units if self.config.dedup_lines else 0, "tokenize": self.n_units,
                 "select": self.n_units, "linedup": self.plan["groups"] if self.config.dedup_lines else 0,
                 "dedup": self.plan["groups"] if self.bucketed else 0}.get(stage)  # fmt: skip
            items = range(len(self.layout()["parts" if stage == "write" else "pieces"]) if n is None else n)
        if stage in ("tokenize", "select") and (end := self.unread) < self.n_units:
            items = [i for i in items if i < end]  # (--max-docs: the units never read have none)
        folder, name = _MARKERS[stage]
        owner = self._owner(stage)
        finished: dict[int, bool] = {}

        def done(i: int) -> bool:
            if (self.work / folder / name.format(i)).exists():
                return True
            if owner is None:
                return False
            t = owner(i)
            if t not in finished:
                finished[t] = task_finished(self.work, stage, self.plan["n_tasks"], t)
            return finished[t]

        return [i for i in items if not done(i)]

    def _owner(self, stage: str) -> Callable[[int], int] | None:
        """Which task holds an item of `stage` (None: sealing, which no task owns)."""
        if stage in ("lines", "tokenize", "select"):
            return self.task_of
        if stage in ("linedup", "dedup"):
            n, tasks = self.plan["groups"], self.plan["n_tasks"]
            starts = [groups_of(n, tasks, t).start for t in range(tasks)]
            return lambda b: bisect.bisect_right(starts, b) - 1  # (an empty share starts where the next one does)
        if stage == "write":
            return self.layout().task_of_part
        return None

    def after(self, stage: str) -> None:
        """What the task that completes a stage does once: the near-duplicate clusters after the
        dedup stage, the layout of the shards after the select stage."""
        if stage == "dedup":
            self.clusters()
        if stage == "select":
            self.layout()

    def tidy(self, stage: str, task: int) -> None:
        """Remove what task `task`'s mark of `stage` makes redundant, so the work folder shrinks
        in every task instead of one process removing it file by file at the end: after the
        select stage, the task's key file and its units' tokenize and select markers (the stage
        summaries hold what they said); after the write stage, its parts' markers and its units'
        data; and its own marks of the complete stages before this one."""
        w = self.work
        for prior in self.stages[: self.stages.index(stage)]:
            forget(w, prior, self.plan["n_tasks"], task)
        if stage == "tokenize" and self.config.dedup_lines:  # its lines' key files: read by the linedup stage only
            line_keys_path(w, task).unlink(missing_ok=True)
            line_keys_path(w, task, previous=True).unlink(missing_ok=True)
            for u in self.items("tokenize", task) if self.config.max_docs is None else ():  # (the cut reads them)
                unit_lines_path(w, u).unlink(missing_ok=True)
        if stage == "select":
            task_keys_path(w, task).unlink(missing_ok=True)
            previous_keys_path(w, task).unlink(missing_ok=True)
            for u in self.items("select", task):
                (w / "tokenize" / f"unit_{u:06d}.done").unlink(missing_ok=True)
                if self.config.max_docs is None:  # (the cut joins the totals of the units before it)
                    (w / "select" / f"unit_{u:06d}.json").unlink(missing_ok=True)
        if stage == "write":
            for p in self.items("write", task):
                (w / "write" / f"part_{p:06d}.done").unlink(missing_ok=True)
            for u in range(*self.plan["tasks"][task]):  # (a unit that kept nothing has no part to release it)
                (w / "tokenize" / f"unit_{u:06d}.bin").unlink(missing_ok=True)
                (w / "select" / f"unit_{u:06d}.split").unlink(missing_ok=True)

    def _has_units(self, task: int) -> bool:
        first, end = self.plan["tasks"][task]
        return bool(end > first)

    def task_summary(self, stage: str, task: int) -> dict[str, Any]:
        """What task `task` reports of its share of `stage` (barrier.py): the select stage's
        stream totals and accounting of its units; the write stage's the entries of the pieces
        its parts belong to that are sealed; elsewhere how many items it held."""
        if stage == "select":
            return select_summary(self.work, range(*self.plan["tasks"][task]), self.unread)
        if stage == "write":
            items = self.items(stage, task)
            return {"items": len(items), "pieces": sealed_entries(self.work, self.layout(), items)}
        return {"items": len(self.items(stage, task))}

    def summary(self, stage: str, needed_by: str | None = None) -> dict[str, Any]:
        """The stage's summary: read from its one file (barrier.py), or, when every item is
        done but no task folded the markers (a run the local pool finished, a task killed after
        its items), made from the items' markers and written. Refuses an incomplete stage,
        naming it (`needed_by`: the stage that waits for it)."""
        if is_complete(self.work, stage):
            return read_summary(self.work, stage)
        missing = self.missing(stage)
        gather = "linekeys" if stage == "lines" else "keys"
        if not missing and stage in ("lines", "tokenize") and self.missing(gather):
            missing, stage = self.missing(gather), gather
        if missing:
            what = {"lines": "units", "linekeys": "tasks' line key files", "linedup": "groups of buckets",
                    "tokenize": "units", "keys": "tasks' key files", "dedup": "groups of buckets",
                    "select": "units", "write": "parts of shards"}[stage]  # fmt: skip
            named, out = self.tasks_left(stage, missing), shlex.quote(str(self.config.out))
            stage = {"keys": "tokenize", "linekeys": "lines"}.get(stage, stage)
            raise InputError(f"the {needed_by or 'next'} stage needs the {stage} stage complete; {len(missing)} "
                             f"{what} are not done (tasks {named}); run `lmshard run-task --stage {stage} --task I "
                             f"{out}` for each (`lmshard status {out}` lists them)")  # fmt: skip
        made = self._select_made() if stage == "select" else {"items": -1}
        write_summary(self.work, stage, made)
        return made

    def _select_made(self) -> dict[str, Any]:
        """The select summary made from its tasks: a task's mark (or its folded group's) where it
        marked its share (it may have removed its units' markers since), else its units'
        markers."""
        unread = self.unread
        parts = [mark if mark is not None else select_summary(self.work, range(*self.plan["tasks"][tasks[0]]), unread)
                 for tasks, mark in marks(self.work, "select", self.plan["n_tasks"])]  # fmt: skip
        return select_join(parts)

    def totals(self) -> Totals:
        """The run's totals for the metadata, added up in plan order by the select stage."""
        summary = self.summary("select")
        if self.config.max_docs is not None and self.cut()["totals"] is not None:
            summary = self.cut()  # the units' totals up to the N-th kept document
        totals = Totals.parse(summary["totals"])
        newlines = [row[5] for row in summary["streams"]]
        totals.examples = absolute(totals.examples, self.plan, self.sources, newlines)
        if self.config.near_dedup:
            near = near_summary(self.work)
            examples = near["examples"]
            if self.config.max_docs is not None:  # those a one-process run met before its cut
                examples = near_examples(examples, near["ids"], self.cut(), self.near_base)
            for example in examples:  # each document's record, numbered in its file
                for side in example.values():
                    if isinstance(side, dict) and isinstance(side.get("record"), list):
                        u, number = side["record"]
                        side["record"] = record_number(self.plan, u, number, newlines)
            totals.near_examples = examples
        return totals

    def do(self, stage: str, i: int, stop: Any = None, spread: Any = None) -> bool:
        """Item i of `stage` (a unit, a group of buckets, a part of a piece; "seal": a piece), skipped when
        its marker exists (`stop`, `spread`: a unit's, unitfiles.tokenize_unit)."""
        c = self.config
        if stage == "lines":
            return hash_unit(c, self.plan, self.sources, self.wcfg, self.work, i, spread)
        if stage == "linekeys":  # task i's lines' keys, partitioned by bucket, once its units are hashed
            first, end = self.plan["tasks"][i]
            wrote = end > first and write_task_lines(self.work, range(first, end), i, self.plan["buckets"])
            if i < self.previous_line_tasks:  # --append: its share of the dataset's line keys
                wrote |= write_previous_lines(self.work, Path(c.out), self.previous_lines(i), i, self.plan["buckets"])
            return wrote
        if stage == "linedup":
            return resolve(self.work, self.plan["tasks"], self.plan["buckets"], self.plan["groups"], i,
                           previous=range(self.previous_line_tasks), lines=True) >= 0  # fmt: skip
        if stage == "tokenize":
            return tokenize_unit(c, self.plan, self.sources, self.tokenizer, self.wcfg, i,
                                 self.line_masks if c.dedup_lines else None, stop, spread)  # fmt: skip
        if stage == "keys":  # task i's keys, partitioned by bucket, once its units are tokenized
            first, end = self.plan["tasks"][i]
            units = range(first, min(end, self.unread))  # (--max-docs: the units never read have no keys)
            wrote = self.bucketed and end > first and write_task_keys(
                self.work, units, i, self.plan["buckets"], self.wcfg.minhash, self.near_base)  # fmt: skip
            if self.has_previous(i):  # --append: its share of the dataset's keys (and signatures), partitioned alike
                wrote |= write_previous_keys(self.work, Path(c.out), self.previous_files(i), i, self.plan["buckets"],
                                             self.previous_near(i), self.wcfg.minhash)  # fmt: skip
            return wrote
        if stage == "dedup":
            previous = range(self.previous_tasks)
            near = self.near_previous
            tokenized, n_hashes = self.work / "tokenize", self.near_hashes
            lookup = None if near is None else (lambda ids: near.signatures(tokenized, ids, n_hashes))
            return resolve(self.work, self.plan["tasks"], self.plan["buckets"], self.plan["groups"], i, self.dedup,
                           self.wcfg.minhash, previous, lookup) >= 0  # fmt: skip
        if stage == "select":
            self.clusters(self.task_of(i))
            return select_unit(self.work, i, self.duplicates if self.dedup else None, c.seed, c.val_fraction,
                               self.specials, c.near_dedup, self.near_base, c.val_tokens,
                               field_of(c.val_by))  # fmt: skip
        if stage == "write":
            return write_part(self.work, self.paths.staging, self.layout(), i, self.specials)
        if stage == "seal":
            return seal_piece(self.work, self.paths.staging, self.layout(), i, self.encoding)
        paths = self.paths
        with WriterLock(paths):
            recover(paths)
            if swapped(self.work, paths.staging):
                remove_work(self.work, (PLAN_FILE, SWAPPED_FILE))  # stopped after its swap: only the work was left
                return True
            finish(c, paths, self.work, self.layout(), self.totals(), self.every_source(), self.tokenizer,
                   self.previous_meta())  # fmt: skip
        return True

    def every_source(self) -> Any:
        """Every input as `prepare` finds them (the metadata lists them all, with the files it
        skipped), checked against the plan: what the finish, once, needs; a task reads the plan's
        rows of its own inputs only."""
        if not isinstance(self.sources, PlanSources):
            return self.sources
        loaded = (finish_sources(self.config, list(self.sources.table)), self.tokenizer)
        plan_run(self.config, self.plan["n_tasks"], self.plan["unit_bytes"], loaded)
        return loaded[0]

    def ready(self, stage: str) -> None:
        """Refuse a stage whose inputs are incomplete, naming the stage to run first."""
        for prior in self.stages[: self.stages.index(stage)]:  # the earliest incomplete stage is the one to run
            if not is_complete(self.work, prior):  # one stat each, once its tasks have folded their marks
                self.summary(prior, stage)
        done = stage == "finish" and swapped(self.work, self.paths.staging)
        if stage in ("write", "finish") and read_run(self.paths.staging) is None and not done:
            raise InputError(unclaimed(self.config.out, self.paths, self.work))
