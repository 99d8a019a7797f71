"""What a task reads of the stages before its own (`Reads`, a part of `Run`): a unit's exact
duplicates and its lines met before (its task's slice of every group's files, read once per
task), the near-duplicate clusters and the --max-docs cut (each made once, by whichever task
needs it first).

Memory model: one task's duplicates or repeated lines (8 bytes each); see nearstage.py and
maxdocs.py for the steps made once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...tokenizers import Tokenizer
from ..documents.worker import WorkerConfig
from .appended import Appended
from .buckets import task_duplicates, unit_part
from .linestage import masks as unit_masks
from .maxdocs import ensure_cut, unread_from
from .nearstage import ensure_clusters


class Reads(Appended):
    """Readers of the earlier stages' results (a part of `Run`, which holds what they use)."""

    work: Path
    sources: Any
    tokenizer: Tokenizer
    wcfg: WorkerConfig
    _dups: tuple[int, Any] | None
    _repeats: tuple[int, Any] | None

    if TYPE_CHECKING:  # Run's

        def task_of(self, u: int) -> int: ...

        def summary(self, stage: str, needed_by: str | None = None) -> dict[str, Any]: ...

        @property
        def near_hashes(self) -> int: ...

        @property
        def specials(self) -> int: ...

        @property
        def n_units(self) -> int: ...

        plan: dict[str, Any]

        def items(self, stage: str, task: int) -> Sequence[int]: ...

    def tasks_left(self, stage: str, missing: list[int]) -> str:
        """The first tasks (up to 5) whose items of `stage` are among `missing`, for a refusal to
        name: a scan of the plan's tasks, made only then (a key file's items are its tasks)."""
        left = set(missing)
        tasks = missing[:5] if stage in ("keys", "linekeys") else [
            t for t in range(self.plan["n_tasks"]) if left.intersection(self.items(stage, t))][:5]  # fmt: skip
        return ", ".join(map(str, tasks)) + (", ..." if len(tasks) == 5 else "")

    def clusters(self, helper: int | None = None) -> None:
        """--near-dedup: the clusters of the dedup stage's edges, found once (nearstage.py), or
        over parts by the select stage's tasks together, `helper` being this one (nearparts.py).
        A run whose tasks all run on this machine (the local executor, a Ray instance it starts)
        has one task find them: parts there would share its memory."""
        if self.config.near_dedup:
            c = self.config
            one_machine = c.executor == "local" or (c.executor == "ray" and not c.ray_address)
            tasks = 1 if one_machine else self.plan["n_tasks"]
            ensure_clusters(self.work, self.plan["groups"], self.near_hashes, self.tokenizer, self.sources,
                            self.specials, self.duplicates if self.dedup else None, self.near_previous,
                            (tasks, self.n_units, helper))  # fmt: skip

    def line_masks(self, u: int) -> Any:
        """--dedup-lines: unit u's items' keep-bits and its kept lines' keys (linestage.py), from
        its task's slice of every group's repeated lines, read once per task."""
        task = self.task_of(u)
        if self._repeats is None or self._repeats[0] != task:
            found = task_duplicates(self.work / "lines", self.plan["n_tasks"], self.plan["groups"], task)
            self._repeats = (task, found)
        return unit_masks(self.work, u, self._repeats[1])

    def cut(self) -> dict[str, Any]:
        """--max-docs: the cut after the N-th kept document (maxdocs.py), made once."""
        return ensure_cut(self.work, self.plan, self.sources, self.wcfg, self.config, self.summary("select")["streams"],
                          self.specials, self.line_masks if self.config.dedup_lines else None)  # fmt: skip

    @property
    def unread(self) -> int:
        """--max-docs on one machine: the first of the units never read, once the units before
        hold the N kept documents (maxdocs.unread_from): from it on no unit has files, and each
        keeps nothing. Else the number of units (one file read when --max-docs is set)."""
        if self.config.max_docs is None or self.config.dedup_lines:  # (--dedup-lines: unitfiles.skip_unit)
            return self.n_units
        found = unread_from(self.work)
        return self.n_units if found is None else found

    def duplicates(self, u: int) -> Any:
        """The numbers of unit u's documents that repeat an earlier one: from its task's slice of
        every bucket's duplicates, read once per task (buckets.py)."""
        task = self.task_of(u)
        if self._dups is None or self._dups[0] != task:
            found = task_duplicates(self.work / "dedup", self.plan["n_tasks"], self.plan["groups"], task)
            self._dups = (task, found)
        return unit_part(self._dups[1], u)
