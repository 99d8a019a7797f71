"""Near-duplicate clusters found by P tasks, each holding one part of the graph: the same
(removed, survivor) as `clusters.components`, with each task's memory bounded by its part and
its file operations by a fan-in, whatever P.

**Parts.** A document id belongs to part `owner(id)`: the id range between two of P - 1 sorted
`bounds` (`unit_bounds` cuts a planned run's units into P even ranges), so the parts' results
in part order are the sorted result. An edge is stored once, by the part of its later end.

**Supersteps.** Superstep 0 is the scatter: task s (0..P-1) sends its share of the input edges
(any share: a few buckets' `.near` files) to their parts. Then, in superstep k = 1, 2, ..., the
task of part j reads the messages sent to it in superstep k - 1 and takes the connected
components of its local graph (`clusters.least_labels`): its edges, each of its nodes joined to
its label and to its label of the superstep before, and each pair a message told it. Its nodes'
new labels are the least ids of their local clusters. It then sends:
- RESP: the answer to each request it received, its node's new label (none when that is the
  node itself: no answer means so);
- REQ: a request for the label of each other part's node it needs: its edges' earlier ends and
  its nodes' labels (pointer jumping: an answer is the label of a label, two supersteps later);
- CAND: to another part's node its local graph joins to a lesser id than the node's known label.
Labels only decrease, and stay ids of the same cluster. A superstep in which no part's label
changed (nor a node was new) is quiet; after two quiet supersteps every label is its cluster's
least id (every edge's ends have one label, and every label is its own), which is the result.
The number of supersteps grows with the log of the longest chain: a chain of 10^5 in random
order takes 13 over 64 parts, 9 over 7; one part takes three (one, then two quiet).

**Routing, bounded fan-in.** With radix r <= fan_in and `levels` digits (r^levels >= P), a
message reaches its part in `levels` hops: after hop h, digits 0..h (base r) of the position
holding it are its destination's and the others its sender's. The sender writes one file, in r
sections by its messages' destination digit 0; each routing task (hops 1..levels - 1, at
positions 0..r^levels - 1) reads its section of the r files that differ from its position in
the digit of the hop before, and writes one; a part task reads its section of r files the same
way. So per superstep a part task opens at most r message files (two reads each: the section
offsets, then its section), its edges and its labels, and writes three files (messages, labels,
count); a routing task opens at most r files and writes one. With fan_in 64: one hop up to 64
parts, two up to 4,096, three up to 262,144 (64,000 parts: radix 40, three hops).

**Files** (in one folder): `plan.json` and `bounds.u64`; `edges_J.u64` (part J's edges: the
later ends, then the earlier ends, sorted, uint64; written by superstep 1); `labels_K_J.u64`
(its nodes after superstep K, their labels, their labels of superstep K - 1: three uint64 rows);
`msgs_K_H_Q.bin` (superstep K's messages after H hops at position Q: r + 1 uint64 section
offsets counted in records, then 24-byte records of MESSAGE); `changed_K_J.json` (labels changed
or new, messages sent); `result_J.u64` (the part's removed ids, sorted, then their survivors, as
`dedup/near.removed`). Superstep K's files are needed until superstep K + 1 is complete.

**Stages.** `make_plan` once; a scatter stage (P tasks); then per superstep k >= 1 a stage of P
tasks (`superstep(work, k, j)`), each followed by levels - 1 routing stages of r^levels tasks
(`route`), until `quiet` has held for two supersteps (each task's count can ride in its stage's
summary instead); then `part_result` per part. `components_in_parts` runs all of it in one
process, task after task (tests, benchmarks).

Memory model, per task: a part task holds its edges (16 bytes each), its nodes' labels (24 bytes
each), its inbox and outbox (24 bytes per message; once labels settle, about two per edge of the
part per superstep: a request for each earlier end and label held elsewhere, and the answers; a
node asked about by many parts gets one request from each, so at most P per superstep), and the
components of its local graph (about 55 bytes per pair: its edges, its nodes and what it was
told); a routing task holds the messages passing through it; every task, the bounds (8 bytes
per part). Measured on 1 M edges shaped like near-duplicate clusters (docs/performance.md,
scripts/bench_near_clusters.py): the largest task peaked at about 330 bytes per edge of a part
over 8 parts and 420 over 64 (9 and 11 supersteps, 13 and 20 messages per edge in all).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..format import atomic_write_bytes, atomic_write_json
from .clusters import least_labels
from .sets import distinct

FAN_IN = 64  # files a task reads per hop, at most
MESSAGE = np.dtype([("dest", "<u4"), ("kind", "<u4"), ("a", "<u8"), ("b", "<u8")])
# kinds, and their (a, b): (later end, earlier end); (node, a lesser id); (node, asking part); (node, label)
EDGE, CAND, REQ, RESP = 0, 1, 2, 3
_U64 = np.dtype("<u8")


@dataclass(frozen=True)
class Plan:
    parts: int
    radix: int
    levels: int
    bounds: np.ndarray  # parts - 1 sorted ids: part j owns [bounds[j - 1], bounds[j])

    @property
    def positions(self) -> int:
        return int(self.radix**self.levels)

    def owner(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.bounds, ids, side="right").astype(np.uint32)


def make_plan(work: Path, parts: int, bounds: np.ndarray, fan_in: int = FAN_IN) -> Plan:
    """Write the plan of a run over `parts` parts (`bounds`: parts - 1 sorted ids)."""
    bounds = np.asarray(bounds, dtype=np.uint64)
    if parts < 1 or fan_in < 2 or len(bounds) != parts - 1 or bool((bounds[1:] < bounds[:-1]).any()):
        raise ValueError(f"{parts} parts need {parts - 1} sorted bounds (got {len(bounds)}) and a fan-in of 2 or more")
    levels = 1
    while fan_in**levels < parts:
        levels += 1
    radix = 1
    while radix**levels < parts:
        radix += 1
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(work / "bounds.u64", bounds.astype(_U64).tobytes())
    atomic_write_json(work / "plan.json", {"parts": parts, "radix": radix, "levels": levels, "fan_in": fan_in})
    return Plan(parts, radix, levels, bounds)


def load_plan(work: Path) -> Plan:
    stored = json.loads((work / "plan.json").read_text())
    bounds = np.fromfile(work / "bounds.u64", dtype=_U64)
    return Plan(stored["parts"], stored["radix"], stored["levels"], bounds)


def unit_bounds(n_units: int, parts: int) -> np.ndarray:
    """Bounds for ids unit << 32 | document: P ranges of whole units, as even as they divide."""
    return np.array([(n_units * j // parts) << 32 for j in range(1, parts)], dtype=np.uint64)


def id_bounds(ids: np.ndarray, parts: int) -> np.ndarray:
    """Bounds that cut the distinct `ids` into P ranges of about equal counts."""
    ids = distinct(np.asarray(ids, dtype=np.uint64))
    if not len(ids):
        return np.zeros(parts - 1, dtype=np.uint64)
    return ids[np.arange(1, parts) * len(ids) // parts]


def scatter(work: Path, position: int, child: np.ndarray, parent: np.ndarray) -> int:
    """Superstep 0 at `position` (0..P-1): send these edges to their parts, and each earlier end
    a candidate of itself, which makes it its part's node. Returns the messages sent."""
    plan = load_plan(work)
    child, parent = np.asarray(child, dtype=np.uint64), np.asarray(parent, dtype=np.uint64)
    later, earlier = np.maximum(child, parent), np.minimum(child, parent)
    live = later != earlier  # a self-loop joins nothing
    later, earlier = later[live], earlier[live]
    ends = distinct(earlier)
    out = np.concatenate([_messages(plan.owner(later), EDGE, later, earlier),
                          _messages(plan.owner(ends), CAND, ends, ends)])  # fmt: skip
    _send(work, plan, 0, 0, position, out)
    return len(out)


def route(work: Path, step: int, hop: int, position: int) -> None:
    """Hop `hop` (1..levels - 1) of superstep `step`'s messages, at `position` (0..r^levels - 1)."""
    plan = load_plan(work)
    _send(work, plan, step, hop, position, _gather(work, plan, step, hop - 1, position))


def superstep(work: Path, step: int, part: int) -> int:
    """Superstep `step` >= 1 of part `part` (see the module docstring). Returns how many of its
    labels changed or were new: the run is done after two supersteps where every part's is 0."""
    plan = load_plan(work)
    inbox = _gather(work, plan, step - 1, plan.levels - 1, part)
    if step == 1:
        edges = inbox[inbox["kind"] == EDGE]
        later, earlier = _distinct(edges["a"], edges["b"])
        atomic_write_bytes(work / f"edges_{part:06d}.u64", np.concatenate([later, earlier]).astype(_U64).tobytes())
        nodes = label = prior = np.zeros(0, dtype=np.uint64)
    else:
        later, earlier = np.fromfile(work / f"edges_{part:06d}.u64", dtype=_U64).reshape(2, -1)
        nodes, label, prior = np.fromfile(work / f"labels_{step - 1:04d}_{part:06d}.u64", dtype=_U64).reshape(3, -1)
    state, out, changed = advance(plan, part, (later, earlier), (nodes, label, prior), inbox)
    atomic_write_bytes(work / f"labels_{step:04d}_{part:06d}.u64", np.concatenate(state).astype(_U64).tobytes())
    _send(work, plan, step, 0, part, out)
    atomic_write_json(work / f"changed_{step:04d}_{part:06d}.json", {"changed": changed, "sent": len(out)})
    return changed


def advance(plan: Plan, part: int, edges: tuple[np.ndarray, np.ndarray],
            state: tuple[np.ndarray, np.ndarray, np.ndarray],
            inbox: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray, int]:  # fmt: skip
    """One superstep of one part in memory: ((nodes, labels, prior labels), messages, changed)."""
    later, earlier = edges
    nodes, label, prior = state
    told = _told(inbox)
    moved = prior != label  # (a prior label equal to the label adds nothing)
    local, least = least_labels(np.concatenate([later, nodes, nodes[moved], inbox["a"][told]]),
                                np.concatenate([earlier, label, prior[moved], inbox["b"][told]]))  # fmt: skip
    mine = plan.owner(local) == part
    new_nodes, new_label = local[mine], least[mine]
    new_prior = new_nodes.copy()  # a new node's label of the superstep before: itself
    at = np.searchsorted(new_nodes, nodes)
    new_prior[at] = label
    changed = len(new_nodes) - len(nodes) + int((new_label[at] != label).sum())
    out = np.concatenate([_answers(inbox, new_nodes, new_label),
                          _requests(plan, part, earlier, new_label),
                          _candidates(plan, inbox, local, least, ~mine)])  # fmt: skip
    return (new_nodes, new_label, new_prior), out, changed


def _answers(inbox: np.ndarray, nodes: np.ndarray, label: np.ndarray) -> np.ndarray:
    """RESP to each request received whose node's label is another node."""
    asked = inbox[inbox["kind"] == REQ]
    at = np.searchsorted(nodes, asked["a"])
    if len(asked) and (at.max() >= len(nodes) or bool((nodes[at] != asked["a"]).any())):
        raise ValueError("a request for a node its part does not hold: the superstep files are not of one run")
    answer = label[at] if len(at) else asked["a"]
    moved = answer != asked["a"]  # (no answer says a node is its own label)
    return _messages(asked["b"][moved].astype(np.uint32), RESP, asked["a"][moved], answer[moved])


def _requests(plan: Plan, part: int, earlier: np.ndarray, label: np.ndarray) -> np.ndarray:
    """REQ for each other part's node this part needs the label of: its edges' earlier ends and
    its nodes' labels."""
    wanted = distinct(np.concatenate([earlier, label]))
    whose = plan.owner(wanted)
    other = whose != part
    return _messages(whose[other], REQ, wanted[other], np.full(int(other.sum()), part, dtype=np.uint64))


def _candidates(plan: Plan, inbox: np.ndarray, local: np.ndarray, least: np.ndarray, others: np.ndarray) -> np.ndarray:
    """CAND to each other part's node whose local cluster's least id is less than its label as
    known here (its answer this superstep, else the node itself)."""
    known = local.copy()
    answers = inbox[_told(inbox) & (inbox["kind"] == RESP)]
    known[np.searchsorted(local, answers["a"])] = answers["b"]
    send = others & (least < known)
    return _messages(plan.owner(local[send]), CAND, local[send], least[send])


def _told(inbox: np.ndarray) -> np.ndarray:
    """The messages that join two ids in the local graph: candidates, and answers other than
    a node's own id (a candidate of itself makes its node known to its part)."""
    return (inbox["kind"] == CAND) | ((inbox["kind"] == RESP) & (inbox["a"] != inbox["b"]))


def quiet(work: Path, step: int, parts: int) -> bool:
    """True when no part's label changed in superstep `step` (one small file per part)."""
    counts = (json.loads((work / f"changed_{step:04d}_{j:06d}.json").read_text())["changed"] for j in range(parts))
    return not any(counts)


def part_result(work: Path, step: int, part: int) -> tuple[np.ndarray, np.ndarray]:
    """The part's (removed, survivor) from its labels after the last superstep `step`, also
    written as `result_J.u64`."""
    nodes, label, _ = np.fromfile(work / f"labels_{step:04d}_{part:06d}.u64", dtype=_U64).reshape(3, -1)
    removed = label != nodes
    atomic_write_bytes(work / f"result_{part:06d}.u64", nodes[removed].tobytes() + label[removed].tobytes())
    return nodes[removed], label[removed]


def remove_step(work: Path, step: int) -> None:
    """Delete superstep `step`'s files (once superstep step + 1 is complete)."""
    for pattern in (f"msgs_{step:04d}_*.bin", f"labels_{step:04d}_*.u64", f"changed_{step:04d}_*.json"):
        for path in work.glob(pattern):
            path.unlink()


def components_in_parts(child: np.ndarray, parent: np.ndarray, work: Path, parts: int,
                        fan_in: int = FAN_IN) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """`clusters.components` run as the tasks of P parts would, one after another in this
    process, through the files in `work`: the scatter (edges cut into P contiguous shares), then
    supersteps and their routing hops until two are quiet."""
    child, parent = np.asarray(child, dtype=np.uint64), np.asarray(parent, dtype=np.uint64)
    plan = make_plan(work, parts, id_bounds(np.concatenate([child, parent]), parts), fan_in)
    for s, (c, p) in enumerate(zip(np.array_split(child, parts), np.array_split(parent, parts), strict=True)):
        scatter(work, s, c, p)
    step, quiet_run = 0, 0
    while quiet_run < 2:
        for hop in range(1, plan.levels):
            for q in range(plan.positions):
                route(work, step, hop, q)
        step += 1
        for j in range(parts):
            superstep(work, step, j)
        remove_step(work, step - 1)
        quiet_run = quiet_run + 1 if quiet(work, step, parts) else 0
    results = [part_result(work, step, j) for j in range(parts)]
    return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])


def _messages(dest: np.ndarray, kind: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty(len(a), dtype=MESSAGE)
    out["dest"], out["kind"], out["a"], out["b"] = dest, kind, a, b
    return out


def _distinct(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs, sorted."""
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    keep = np.ones(len(a), dtype=bool)
    keep[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return a[keep], b[keep]


def _send(work: Path, plan: Plan, step: int, hop: int, position: int, messages: np.ndarray) -> None:
    """Write `messages` at `position` after `hop` hops, in sections by their destination's digit `hop`."""
    digit = (messages["dest"].astype(np.int64) // plan.radix**hop) % plan.radix
    order = np.argsort(digit, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(digit, minlength=plan.radix))]).astype(_U64)
    path = work / f"msgs_{step:04d}_{hop}_{position:06d}.bin"
    atomic_write_bytes(path, offsets.tobytes() + messages[order].tobytes())


def _gather(work: Path, plan: Plan, step: int, hop: int, position: int) -> np.ndarray:
    """The messages bound for `position` at hop + 1: its section of the files written after `hop`
    hops at the positions that differ from it in digit `hop` only."""
    scale = plan.radix**hop
    mine = (position // scale) % plan.radix
    writers = plan.parts if hop == 0 else plan.positions  # hop 0: written by the P part (or scatter) tasks only
    chunks = []
    for t in range(plan.radix):
        source = position + (t - mine) * scale
        if source < writers:
            path = work / f"msgs_{step:04d}_{hop}_{source:06d}.bin"
            offsets = np.fromfile(path, dtype=_U64, count=plan.radix + 1)
            start, end = int(offsets[mine]), int(offsets[mine + 1])
            at = (plan.radix + 1) * 8 + start * MESSAGE.itemsize
            chunks.append(np.fromfile(path, dtype=MESSAGE, count=end - start, offset=at))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=MESSAGE)
