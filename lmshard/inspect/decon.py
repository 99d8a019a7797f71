"""`lmshard inspect DATASET --decontaminate FILE`: which documents of an existing dataset a
`prepare --decontaminate FILE` run would have removed, per benchmark and split, with examples;
the dataset is not changed. Each document is read back from its shard and decoded with the
dataset's tokenizer, then checked as prepare checks it (quality/decon.py).

Memory model: the benchmarks' index (see quality/decon.py) and one document at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..format import DatasetMeta
from ..quality.decon import Decontaminator
from .overlap import SNIPPET, documents


def report(meta: DatasetMeta, benchmarks: list[str], decode: Callable[[list[int]], str], n: int = 13,
           examples: int = 3) -> dict[str, Any]:  # fmt: skip
    """{dataset, n, documents, contaminated: {benchmark: {split: count}}, examples: [{document,
    benchmark, text, item}]}."""
    decon = Decontaminator(benchmarks, n)
    counts: dict[str, dict[str, int]] = {b.name: {} for b in decon.benchmarks}
    shown: list[dict[str, str]] = []
    scanned = 0
    for split in meta.splits:
        for where, text in documents(meta, (split,), decode):
            scanned += 1
            found = decon.match(text)
            if found is None:
                continue
            name = decon.benchmarks[found[0]].name
            counts[name][split] = counts[name].get(split, 0) + 1
            if len(shown) < examples:  # the document, and the item it shares words with
                shown.append({"document": where, "benchmark": name, "text": text[:SNIPPET], "item": found[1][:SNIPPET]})
    return {"dataset": str(meta.root), "n": n, "documents": scanned, "grams": decon.grams, "contaminated": counts,
            "examples": shown}
