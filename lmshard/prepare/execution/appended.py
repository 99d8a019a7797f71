"""What a planned --append reads of the dataset it extends (`Appended`, a part of `Run`): its
key files, signature files and line key files, each shared out to the first tasks (every N-th
file from a task's number), and its metadata. The plan records them (runplan.previous_of).

Memory model: the plan's head (its `previous` entry: one path per file of the dataset).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...format import DatasetMeta, load_metadata
from ..config import PrepareConfig
from .nearstage import Previous


class Appended:
    """The --append accessors of a run (mixed into `Run`, which holds `config` and `plan`)."""

    config: PrepareConfig
    plan: dict[str, Any]

    @property
    def dedup(self) -> bool:
        return self.config.dedup == "document"

    def previous_files(self, task: int) -> list[str]:
        """--append with dedup: task `task`'s share of the extended dataset's key files (every
        N-th, from the task's number), which its tokenize task partitions by bucket."""
        previous = self.plan.get("previous")
        if not previous or not self.dedup:
            return []
        files: list[str] = previous["key_files"][task :: self.plan["n_tasks"]]
        return files

    def previous_near(self, task: int) -> list[tuple[int, str]]:
        """--append --near-dedup: task `task`'s share of the extended dataset's signature files
        (their numbers and paths, every N-th from the task's number)."""
        previous = self.plan.get("previous")
        if not previous or not self.config.near_dedup:
            return []
        n = self.plan["n_tasks"]
        return [(f, rel) for f, (rel, _) in enumerate(previous["near_files"]) if f % n == task]

    def previous_lines(self, task: int) -> list[str]:
        """--append --dedup-lines: task `task`'s share of the extended dataset's line key files."""
        previous = self.plan.get("previous")
        if not previous or not self.config.dedup_lines:
            return []
        files: list[str] = previous.get("line_files", [])[task :: self.plan["n_tasks"]]
        return files

    @property
    def previous_line_tasks(self) -> int:
        """How many tasks hold a share of an extended dataset's line keys."""
        previous = self.plan.get("previous") or {}
        return min(self.plan["n_tasks"], len(previous.get("line_files", ())) if self.config.dedup_lines else 0)

    def has_previous(self, task: int) -> bool:
        """Whether task `task` holds a share of an extended dataset's keys or signatures (every
        N-th file from the task's number: the first tasks, as many as there are files)."""
        return task < self.previous_tasks

    @property
    def previous_tasks(self) -> int:
        """How many tasks hold a share of an extended dataset's keys or signatures."""
        previous = self.plan.get("previous") or {}
        files = max(len(previous.get("key_files", ())) if self.dedup else 0,
                    len(previous.get("near_files", ())) if self.config.near_dedup else 0)  # fmt: skip
        return min(self.plan["n_tasks"], files)

    @property
    def near_previous(self) -> Previous | None:
        """--append --near-dedup: the extended dataset's signature files, numbered before the
        run's units in the near-duplicate ids."""
        previous = self.plan.get("previous")
        if not previous or not self.config.near_dedup or not previous.get("near_files"):
            return None
        files = previous["near_files"]
        return Previous(Path(self.config.out), tuple(f for f, _ in files), tuple(int(n) for _, n in files))

    @property
    def near_base(self) -> int:
        """The near-duplicate ids' first unit number: after the extended dataset's signature files."""
        near = self.near_previous
        return len(near.files) if near is not None else 0

    def previous_meta(self) -> DatasetMeta | None:
        """--append: the metadata of the dataset extended (still in --out until the swap)."""
        return load_metadata(self.config.out) if self.plan.get("previous") else None
