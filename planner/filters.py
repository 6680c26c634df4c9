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
(``{"disk": bytes}``) so another dimension slots in as another key.

"How good is it here?" is separate: GitLab's find_best_node takes the
*first* node that passes (first fit in candidate order), and the empty
replica takes the passing node with the most unclaimed storage
(``best_for_empty_replica``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.scenario import DISK

#: The node already holds an index of this namespace planned in this run, in
#: GitLab's (per namespace) exhausted set.
EXHAUSTED = "exhausted"
#: The node has less available than requested in one dimension.
INSUFFICIENT = {DISK: "insufficient_unclaimed_storage"}
#: Empty replicas avoid nodes whose unclaimed storage is negative.
NEGATIVE_UNCLAIMED = "negative_unclaimed_storage"


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
            return "exhausted (already used by this namespace's plan)"
        if self.reason == NEGATIVE_UNCLAIMED:
            return f"negative unclaimed storage ({self.available:,} bytes)"
        if self.dimension is not None:
            what = self.reason.replace("_", " ")
            return f"{what} (requested {self.requested:,}, available {self.available:,} bytes)"
        return self.reason.replace("_", " ")


def fit_rejections(
    node_id: int, requested: Mapping[str, int], available: Mapping[str, int]
) -> list[Rejection]:
    """One rejection per dimension where the node has less than requested."""
    return [
        Rejection(node_id, INSUFFICIENT[dim], dim, amount, available[dim])
        for dim, amount in requested.items()
        if available[dim] < amount
    ]


def candidate_rejections(
    node_id: int,
    requested: Mapping[str, int],
    available: Mapping[str, int],
    *,
    exhausted: bool,
) -> list[Rejection]:
    """GitLab's find_best_node test: not exhausted, and room in every dimension."""
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
    available: Mapping[str, int]


def first_fit(
    candidates: Sequence[Candidate],
    requested: Mapping[str, int],
    exhausted: Collection[int],
) -> tuple[int | None, list[Rejection]]:
    """The first candidate (position) that passes, and why each earlier one did not.

    ``exhausted`` holds node ids. Without a passing candidate the position is
    ``None`` and the rejections cover every candidate.
    """
    passed_over: list[Rejection] = []
    for position, candidate in enumerate(candidates):
        reasons = candidate_rejections(
            candidate.node_id,
            requested,
            candidate.available,
            exhausted=candidate.node_id in exhausted,
        )
        if not reasons:
            return position, passed_over
        passed_over.extend(reasons)
    return None, passed_over


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
