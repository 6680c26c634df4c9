"""Can it go here? The placement checks, answering with every reason as data.

Each check returns a list of ``Rejection``s, empty when the node may take
the request. A rejection names the node, a stable snake_case ``reason``, and
for capacity shortfalls the ``dimension`` with the ``requested`` and
``available`` amounts. Every failing check is reported, not just the first:
a node can be both exhausted and too small.

These functions are the definition of the rules. ``planner.core`` applies
the same rules through faster bookkeeping (its test suite checks that it
chooses exactly what these checks choose), and ``planner.explain`` uses them
to say why each candidate was passed over. Capacities are per dimension
(``{"disk": bytes, "memory": bytes}``); a node without a memory budget has
``None`` available memory, which means "no limit" (never a rejection).

"How good is it here?" is separate: GitLab's find_best_node takes the
*first* node that passes (first fit in candidate order), and the empty
replica takes the passing node with the most unclaimed storage
(``best_for_empty_replica``). The ``balanced`` strategy scores the passing
nodes with ``share_left`` (the least allocated: the smallest share of its
capacity a node has left over the dimensions in play) and takes the best
(``least_allocated``); eviction's "largest that fits elsewhere" and a move's
choice of target ask the same ``share_left`` of their own measures.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.scenario import DISK, MEMORY

#: The node already holds an index of this namespace (in the database, or
#: planned in this run): GitLab's per-namespace exhausted set, since
#: ``zoekt_indices`` is unique on (enabled namespace, node).
EXHAUSTED = "exhausted"
#: The node has less available than requested in one dimension.
INSUFFICIENT = {DISK: "insufficient_unclaimed_storage", MEMORY: "insufficient_unclaimed_memory"}
#: Empty replicas avoid nodes whose unclaimed storage is negative.
NEGATIVE_UNCLAIMED = "negative_unclaimed_storage"
#: With zones: the node's zone holds another replica of the namespace, and some node
#: outside those zones could take the replica (docs/planner.md, "Zones").
ZONE_TAKEN = "zone_holds_another_replica"


@dataclass(frozen=True, slots=True)
class Rejection:
    node_id: int
    reason: str
    dimension: str | None = None
    requested: int | None = None
    available: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "reason": self.reason,
            "dimension": self.dimension,
            "requested": self.requested,
            "available": self.available,
        }

    def describe(self) -> str:
        if self.reason == EXHAUSTED:
            return "exhausted (already holds an index of this namespace)"
        if self.reason == ZONE_TAKEN:
            return "its zone holds another replica of this namespace"
        if self.reason == NEGATIVE_UNCLAIMED:
            return f"negative unclaimed storage ({self.available:,} bytes)"
        if self.dimension is not None:
            what = self.reason.replace("_", " ")
            return f"{what} (requested {self.requested:,}, available {self.available:,} bytes)"
        return self.reason.replace("_", " ")


def fit_rejections(
    node_id: int, requested: Mapping[str, int], available: Mapping[str, int | None]
) -> list[Rejection]:
    """One rejection per dimension where the node has less than requested.

    ``None`` available means the node has no limit in that dimension.
    """
    out = []
    for dim, amount in requested.items():
        have = available[dim]
        if have is not None and have < amount:
            out.append(Rejection(node_id, INSUFFICIENT[dim], dim, amount, have))
    return out


def candidate_rejections(
    node_id: int,
    requested: Mapping[str, int],
    available: Mapping[str, int | None],
    *,
    exhausted: bool,
) -> list[Rejection]:
    """GitLab's find_best_node test: not exhausted, and room in every dimension.

    With the memory dimension, ``requested`` also has ``memory``.
    """
    reasons = [Rejection(node_id, EXHAUSTED)] if exhausted else []
    reasons.extend(fit_rejections(node_id, requested, available))
    return reasons


def empty_replica_rejections(
    node_id: int, available: Mapping[str, int], *, exhausted: bool
) -> list[Rejection]:
    """An empty replica's test: not exhausted, unclaimed storage not negative."""
    reasons = [Rejection(node_id, EXHAUSTED)] if exhausted else []
    if available[DISK] < 0:
        reasons.append(Rejection(node_id, NEGATIVE_UNCLAIMED, DISK, 0, available[DISK]))
    return reasons


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node as the checks see it: its id and what it has left per dimension."""

    node_id: int
    available: Mapping[str, int | None]


def first_fit(
    candidates: Sequence[Candidate],
    requested: Mapping[str, int],
    exhausted: Collection[int],
) -> tuple[int | None, list[Rejection]]:
    """The first candidate (position) that passes, and why each earlier one did not.

    ``exhausted`` holds node ids. Without a passing
    candidate the position is ``None`` and the rejections cover every
    candidate.
    """
    passed_over: list[Rejection] = []
    for position, _candidate, reasons in _judged(candidates, requested, exhausted):
        if not reasons:
            return position, passed_over
        passed_over.extend(reasons)
    return None, passed_over


def _judged(
    candidates: Sequence[Candidate], requested: Mapping[str, int], exhausted: Collection[int]
) -> Iterator[tuple[int, Candidate, list[Rejection]]]:
    """Each candidate with its position and why it cannot take the request (empty: it can)."""
    for position, candidate in enumerate(candidates):
        reasons = candidate_rejections(
            candidate.node_id,
            requested,
            candidate.available,
            exhausted=candidate.node_id in exhausted,
        )
        yield position, candidate, reasons


def best_for_empty_replica(
    candidates: Sequence[Candidate], exhausted: Collection[int]
) -> tuple[int | None, list[Rejection]]:
    """The passing candidate with the most unclaimed storage (the first such on ties)."""
    best: int | None = None
    rejected: list[Rejection] = []
    for position, candidate in enumerate(candidates):
        reasons = empty_replica_rejections(
            candidate.node_id, candidate.available, exhausted=candidate.node_id in exhausted
        )
        if reasons:
            rejected.extend(reasons)
        elif best is None or candidate.available[DISK] > candidates[best].available[DISK]:
            best = position
    return best, rejected


def storage_capacity(total_bytes: int | None, unclaimed: int) -> int:
    """What a node's disk room is scored against: its disk size, or (not reported, or
    less than it has unclaimed) its unclaimed storage."""
    return unclaimed if total_bytes is None or total_bytes < unclaimed else total_bytes


def share_left(left: int | float, capacity: int | float) -> float:
    """The share of ``capacity`` that ``left`` is, in one dimension: the balanced
    score's part. A node without capacity scores below every node with some
    (-1, or -2 when it is short even of nothing)."""
    if capacity <= 0:
        return -1.0 if left >= 0 else -2.0
    return left / capacity


def node_score(available: Mapping[str, int | None], capacity: Mapping[str, int | None]) -> float:
    """The balanced score of a node: the smallest ``share_left`` over the
    dimensions where it has a limit (the dominant resource decides). Higher is
    better."""
    disk = share_left(available[DISK], capacity[DISK])  # type: ignore[arg-type]
    memory = capacity.get(MEMORY)
    if memory is None:
        return disk
    mem = share_left(available[MEMORY], memory)  # type: ignore[arg-type]
    return disk if disk <= mem else mem


def least_allocated(
    candidates: Sequence[Candidate],
    requested: Mapping[str, int],
    exhausted: Collection[int],
    capacities: Sequence[Mapping[str, int | None]],
) -> tuple[int | None, list[Rejection]]:
    """The passing candidate (position) with the best ``node_score``, the earliest
    on ties, and why every candidate that did not pass was rejected."""
    best: int | None = None
    best_score = 0.0
    rejected: list[Rejection] = []
    for position, candidate, reasons in _judged(candidates, requested, exhausted):
        if reasons:
            rejected.extend(reasons)
            continue
        score = node_score(candidate.available, capacities[position])
        if best is None or score > best_score:
            best, best_score = position, score
    return best, rejected
