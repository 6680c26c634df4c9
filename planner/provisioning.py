"""Capacity: how many nodes the fleet needs now and later, and what a change would do
(docs/capacity.md, "Provisioning and what-if"; pure, no Django).

**The forecast** (``provisioning``) takes the fleet's totals over time (its used and
indexed disk bytes and its memory estimate, one point per history sample) and the
fleet now, and returns

* the growth per day of each figure: the least-squares slope over the history
  window (7 days by default), or none with fewer than two samples at distinct times;
* per horizon (now, in 30 and in 90 days) the *demand*: the figure now plus the
  slope × the days (never below 0), with the configured replicas applied (the
  replica factor: configured replicas ÷ the mean copies a namespace has now; the
  index bytes and the memory estimate scale by it, the rest of the disk does not);
  the nodes of the current size (the median node's disk and budget) needed to hold
  it under the low watermark, per dimension, ``ceil(demand ÷ (size × low))``, the
  larger taken and never fewer than the replicas; and Cruise Control's provisioning
  status with a recommendation and a reason code:

  - ``UNDER_PROVISIONED`` when the nodes needed exceed the nodes present (add the
    difference);
  - ``OVER_PROVISIONED`` when the nodes present exceed, by at least one, the nodes
    needed for the demand plus the margin (10 %): one node fewer still leaves room
    (remove the difference);
  - ``RIGHT_SIZED`` otherwise;
  - ``UNDECIDED`` with no node size, or for a later horizon without a growth figure;

* when the fleet reaches the low watermark, per dimension: the days until the
  demand reaches the low watermark of the capacity present (0 when it has already,
  None when it is not growing).

**The what-if** (``what_if``) runs the real planner and the desired balance on a
copy of the fleet with nodes added (of the median size, or the size given), nodes
removed and the replicas changed, and returns per node the figures before and
after, the moves it would take (a removed node's indices first, each to the node
the balance's rules allow that is left lowest; then the desired balance's moves),
the copies the planner would build (new replicas, and the namespaces short of
replicas now) and the indices that find no place. Nothing is written.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner import core
from planner.balance import (
    Balance,
    BalanceError,
    BalanceIndex,
    BalanceNode,
    BalanceOptions,
    NodeFigures,
    _Fleet,
    desired_balance,
)
from planner.scenario import parse_scenario
from zoekt import capacity
from zoekt.reasons import Reason

__all__ = [
    "Fleet",
    "FleetSample",
    "Growth",
    "Horizon",
    "NodeSize",
    "Provisioning",
    "ProvisioningOptions",
    "Status",
    "WhatIf",
    "WhatIfResult",
    "growth",
    "least_squares",
    "nodes_needed",
    "provisioning",
    "what_if",
]

DAY_SECONDS = 86_400
DEFAULT_WINDOW_SECONDS = 7 * DAY_SECONDS
DEFAULT_HORIZONS_DAYS = (0, 30, 90)
#: The headroom over the demand an over-provisioned fleet keeps after one node fewer.
DEFAULT_MARGIN = 0.10
#: A ready index's used bytes per planned byte: the planner reserves the observed
#: buffer factor × the safety margin (1 / 0.6) × 1.5 (docs/capacity.md).
PLANNED_BYTES_PER_USED = (1 / capacity.STORAGE_IDEAL_PERCENT_USED) * 1.5


class Status(enum.StrEnum):
    """Cruise Control's ``provisionStatus``."""

    RIGHT_SIZED = "RIGHT_SIZED"
    UNDER_PROVISIONED = "UNDER_PROVISIONED"
    OVER_PROVISIONED = "OVER_PROVISIONED"
    UNDECIDED = "UNDECIDED"


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------- #
# The forecast
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class FleetSample:
    """The fleet's totals at one time (seconds since the epoch)."""

    at: float
    used_bytes: int
    indexed_bytes: int
    #: The memory estimate of the fleet's indices; None: not sampled.
    memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class NodeSize:
    disk_bytes: int
    #: None: no memory budget (memory planning off).
    memory_budget_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"disk_bytes": self.disk_bytes, "memory_budget_bytes": self.memory_budget_bytes}


@dataclass(frozen=True, slots=True)
class Fleet:
    """The fleet now, as the forecast reads it."""

    nodes: int
    disk_bytes: int
    #: The nodes' memory budgets summed; None: memory planning off.
    memory_budget_bytes: int | None
    used_bytes: int
    indexed_bytes: int
    memory_bytes: int
    #: The size a node to add would have: the median of the nodes present.
    node_size: NodeSize
    #: The configured replicas of a namespace, and the copies a namespace with any has
    #: now, on average (0: none placed).
    replicas: int = 1
    placed_copies: float = 0.0

    @property
    def replica_factor(self) -> float:
        return self.replicas / self.placed_copies if self.placed_copies > 0 else 1.0


def node_size(totals: Iterable[int], budgets: Iterable[int | None]) -> NodeSize:
    """The median node: its disk of the nodes with one, its budget of those with one."""
    disks = [t for t in totals if t > 0]
    known = [b for b in budgets if b]
    return NodeSize(
        disk_bytes=int(statistics.median(disks)) if disks else 0,
        memory_budget_bytes=int(statistics.median(known)) if known else None,
    )


@dataclass(frozen=True, slots=True)
class ProvisioningOptions:
    low_watermark: float = capacity.WATERMARK_LIMIT_LOW
    memory_low_watermark: float = capacity.MEMORY_WATERMARK_LIMIT_LOW
    margin: float = DEFAULT_MARGIN
    horizons_days: tuple[int, ...] = DEFAULT_HORIZONS_DAYS
    window_seconds: float = DEFAULT_WINDOW_SECONDS


def least_squares(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(slope, intercept) of the least-squares line through the points; None with fewer
    than two distinct x."""
    n = len(points)
    if n < 2:
        return None
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    return slope, mean_y - slope * mean_x


@dataclass(frozen=True, slots=True)
class Growth:
    """Bytes per day of each fleet figure over the window (None: not enough history)."""

    samples: int
    window_seconds: float
    used_bytes_per_day: float | None
    indexed_bytes_per_day: float | None
    memory_bytes_per_day: float | None

    @property
    def known(self) -> bool:
        return self.used_bytes_per_day is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "window_days": _round(self.window_seconds / DAY_SECONDS, 3),
            "used_bytes_per_day": _round(self.used_bytes_per_day, 1),
            "indexed_bytes_per_day": _round(self.indexed_bytes_per_day, 1),
            "memory_bytes_per_day": _round(self.memory_bytes_per_day, 1),
        }


def growth(
    history: Iterable[FleetSample], now: float, window_seconds: float = DEFAULT_WINDOW_SECONDS
) -> Growth:
    """The least-squares growth per day of the samples in ``(now − window, now]``."""
    rows = sorted((s for s in history if now - window_seconds < s.at <= now), key=lambda s: s.at)

    def slope(get: Callable[[FleetSample], int | None]) -> float | None:
        points = [(s.at / DAY_SECONDS, float(v)) for s in rows if (v := get(s)) is not None]
        fit = least_squares(points)
        return None if fit is None else fit[0]

    return Growth(
        samples=len(rows),
        window_seconds=window_seconds,
        used_bytes_per_day=slope(lambda s: s.used_bytes),
        indexed_bytes_per_day=slope(lambda s: s.indexed_bytes),
        memory_bytes_per_day=slope(lambda s: s.memory_bytes),
    )


def nodes_needed(demand_bytes: float, node_bytes: int | None, watermark: float) -> int | None:
    """Nodes of ``node_bytes`` that hold ``demand_bytes`` under ``watermark``; None without
    a size."""
    if not node_bytes or node_bytes <= 0:
        return None
    if demand_bytes <= 0:
        return 0
    return math.ceil(demand_bytes / (node_bytes * watermark) - 1e-9)


@dataclass(frozen=True, slots=True)
class Horizon:
    """The provisioning status at one horizon."""

    days: int
    disk_demand_bytes: int
    memory_demand_bytes: int | None
    #: The demand over the capacity present (None: no capacity in that dimension).
    disk_share: float | None
    memory_share: float | None
    nodes_present: int
    nodes_needed_disk: int | None
    nodes_needed_memory: int | None
    nodes_needed: int | None
    status: Status
    reason: str
    #: +n: add n nodes of the median size; −n: n could go; 0: none.
    node_change: int

    def as_dict(self, size: NodeSize) -> dict[str, Any]:
        return {
            "days": self.days,
            "disk_demand_bytes": self.disk_demand_bytes,
            "memory_demand_bytes": self.memory_demand_bytes,
            "disk_share": _round(self.disk_share),
            "memory_share": _round(self.memory_share),
            "nodes_present": self.nodes_present,
            "nodes_needed_disk": self.nodes_needed_disk,
            "nodes_needed_memory": self.nodes_needed_memory,
            "nodes_needed": self.nodes_needed,
            "status": str(self.status),
            "reason": self.reason,
            "recommendation": recommendation(self, size),
        }


def recommendation(horizon: Horizon, size: NodeSize) -> str:
    """Cruise Control's ``provisionRecommendation``, in words."""
    n = abs(horizon.node_change)
    nodes = f"{n} node{'s' if n != 1 else ''}"
    of = f"of {size.disk_bytes / capacity.GIB:,.0f} GiB disk"
    if size.memory_budget_bytes:
        of += f" and {size.memory_budget_bytes / capacity.GIB:,.0f} GiB memory budget"
    if horizon.status == Status.UNDER_PROVISIONED:
        return f"add {nodes} {of}"
    if horizon.status == Status.OVER_PROVISIONED:
        return f"{nodes} {of} could be removed"
    if horizon.status == Status.UNDECIDED:
        return "none: " + horizon.reason.replace("_", " ")
    return "none"


@dataclass(frozen=True, slots=True)
class LowWatermark:
    """When a dimension's demand reaches the low watermark of the capacity present."""

    dimension: str
    share_now: float | None
    watermark: float
    #: 0: already; None: not growing (or no capacity); else days from now.
    days: float | None

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "dimension": self.dimension,
            "share_now": _round(self.share_now),
            "watermark": self.watermark,
            "days": _round(self.days, 3),
            "at": None if self.days is None else now + self.days * DAY_SECONDS,
        }


@dataclass(frozen=True)
class Provisioning:
    now: float
    fleet: Fleet
    options: ProvisioningOptions
    growth: Growth
    horizons: tuple[Horizon, ...]
    low_watermark: tuple[LowWatermark, ...]

    @property
    def status(self) -> Status:
        return self.horizons[0].status

    def as_dict(self) -> dict[str, Any]:
        fleet = self.fleet
        return {
            "status": str(self.status),
            "fleet": {
                "nodes": fleet.nodes,
                "disk_bytes": fleet.disk_bytes,
                "memory_budget_bytes": fleet.memory_budget_bytes,
                "used_bytes": fleet.used_bytes,
                "indexed_bytes": fleet.indexed_bytes,
                "memory_bytes": fleet.memory_bytes,
                "node_size": fleet.node_size.as_dict(),
                "replicas": fleet.replicas,
                "placed_copies": _round(fleet.placed_copies, 3),
                "replica_factor": _round(fleet.replica_factor),
            },
            "options": {
                "low_watermark": self.options.low_watermark,
                "memory_low_watermark": self.options.memory_low_watermark,
                "margin": self.options.margin,
                "horizons_days": list(self.options.horizons_days),
                "window_days": _round(self.options.window_seconds / DAY_SECONDS, 3),
            },
            "growth": self.growth.as_dict(),
            "horizons": [h.as_dict(fleet.node_size) for h in self.horizons],
            "low_watermark": [w.as_dict(self.now) for w in self.low_watermark],
        }


def _demand(fleet: Fleet, rate: Growth, days: float) -> tuple[float, float | None]:
    """(disk, memory) demand ``days`` from now, with the replica factor."""
    factor = fleet.replica_factor
    used = max(0.0, fleet.used_bytes + (rate.used_bytes_per_day or 0.0) * days)
    indexed = max(0.0, fleet.indexed_bytes + (rate.indexed_bytes_per_day or 0.0) * days)
    indexed = min(indexed, used)
    disk = used + indexed * (factor - 1)
    if fleet.memory_budget_bytes is None:
        return disk, None
    memory = max(0.0, fleet.memory_bytes + (rate.memory_bytes_per_day or 0.0) * days)
    return disk, memory * factor


def _status(needed: int | None, with_margin: int | None, present: int) -> tuple[Status, str, int]:
    if needed is None or with_margin is None:
        return Status.UNDECIDED, str(Reason.NO_NODE_SIZE), 0
    if needed > present:
        return Status.UNDER_PROVISIONED, str(Reason.NODES_NEEDED_EXCEED_PRESENT), needed - present
    if present - 1 >= with_margin:
        return (
            Status.OVER_PROVISIONED,
            str(Reason.NODES_PRESENT_EXCEED_NEED),
            with_margin - present,
        )
    return Status.RIGHT_SIZED, str(Reason.NODES_PRESENT_MEET_NEED), 0


def _needed(fleet: Fleet, disk: float, memory: float | None, options: ProvisioningOptions):
    size = fleet.node_size
    on_disk = nodes_needed(disk, size.disk_bytes, options.low_watermark)
    on_memory = (
        None
        if memory is None
        else nodes_needed(memory, size.memory_budget_bytes, options.memory_low_watermark)
    )
    if on_disk is None:
        return on_disk, on_memory, None
    return on_disk, on_memory, max(on_disk, on_memory or 0, fleet.replicas)


def _horizon(fleet: Fleet, rate: Growth, days: int, options: ProvisioningOptions) -> Horizon:
    disk, memory = _demand(fleet, rate, days)
    on_disk, on_memory, needed = _needed(fleet, disk, memory, options)
    grown = 1 + options.margin
    _d, _m, with_margin = _needed(
        fleet, disk * grown, None if memory is None else memory * grown, options
    )
    status, reason, change = _status(needed, with_margin, fleet.nodes)
    if days > 0 and not rate.known:
        status, reason, change = Status.UNDECIDED, str(Reason.NOT_ENOUGH_HISTORY), 0
    return Horizon(
        days=days,
        disk_demand_bytes=round(disk),
        memory_demand_bytes=None if memory is None else round(memory),
        disk_share=disk / fleet.disk_bytes if fleet.disk_bytes > 0 else None,
        memory_share=(
            memory / fleet.memory_budget_bytes
            if memory is not None and fleet.memory_budget_bytes
            else None
        ),
        nodes_present=fleet.nodes,
        nodes_needed_disk=on_disk,
        nodes_needed_memory=on_memory,
        nodes_needed=needed,
        status=status,
        reason=reason,
        node_change=change,
    )


def _reaches(now_bytes: float, per_day: float, capacity_bytes: int | None, low: float):
    """Days until ``now_bytes`` growing by ``per_day`` reaches ``low`` of the capacity."""
    if not capacity_bytes:
        return None, None
    share = now_bytes / capacity_bytes
    if share >= low:
        return share, 0.0
    if per_day <= 0:
        return share, None
    return share, (low * capacity_bytes - now_bytes) / per_day


def provisioning(
    fleet: Fleet,
    history: Iterable[FleetSample],
    now: float,
    options: ProvisioningOptions | None = None,
) -> Provisioning:
    """The provisioning status now and at each horizon, and when the low watermark comes."""
    options = options or ProvisioningOptions()
    rate = growth(history, now, options.window_seconds)
    horizons = tuple(_horizon(fleet, rate, days, options) for days in options.horizons_days)
    disk_now, memory_now = _demand(fleet, rate, 0)
    factor = fleet.replica_factor
    disk_rate = (rate.used_bytes_per_day or 0.0) + (rate.indexed_bytes_per_day or 0.0) * (
        factor - 1
    )
    share, days = _reaches(disk_now, disk_rate, fleet.disk_bytes, options.low_watermark)
    marks = [LowWatermark("disk", share, options.low_watermark, days)]
    if memory_now is not None:
        share, days = _reaches(
            memory_now,
            (rate.memory_bytes_per_day or 0.0) * factor,
            fleet.memory_budget_bytes,
            options.memory_low_watermark,
        )
        marks.append(LowWatermark("memory", share, options.memory_low_watermark, days))
    return Provisioning(now, fleet, options, rate, horizons, tuple(marks))


# --------------------------------------------------------------------------- #
# The what-if
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class WhatIf:
    """A change to try: nodes added (of the median size unless given), nodes removed,
    the replicas of every namespace."""

    add_nodes: int = 0
    disk_bytes: int | None = None
    memory_budget_bytes: int | None = None
    remove_node_ids: tuple[int, ...] = ()
    replicas: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "add_nodes": self.add_nodes,
            "disk_bytes": self.disk_bytes,
            "memory_budget_bytes": self.memory_budget_bytes,
            "remove_node_ids": list(self.remove_node_ids),
            "replicas": self.replicas,
        }


@dataclass(frozen=True, slots=True)
class WhatIfMove:
    index_id: int
    enabled_namespace_id: int | None
    from_node_id: int
    to_node_id: int | None
    bytes: int
    memory_bytes: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "index_id": self.index_id,
            "enabled_namespace_id": self.enabled_namespace_id,
            "from_node_id": self.from_node_id,
            "to_node_id": self.to_node_id,
            "bytes": self.bytes,
            "memory_bytes": self.memory_bytes,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class WhatIfBuild:
    """A copy the planner would build (a new replica's index)."""

    enabled_namespace_id: int
    node_id: int
    bytes: int
    memory_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled_namespace_id": self.enabled_namespace_id,
            "node_id": self.node_id,
            "bytes": self.bytes,
            "memory_bytes": self.memory_bytes,
        }


@dataclass(frozen=True)
class WhatIfResult:
    change: WhatIf
    #: Per node id: its name, the figures now (None: added) and after (None: removed).
    nodes: tuple[tuple[int, str, NodeFigures | None, NodeFigures | None], ...]
    moves: tuple[WhatIfMove, ...]
    builds: tuple[WhatIfBuild, ...]
    #: Indices (a removed node's) no node could take, with the reason.
    unplaced: tuple[WhatIfMove, ...]
    #: Namespaces the planner failed, with its first error code.
    failed: tuple[tuple[int, str], ...]
    #: Replica ids the planner would destroy (fewer replicas).
    destroyed_replica_ids: tuple[int, ...]
    balance: Balance

    @property
    def bytes_to_move(self) -> int:
        return sum(m.bytes for m in self.moves)

    def as_dict(self) -> dict[str, Any]:
        return {
            "change": self.change.as_dict(),
            "nodes": [
                {
                    "node_id": node_id,
                    "name": name,
                    "before": None if before is None else before.as_dict(),
                    "after": None if after is None else after.as_dict(),
                }
                for node_id, name, before, after in self.nodes
            ],
            "moves": [m.as_dict() for m in self.moves],
            "move_count": len(self.moves),
            "bytes_to_move": self.bytes_to_move,
            "builds": [b.as_dict() for b in self.builds],
            "bytes_to_build": sum(b.bytes for b in self.builds),
            "unplaced": [m.as_dict() for m in self.unplaced],
            "failed_namespaces": [
                {"enabled_namespace_id": ns, "reason": reason} for ns, reason in self.failed
            ],
            "destroyed_replica_ids": list(self.destroyed_replica_ids),
            "busiest_over_lower_bound": self.balance.over_lower_bound(),
            "converged_after": {
                "moves": len(self.balance.moves),
                "complete": self.balance.complete,
            },
        }


def _added_nodes(nodes: Sequence[BalanceNode], change: WhatIf) -> list[BalanceNode]:
    size = node_size((n.total_bytes for n in nodes), (n.memory_budget_bytes for n in nodes))
    disk = change.disk_bytes if change.disk_bytes is not None else size.disk_bytes
    budget = change.memory_budget_bytes or size.memory_budget_bytes
    first = max((n.id for n in nodes), default=0) + 1
    return [
        BalanceNode(
            id=first + k,
            name=f"new-{k + 1}",
            total_bytes=disk,
            used_bytes=0,
            memory_budget_bytes=budget,
        )
        for k in range(change.add_nodes)
    ]


def _rehome(fleet: _Fleet, removed: set[int]) -> tuple[list[WhatIfMove], list[WhatIfMove]]:
    """Every index of a removed node to the node the balance's rules allow that is left
    lowest (largest index first); those with none are unplaced."""
    moves: list[WhatIfMove] = []
    unplaced: list[WhatIfMove] = []
    leaving = sorted(
        (fleet.indices[i] for node_id in sorted(removed) for i in fleet.on[node_id]),
        key=lambda index: (-index.used_bytes, index.id),
    )
    for index in leaving:
        best: tuple[float, int] | None = None
        for node_id in sorted(fleet.nodes):
            if node_id in removed or fleet.target_refusal(index.id, node_id) is not None:
                continue
            after = fleet.share(
                node_id,
                fleet.used[node_id] + index.used_bytes,
                fleet.mem[node_id] + index.estimated_memory_bytes,
            )
            if after is not None and (best is None or (after, node_id) < best):
                best = (after, node_id)
        row = WhatIfMove(
            index.id,
            index.enabled_namespace_id,
            index.node_id,
            None if best is None else best[1],
            index.used_bytes,
            index.estimated_memory_bytes,
            str(Reason.WHAT_IF_NODE_REMOVED if best else Reason.WHAT_IF_NO_TARGET),
        )
        if best is None:
            unplaced.append(row)
        else:
            fleet.move(index.id, best[1])
            moves.append(row)
    return moves, unplaced


def _planned(
    scenario: Mapping[str, Any],
    fleet: _Fleet,
    removed: set[int],
    unclaimed: Mapping[int, int],
    replicas: int | None,
) -> Any:
    """The real planner on the scenario, over the what-if's nodes: an existing node keeps
    its unclaimed bytes less what the what-if moved onto it (as reserved at the ideal
    fill), an added one has its whole disk."""
    nodes = []
    for node_id, node in sorted(fleet.nodes.items()):
        if node_id in removed or not node.receiving:
            continue
        start = fleet.nodes[node_id].used_bytes
        extra = max(0, fleet.used[node_id] - start)
        room = unclaimed.get(node_id, node.total_bytes) - int(
            extra / capacity.STORAGE_IDEAL_PERCENT_USED
        )
        entry = {
            "id": node_id,
            "name": node.name,
            "unclaimed_storage_bytes": room,
            "total_bytes": node.total_bytes,
            "memory_budget_bytes": node.memory_budget_bytes,
            "reserved_memory_bytes": fleet.mem[node_id],
        }
        nodes.append(entry)
    holders = fleet.holders
    namespaces = []
    for ns in scenario.get("namespaces", []):
        ns = dict(ns)
        if replicas is not None:
            ns["number_of_replicas"] = replicas
        ns["existing_node_ids"] = sorted(
            holders.get(ns["enabled_namespace_id"], set()) | set(ns.get("existing_node_ids", ()))
        )
        namespaces.append(ns)
    nodes.sort(key=lambda n: (-n["unclaimed_storage_bytes"], n["id"]))
    data = {"options": scenario.get("options"), "nodes": nodes, "namespaces": namespaces}
    return core.plan(parse_scenario(data), record_decisions=False)


def what_if(
    nodes: Iterable[BalanceNode],
    indices: Iterable[BalanceIndex],
    options: BalanceOptions,
    change: WhatIf,
    *,
    scenario: Mapping[str, Any] | None = None,
    unclaimed: Mapping[int, int] | None = None,
) -> WhatIfResult:
    """The fleet after ``change``: the planner's copies, the removed nodes' moves and the
    desired balance's, with per-node figures before and after (nothing is written).

    ``scenario`` is the plan-scenario of the namespaces whose replicas differ from the
    (changed) count, with their projects (``planner.loader``); ``unclaimed`` the nodes'
    unclaimed bytes now. ``BalanceError`` names a bad input."""
    node_list = sorted(nodes, key=lambda n: n.id)
    index_list = sorted(indices, key=lambda i: i.id)
    known = {n.id for n in node_list}
    for k, node_id in enumerate(change.remove_node_ids):
        if node_id not in known:
            raise BalanceError(f"remove[{k}]", f"node {node_id} is not in the fleet")
    before = desired_balance(node_list, index_list, replace(options, max_moves=0))
    figures_before = {nb.node_id: nb.now for nb in before.nodes}
    added = _added_nodes(node_list, change)
    removed = set(change.remove_node_ids)
    all_nodes = {n.id: replace(n, receiving=False) if n.id in removed else n for n in node_list}
    all_nodes.update({n.id: n for n in added})
    by_index = {i.id: i for i in index_list}
    fleet = _Fleet(all_nodes, by_index, options)
    moves, unplaced = _rehome(fleet, removed)
    builds: list[WhatIfBuild] = []
    failed: list[tuple[int, str]] = []
    destroyed: list[int] = []
    layout = dict(fleet.where)
    new_indices: list[BalanceIndex] = []
    if scenario is not None and scenario.get("namespaces"):
        plan = _planned(scenario, fleet, removed, unclaimed or {}, change.replicas)
        copy_bytes = _copy_bytes(index_list)
        next_id = max((i.id for i in index_list), default=0) + 1
        for ns_plan in plan.namespaces_in_order:
            if ns_plan.errors:
                failed.append((ns_plan.enabled_namespace_id, ns_plan.errors[0].type))
            destroyed.extend(ns_plan.replicas_to_destroy or ())
            for replica in ns_plan.replicas:
                total = sum(ix.required_storage_bytes for ix in replica.indices) or 1
                for ix in replica.indices:
                    copy = copy_bytes.get(ns_plan.enabled_namespace_id)
                    share = ix.required_storage_bytes / total
                    used = (
                        round(copy[0] * share)
                        if copy
                        else round(ix.required_storage_bytes / PLANNED_BYTES_PER_USED)
                    )
                    mem = round(copy[1] * share) if copy else (ix.estimated_memory_bytes or 0)
                    builds.append(WhatIfBuild(ns_plan.enabled_namespace_id, ix.node_id, used, mem))
                    new_indices.append(
                        BalanceIndex(
                            id=next_id,
                            node_id=ix.node_id,
                            enabled_namespace_id=ns_plan.enabled_namespace_id,
                            replica_id=None,
                            used_bytes=used,
                            estimated_memory_bytes=mem,
                            movable=False,
                        )
                    )
                    next_id += 1
    gone = set(destroyed)
    kept_nodes = [n for n_id, n in sorted(all_nodes.items()) if n_id not in removed]
    kept_nodes = [
        replace(
            n,
            used_bytes=max(
                0,
                fleet.used[n.id] + _built(new_indices, n.id) - _gone(by_index, layout, gone, n.id),
            ),
        )
        for n in kept_nodes
    ]
    after_indices = [
        replace(index, node_id=layout[index.id])
        for index in index_list
        if index.replica_id not in gone and layout[index.id] not in removed
    ] + new_indices
    balance = desired_balance(kept_nodes, after_indices, options)
    moves = _folded(moves, balance)
    after = {nb.node_id: nb.desired for nb in balance.nodes}
    names = {n_id: n.name for n_id, n in all_nodes.items()}
    return WhatIfResult(
        change=change,
        nodes=tuple(
            (n_id, names[n_id], figures_before.get(n_id), after.get(n_id))
            for n_id in sorted(all_nodes)
        ),
        moves=tuple(moves),
        builds=tuple(builds),
        unplaced=tuple(unplaced),
        failed=tuple(failed),
        destroyed_replica_ids=tuple(sorted(gone)),
        balance=balance,
    )


def _copy_bytes(indices: Sequence[BalanceIndex]) -> dict[int, tuple[int, int]]:
    """Per enabled namespace, the (used, memory) bytes of one copy: its first replica's."""
    by_replica: dict[tuple[int, int], list[int]] = {}
    for index in indices:
        if index.enabled_namespace_id is None or index.replica_id is None:
            continue
        key = (index.enabled_namespace_id, index.replica_id)
        entry = by_replica.setdefault(key, [0, 0])
        entry[0] += index.used_bytes
        entry[1] += index.estimated_memory_bytes
    out: dict[int, tuple[int, int]] = {}
    for (ns, _replica), (used, mem) in sorted(by_replica.items()):
        out.setdefault(ns, (used, mem))
    return out


def _built(new: Sequence[BalanceIndex], node_id: int) -> int:
    return sum(i.used_bytes for i in new if i.node_id == node_id)


def _gone(
    by_index: Mapping[int, BalanceIndex], layout: Mapping[int, int], gone: set[int], node_id: int
) -> int:
    return sum(
        i.used_bytes for i in by_index.values() if i.replica_id in gone and layout[i.id] == node_id
    )


def _folded(removal: list[WhatIfMove], balance: Balance) -> list[WhatIfMove]:
    """The removal moves, then the balance's: an index a removal put on a node that the
    balance moves on goes from the removed node straight to its last node, once."""
    last = {m.index_id: m.to_node_id for m in balance.moves}
    out = [replace(m, to_node_id=last.get(m.index_id, m.to_node_id)) for m in removal]
    rehomed = {m.index_id for m in removal}
    out += [
        WhatIfMove(
            m.index_id,
            m.enabled_namespace_id,
            m.from_node_id,
            m.to_node_id,
            m.bytes,
            m.memory_bytes,
            m.reason,
        )
        for m in balance.moves
        if m.index_id not in rehomed
    ]
    return out
