"""`lmshard score --num-tasks N`: a score as N tasks of one stage and a finish, on any engine
(rewriteengines.py), writing the bytes a one-process score writes (score.py).

**Plan** (`plan`, once): the source and the scorers checked as a one-process run checks them,
`--out` claimed, and the plan written (rewrite.py: the units are every source shard, in order;
the head records the scorers as given and by absolute path, and the hashes of the plugins'
code, which every task holds its plugins to). Task t has units [t·U/N, (t+1)·U/N).

1. **score** (per task: its units): each source shard's documents decoded, held to their stored
   tokens and scored (in a pool of the task's own with `--workers`), its attribute file written
   with the new columns after its own into `build/`, its other files hard-linked there (copied
   where the filesystem cannot link), then its entry (`score/unit_U.json`) last; and the task's
   share of the key files linked.
2. **finish** (once): the vocabulary copy and tokenizer state linked, the metadata from the
   source's and the stage's summary (the entries), the swap (rewrite.py).

Cost per task, whatever the plan's size: the head, the source's head, its own rows of the
tables, its shards' tokens and attribute records; a link per other file of its shards.

Memory model, per task: one shard's attribute records (old and new), up to 2 × workers blocks
in flight (score.py's), each worker's tokenizer and scorers.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar

from ..errors import ConfigError
from ..format import METADATA_FILE, ShardInfo, SplitInfo, atomic_write_json, check_shard_files, load_metadata
from ..format.files import dataset_files
from ..prepare.execution.taskplan import work_dir
from ..prepare.stops import stop_point
from .retokenize import decoder
from .rewrite import Planned, claim, read_head
from .score import checked, link_file, score_shard, scoring, write_metadata


def plan(dataset: str | os.PathLike[str], attributes: list[str], out: str | os.PathLike[str], n_tasks: int, *,
         overwrite: bool = False) -> None:  # fmt: skip
    """Check the source and the scorers, claim `out` and write the plan (module docstring); the
    same plan again goes on from what is done."""
    from ..quality.filters import plugin_sources

    if n_tasks < 1:
        raise ConfigError(f"--num-tasks {n_tasks}: pass 1 or more")
    meta, specs, _ = checked(dataset, attributes, out)
    units: list[tuple[str, int, ShardInfo]] = []
    first: dict[str, int] = {}
    for shard in meta.shards:
        units.append((shard.split, first.get(shard.split, 0), shard))
        first[shard.split] = first.get(shard.split, 0) + shard.n_docs
    target = Path(os.path.realpath(out))
    head = {"kind": "score", "n_tasks": n_tasks, "overwrite": overwrite, "attributes": list(attributes),
            "specs": specs, "plugins": plugin_sources([name.partition("=")[0] for name in specs]),
            "options": {"attribute": ",".join(specs)}}  # fmt: skip
    claim(work_dir(target), head, meta, units, target, overwrite)


@dataclasses.dataclass
class ScoreTasks(Planned):
    """A planned score: what every task works from."""

    STAGES: ClassVar[tuple[str, ...]] = ("score", "finish")
    MARKERS: ClassVar[dict[str, str]] = {"score": "unit_{:06d}.json"}
    scorer: Any  # quality.scores.Scorer
    workers: int

    @classmethod
    def of(cls, out: str | os.PathLike[str], workers: int = 1) -> ScoreTasks:
        """The plan in `out`'s work folder, held to the source and the plugins' code it was made with."""
        from ..quality.filters import plugin_sources
        from ..quality.scores import Scorer

        work, head, meta = read_head(out, "score")
        if plugin_sources([name.partition("=")[0] for name in head["specs"]]) != head["plugins"]:
            raise ConfigError(f"--attribute {','.join(head['attributes'])}: a plugin's code changed since the score "
                              f"was planned; restore it, or remove {work} and plan again")  # fmt: skip
        decoder(head["dataset"], meta, "prepare the dataset again with these --attribute")
        return cls(work, head, meta, Scorer(head["specs"]), workers or len(os.sched_getaffinity(0)))

    def score(self, task: int) -> dict[str, Any]:
        mine = self.share(self.n_units, task)
        build, folder, rows = self.work / "build", self.work / "score", []
        for key in self.keys(task):  # (of the text: the same with any attributes)
            link_file(self.meta.root / key["path"], build / key["path"])
        todo = any(not (folder / f"unit_{u:06d}.json").exists() for u in mine)  # (else no pool is started)
        with scoring(self.meta, self.head["specs"], self.scorer, self.workers if todo else 1) as scored:
            for u, (split, first, shard) in zip(mine, self.units(mine), strict=True):
                marker = folder / f"unit_{u:06d}.json"
                if not marker.exists():
                    check_shard_files(self.meta.root, shard)
                    entry = score_shard(self.meta, self.scorer, build, split, first, shard, scored)
                    for rel in shard.files():  # every other file of the shard as it is
                        if not rel.endswith(".attr"):
                            link_file(self.meta.root / rel, build / rel)
                    atomic_write_json(marker, entry.to_json())
                    stop_point("unit", u)
                rows.append([split, json.loads(marker.read_text())])
        return {"rows": rows}

    def metadata(self, build: Path, rows: list[Any]) -> int:
        """The vocabulary copy and tokenizer state linked, and the metadata from the source's
        whole metadata and the stage's entries."""
        meta = load_metadata(self.head["dataset"])
        shards = [ShardInfo.parse(split, entry) for split, entry in rows]
        covered = {rel for s in meta.shards for rel in s.files()} | {k.path for k in (meta.dedup.files if meta.dedup
                                                                                       else ())}  # fmt: skip
        for rel in dataset_files(meta):  # what is not a shard's or a key file: the vocabulary, the tokenizer state
            if rel != METADATA_FILE and rel not in covered:
                link_file(meta.root / rel, build / rel)
        splits = {name: SplitInfo.of(tuple(s for s in shards if s.split == name)) for name in meta.splits}
        write_metadata(meta, (self.head["attributes"], self.head["specs"]), self.scorer, build, splits,
                       str(self.out()), self.workers)  # fmt: skip
        return len(shards)
