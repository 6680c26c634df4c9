"""The planner's output: a *plan*, as plain dataclasses with an exact JSON form.

``Plan.to_dict()`` / ``Plan.to_json()`` produce exactly the keys of the
``plan-scenario`` contract, nothing more: the decision records the core keeps
for ``planner.explain`` ride along on the ``Plan`` object but are never
serialised. ``to_json`` sorts keys and is deterministic: the same plan gives
the same bytes.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from planner.filters import node_score
from planner.scenario import MEMORY, gc_paused

_INF = float("inf")

CREATE = "create"
DESTROY = "destroy"
UNCHANGED = "unchanged"

#: Error types (stable snake_case; never renamed, only added).
INDEX_LIMIT_EXCEEDED = "index_limit_exceeded"
NODE_UNAVAILABLE = "node_unavailable"

#: Warning types of the memory dimension (docs/planner.md, "Memory"). Memory
#: never makes an error: when it cannot be satisfied the project gets the
#: disk-only decision and the namespace plan one of these warnings.
#:
#: A memory-driven split ran out of nodes that could take another index of
#: the replica (the N-nodes/N-ways ceiling), so an index holds more than its
#: ``max_memory_bytes``.
MEMORY_NODE_EXHAUSTED = "memory_node_exhausted"
#: A memory-driven split was stopped by ``max_indices_per_replica``.
MEMORY_INDEX_LIMIT_REACHED = "memory_index_limit_reached"
#: A node had the unclaimed storage but not the unclaimed memory, and no
#: usable node had both: the project went where the disk-only rule puts it.
MEMORY_BUDGET_INSUFFICIENT = "memory_budget_insufficient"
#: The memory-aware placement of the namespace would have failed where the
#: disk-only placement succeeds, so the disk-only placement was kept.
MEMORY_PLACEMENT_ABANDONED = "memory_placement_abandoned"

#: Warning of the disk ceiling per index (``options.max_index_storage_fraction``):
#: the namespace's placement under the ceiling would have failed (more indices
#: than the replica may have, or than there are nodes for it), so it was
#: planned by GitLab's rule, each index taking up to its node's unclaimed storage.
DISK_CEILING_ABANDONED = "disk_ceiling_abandoned"

#: Warnings of the zone rule (docs/planner.md, "Zones"): with zones set, the
#: replicas of a namespace go to distinct zones where the zones allow it.
#: Every node a replica could use is in a zone another replica of the
#: namespace occupies (fewer zones than replicas): it is placed there anyway.
ZONE_SHARED = "zone_shared"
#: The placement in distinct zones would have failed (the other zones lack the
#: room): the namespace was planned without the zone rule.
ZONE_SPREAD_ABANDONED = "zone_spread_abandoned"


@dataclass(slots=True)
class PlannedIndex:
    """One index of a replica: a contiguous project-namespace id range on one node."""

    node_id: int
    namespace_id: int
    project_namespace_id_from: int | None
    project_namespace_id_to: int | None
    required_storage_bytes: int
    #: The node's unclaimed bytes at the moment the planner opened this index.
    max_storage_bytes: int
    #: Memory dimension only (``None`` when it is off, and then the keys are
    #: not serialised): the sum of the projects' estimated memory, and the
    #: node's ceiling (budget // concurrency_factor; ``None`` on a node
    #: without a budget).
    estimated_memory_bytes: int | None = None
    max_memory_bytes: int | None = None
    #: The node's name (serialised as ``node_name`` when the plan has names).
    node_name: str | None = None

    def to_dict(self, *, with_namespace: bool = False, named: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node_id": self.node_id,
            "projects": {
                "project_namespace_id_from": self.project_namespace_id_from,
                "project_namespace_id_to": self.project_namespace_id_to,
            },
            "required_storage_bytes": self.required_storage_bytes,
            "max_storage_bytes": self.max_storage_bytes,
        }
        if self.estimated_memory_bytes is not None:
            out["estimated_memory_bytes"] = self.estimated_memory_bytes
            out["max_memory_bytes"] = self.max_memory_bytes
        if named:
            out["node_name"] = self.node_name
        if with_namespace:
            out["namespace_id"] = self.namespace_id
        return out


@dataclass(slots=True)
class ReplicaPlan:
    indices: list[PlannedIndex] = field(default_factory=list)

    def to_dict(self, *, named: bool = False) -> dict[str, Any]:
        return {"indices": [index.to_dict(named=named) for index in self.indices]}


@dataclass(frozen=True, slots=True)
class PlanIssue:
    """An error or a warning about one namespace's plan.

    ``replica_idx`` counts the replicas planned in this run (0 = the first
    missing one); it is ``None`` when the issue is not about one replica.
    """

    namespace_id: int
    replica_idx: int | None
    type: str
    details: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace_id": self.namespace_id,
            "replica_idx": self.replica_idx,
            "type": self.type,
            "details": self.details,
        }


@dataclass(slots=True)
class NamespacePlan:
    namespace_id: int
    enabled_namespace_id: int
    action: str
    replicas: list[ReplicaPlan] = field(default_factory=list)
    #: Only for ``destroy``: the replica ids to remove, in removal order.
    replicas_to_destroy: list[int] | None = None
    errors: list[PlanIssue] = field(default_factory=list)
    warnings: list[PlanIssue] = field(default_factory=list)

    @property
    def namespace_required_storage_bytes(self) -> int:
        return sum(
            index.required_storage_bytes for replica in self.replicas for index in replica.indices
        )

    @property
    def namespace_estimated_memory_bytes(self) -> int:
        """The estimated memory of every planned index (0 with memory off). Not serialised."""
        return sum(
            index.estimated_memory_bytes or 0
            for replica in self.replicas
            for index in replica.indices
        )

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def to_dict(self, *, named: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "namespace_id": self.namespace_id,
            "enabled_namespace_id": self.enabled_namespace_id,
            "action": self.action,
            "namespace_required_storage_bytes": self.namespace_required_storage_bytes,
            "replicas": [replica.to_dict(named=named) for replica in self.replicas],
            "errors": [error.to_dict() for error in self.errors],
            "warnings": [warning.to_dict() for warning in self.warnings],
        }
        if self.replicas_to_destroy is not None:
            out["replicas_to_destroy"] = list(self.replicas_to_destroy)
        return out


@dataclass(frozen=True, slots=True)
class NodeMemory:
    """A node's memory dimension in a plan. ``None`` everywhere: the node has no budget."""

    memory_budget_bytes: int | None
    unclaimed_memory_bytes_before: int | None
    unclaimed_memory_bytes_after: int | None


@dataclass(slots=True)
class NodeChange:
    """What the run did to one node (display only, as in GitLab)."""

    id: int
    unclaimed_storage_bytes_before: int
    unclaimed_storage_bytes_after: int
    indices: list[PlannedIndex]
    #: Only with the memory dimension on.
    memory: NodeMemory | None = None
    #: The node's name (serialised as ``name`` when the plan has names).
    name: str | None = None

    @property
    def claimed_storage_bytes(self) -> int:
        return sum(index.required_storage_bytes for index in self.indices)

    @property
    def namespace_ids(self) -> list[int]:
        return sorted({index.namespace_id for index in self.indices})

    def to_dict(self, *, named: bool = False) -> dict[str, Any]:
        ordered = sorted(self.indices, key=lambda index: index.namespace_id)
        out: dict[str, Any] = {
            "id": self.id,
            "unclaimed_storage_bytes_before": self.unclaimed_storage_bytes_before,
            "unclaimed_storage_bytes_after": self.unclaimed_storage_bytes_after,
            "claimed_storage_bytes": self.claimed_storage_bytes,
            "namespace_ids": self.namespace_ids,
            "indices": [index.to_dict(with_namespace=True, named=named) for index in ordered],
        }
        if named:
            out["name"] = self.name
        if self.memory is not None:
            out["memory_budget_bytes"] = self.memory.memory_budget_bytes
            out["unclaimed_memory_bytes_before"] = self.memory.unclaimed_memory_bytes_before
            out["unclaimed_memory_bytes_after"] = self.memory.unclaimed_memory_bytes_after
        return out


#: The kinds of decision record (``Decision.kind``).
NEW_INDEX = "new_index"
NO_NODE = "no_node"
EMPTY_REPLICA = "empty_replica"
MEMORY_OVERFLOW = "memory_overflow"


class Decision(NamedTuple):
    """One placement decision, written down as the core makes it (for explain).

    ``kind``:

    * ``new_index``: index ``index_idx`` of replica ``replica_idx`` opened on
      the candidate at ``node_position`` for the project named;
    * ``no_node``: no candidate could take the project (a ``node_unavailable``
      error);
    * ``empty_replica``: the index of an empty replica on the candidate with
      the most unclaimed storage (``node_position``), or none (``None``);
    * ``memory_overflow`` (memory dimension): project ``project_id`` stayed
      in index ``index_idx`` on ``node_position`` although it exceeds that
      index's memory limit, because no other node could take a new index of
      the replica (or the split was balanced, ``warning`` says which); the
      first such project of each index is recorded.

    ``exhausted`` holds the candidate positions the namespace could not use
    at that moment (they hold an index of it). ``cause`` says why a new index
    opened (``first``, ``disk``, ``memory_ceiling``, ``memory_budget``) and
    ``warning`` names the memory warning a degraded decision raised.

    What each candidate had available then is not copied into the record
    (that would cost a copy of every node per decision); the
    ``DecisionLog`` keeps every change instead and answers ``available``.
    A tuple rather than a dataclass: a run may write a million of them.
    """

    kind: str
    namespace_id: int
    replica_idx: int | None
    index_idx: int | None
    project_id: int | None
    project_namespace_id: int | None
    requested: Mapping[str, int]
    node_position: int | None
    exhausted: frozenset[int]
    cause: str | None = None
    warning: str | None = None


@dataclass(slots=True)
class DecisionLog:
    """The decisions of one run, and enough history to replay what each one saw."""

    #: The candidate node ids, in candidate order (positions index this).
    node_ids: tuple[int, ...]
    decisions: list[Decision] = field(default_factory=list)
    #: Per dimension, per candidate position: the sequence numbers (decision
    #: count at the time) and values of every change, oldest first.
    history: dict[str, list[tuple[list[int], list[int]]]] = field(default_factory=dict)
    #: ``options.strategy`` of the run: how the chosen node was chosen among the usable.
    strategy: str = "first_fit"
    #: ``balanced`` only: per dimension, per candidate position, what the node's
    #: room is scored against (its disk size; its memory budget, infinite: none).
    capacity: dict[str, list[int | float]] | None = None
    #: With zones: per (namespace id, replica_idx), the candidate positions the zone
    #: rule set aside for that replica (their zone holds another replica of the
    #: namespace). They are in the decisions' ``exhausted`` sets; explain tells them apart.
    zone_excluded: dict[tuple[int, int], frozenset[int]] = field(default_factory=dict)

    def score(
        self, available: Mapping[str, int | None], position: int, dims: Iterable[str]
    ) -> float | None:
        """The balanced score (``planner.filters.node_score``) of what a candidate had,
        over the dimensions the decision asked for (``dims``: a disk-only decision of a
        memory run, its fallback, was scored by disk alone); ``None`` when the run was
        not balanced."""
        if self.capacity is None:
            return None
        capacity = {
            dim: None if per_node[position] == _INF else per_node[position]
            for dim, per_node in self.capacity.items()
            if dim in dims
        }
        return round(node_score(available, capacity), 6)

    def available(self, sequence: int, position: int) -> dict[str, int | None]:
        """What the candidate at ``position`` had when decision ``sequence`` was made.

        ``None`` in the memory dimension: the node has no budget (no limit).
        """
        out: dict[str, int | None] = {}
        for dim, per_node in self.history.items():
            sequences, values = per_node[position]
            value = values[bisect_right(sequences, sequence) - 1]
            out[dim] = None if value == _INF else value
        return out

    @property
    def memory(self) -> bool:
        return MEMORY in self.history


@dataclass(slots=True)
class Plan:
    create: list[NamespacePlan]
    destroy: list[NamespacePlan]
    unchanged: list[NamespacePlan]
    failures: list[NamespacePlan]
    nodes: list[NodeChange]
    #: Not part of the JSON: every namespace plan in the order the run
    #: planned them, and (unless switched off) the decision records that
    #: ``planner.explain`` reads.
    namespaces_in_order: list[NamespacePlan] = field(default_factory=list)
    log: DecisionLog | None = None
    #: Memory dimension only: ``{"disk": {...}, "memory": {...}}``, each with
    #: ``lower_bound``, ``max_utilization`` and ``ratio`` (docs/planner.md).
    bounds: dict[str, dict[str, float | None]] | None = None
    #: Some node of the scenario has a name: every index carries
    #: ``node_name`` and every ``nodes`` entry ``name``.
    named: bool = False

    @property
    def total_required_storage_bytes(self) -> int:
        return sum(ns.namespace_required_storage_bytes for ns in self.create)

    def to_dict(self) -> dict[str, Any]:
        named = self.named
        out: dict[str, Any] = {
            "total_required_storage_bytes": self.total_required_storage_bytes,
            "create": [ns.to_dict(named=named) for ns in self.create],
            "destroy": [ns.to_dict(named=named) for ns in self.destroy],
            "unchanged": [ns.to_dict(named=named) for ns in self.unchanged],
            "nodes": [node.to_dict(named=named) for node in self.nodes],
            # A failed plan's indices always carry node_name, null for a nameless node,
            # as GitLab's newest planner writes them (docs/planner.md).
            "failures": [ns.to_dict(named=True) for ns in self.failures],
        }
        if self.bounds is not None:
            out["bounds"] = {dim: dict(values) for dim, values in self.bounds.items()}
        return out

    def to_json(self, *, indent: int | None = 2) -> str:
        return self.to_json_bytes(indent=indent).decode()

    def to_json_bytes(self, *, indent: int | None = 2) -> bytes:
        """The plan as UTF-8 JSON (what ``python -m planner plan`` writes)."""
        with gc_paused():
            return dumps_bytes(self.to_dict(), indent=indent)


def dumps(obj: Any, *, indent: int | None = 2) -> str:
    """The one JSON form of planner output: sorted keys, UTF-8, no trailing space."""
    return dumps_bytes(obj, indent=indent).decode()


def dumps_bytes(obj: Any, *, indent: int | None = 2) -> bytes:
    """``dumps`` as bytes: two spaces of indent (or none), keys sorted."""
    option = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
    if indent is not None:
        if indent != 2:
            raise ValueError("planner JSON is indented by two spaces or not at all")
        option |= orjson.OPT_INDENT_2
    return orjson.dumps(obj, option=option)


def bounds_entry(lower: float | None, utilization: float | None) -> dict[str, float | None]:
    """One dimension of ``bounds``: the lower bound, the plan's max utilisation, their ratio.

    With a zero bound the ratio is 1 when nothing was claimed and ``None``
    (unbounded) otherwise; ``None`` wherever either figure is unknown.
    Rounded to six decimals after the ratio is computed.
    """
    ratio: float | None
    if lower is None or utilization is None:
        ratio = None
    elif lower == 0:
        ratio = 1.0 if utilization == 0 else None
    else:
        ratio = utilization / lower
    return {
        "lower_bound": None if lower is None else round(lower, 6),
        "max_utilization": None if utilization is None else round(utilization, 6),
        "ratio": None if ratio is None else round(ratio, 6),
    }
