"""The desired balance: where every placed index should be, and the moves that get it
there (docs/balance.md; pure, no Django).

``desired_balance(nodes, indices, options)`` takes the fleet as it is (each node's
disk and used bytes, its memory budget, whether it may receive; each placed index
with its node, namespace, used bytes and memory estimate) and returns the layout
it should converge to, the moves in order, and the figures before and after.
Elasticsearch's desired-balance allocator is the model: compute the target layout
first, reconcile towards it afterwards (the reconciler is not here).

**The measure** is the balanced placement's (``planner.filters.node_score``): a
node's *dominant share*, the larger of its disk share (used ÷ disk size) and, with
memory on and a budget, its memory share (the estimates of its indices ÷ its
budget). The *busiest node* is the one with the largest dominant share.

**The rule.** The busiest node that has something to shed sheds first (ties by
id); a node at or under the fleet's lower bound sheds nothing (it is where the
fleet can be at best: moving its data is churn). A move of one of its indices to a
target qualifies when

* the target passes every placement rule: it may receive (the caller's flag:
  online, a search node, not cooling down, not in maintenance), holds no index of
  the namespace (so the replicas of a namespace stay on distinct nodes), with zones
  set does not put the index's replica in a zone that holds another replica of
  the namespace unless the replica leaves such a zone by the move (so the
  replicas stay in distinct zones), stays
  under the disk ceiling (used + the index < ``disk_ceiling`` of its disk, 70 % by
  default, as a move's target must) and, with memory on, has memory room under its
  budget's high memory watermark (``_Fleet.target_refusal``, in the order and with
  the codes of ``eviction.moves.target_refusal``);
* the source's dominant share falls, and the target's after the move stays more
  than the margin below where the source was: ``target after < source before ×
  (1 − margin)``. The busiest node therefore never rises, a move never just moves
  the hot spot, and a fleet whose nodes are all within the margin of the busiest
  has nothing to do. The margin is a share of the source's dominant share, not a
  fall each single move must achieve: that would forbid every index smaller than
  the margin, however unbalanced the fleet.

Among the qualifying moves of the source the preferred one lowers it most per byte
moved, counting only the fall above the lower bound (a move that takes the source
below the level the fleet can reach, or the target above it, is partly wasted:
those bytes come back); then the largest fall (fewer moves for the same bytes); then
the target left lowest; then index id and node id. For one index the best target is
always the one left lowest, so the search per index stops at the first target that
cannot beat it.

**Each index moves at most once.** The search moves indices not moved yet. When
none qualifies, an index moved earlier may qualify to move on (from B to C): the
plan then moves it from its own node A straight to C (or not at all when C is A),
leaves out the steps that relied on it being at B and no longer qualify, and
searches on from there; the result is taken only when it is better (below). When
it is not, the index stays at B, *held back* (``Balance.held_back``): the typical
case is two copies of one namespace trading nodes, which only a second move of
one of them can do. The next computation, once the plan is carried out, moves it.
Every accepted step makes the nodes' dominant shares, sorted from the busiest
down, lexicographically smaller, so the search ends; and it ends only when no
index qualifies to move but the held-back ones, so the desired layout is its own
desired balance (a fixed point) whenever nothing is held back.

The moves are listed in the order they are applied, each checked again at its
turn, with the figures then (the busiest node's dominant share, the source's and
the target's, before and after); ``misplaced`` lists the indices not where they
should be. The lower bound is, per dimension, total use over total capacity of the
nodes that may hold data (with a disk size, and receiving or holding some), the
dominant one taken. Deterministic: the same fleet in any input order gives the
same answer.

**The explain of one index** (``explain_indices``, Elasticsearch's
``_cluster/allocation/explain``): where it is, where the desired balance wants it
(its planned move with the reason and the shares before and after, or why it
stays), and for every other node ``yes`` or ``no`` for a move there now, with every
code that refuses it: the index's own (pinned, its node at the lower bound), the
target's placement rules (``_Fleet.target_refusals``) and the margin. The rules are
the ones the plan judges its moves by (``_move_refusals``), not a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from planner.plan import bounds_entry
from zoekt.reasons import Reason

__all__ = [
    "Balance",
    "BalanceError",
    "BalanceIndex",
    "BalanceNode",
    "BalanceOptions",
    "IndexExplain",
    "NodeBalance",
    "NodeDecision",
    "NodeFigures",
    "PlannedMove",
    "desired_balance",
    "explain_index",
    "explain_indices",
    "relocated",
]

#: The margin (a share of the busiest node's dominant share) a move must clear.
DEFAULT_MARGIN = 0.05
#: A target's disk use after the move stays under this share of its disk: the high
#: watermark less the hysteresis band, as for every move (``eviction.manual.ceiling``).
DEFAULT_DISK_CEILING = 0.70
#: With memory on, a target's estimates after the move stay under this share of its
#: budget (``zoekt.capacity.MEMORY_WATERMARK_LIMIT_HIGH``).
DEFAULT_HIGH_MEMORY_WATERMARK = 0.75
#: Significant digits of the per-byte and fall figures compared between moves, so
#: that moves equal in exact arithmetic tie and go to the tie-breaks.
_DIGITS = 9


class BalanceError(ValueError):
    """An input the desired balance refuses, naming the field at fault."""

    def __init__(self, field_path: str, message: str):
        self.field = field_path
        self.message = message
        super().__init__(f"{field_path}: {message}")


@dataclass(frozen=True, slots=True)
class BalanceNode:
    """A node as the balance sees it. ``used_bytes`` is its real disk use (as a move's
    target is judged; live moves heading to it included by the caller)."""

    id: int
    name: str
    total_bytes: int
    used_bytes: int
    #: None: no memory limit (or memory planning off).
    memory_budget_bytes: int | None = None
    #: Whether it may take an index: the caller's verdict (online, a search node, not
    #: cooling down, not in maintenance, not over its high memory watermark).
    receiving: bool = True
    #: Why it may not receive (a stable code), when it may not.
    not_receiving_reason: str | None = None
    #: Its failure domain (the operator's), or None. With zones set, no move puts two
    #: replicas of a namespace in one zone (``_Fleet.target_refusal``).
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class BalanceIndex:
    """A placed index: what a move of it would carry."""

    id: int
    node_id: int
    #: None: its enabled namespace is gone (an orphaned row): it holds no namespace's
    #: slot and never moves.
    enabled_namespace_id: int | None
    replica_id: int | None
    used_bytes: int
    estimated_memory_bytes: int = 0
    #: False: it holds its place (not ready, moving already, its node in maintenance):
    #: its bytes and namespace slot count, it never moves.
    movable: bool = True
    #: Why it may not move (stable codes, the caller's), for the explain; empty when
    #: ``movable`` (or when the caller does not say: ``balance_index_pinned``).
    pinned_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BalanceOptions:
    margin: float = DEFAULT_MARGIN
    disk_ceiling: float = DEFAULT_DISK_CEILING
    #: The memory dimension: memory shares count and targets need memory room.
    memory: bool = False
    high_memory_watermark: float = DEFAULT_HIGH_MEMORY_WATERMARK
    #: At most this many planned moves (None: no cap).
    max_moves: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "margin": self.margin,
            "disk_ceiling": self.disk_ceiling,
            "memory": self.memory,
            "high_memory_watermark": self.high_memory_watermark,
            "max_moves": self.max_moves,
        }


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """One node's figures in one layout. Shares are None where there is no measure (no
    disk size reported; no budget or memory off)."""

    used_bytes: int
    memory_bytes: int
    index_count: int
    disk_share: float | None
    memory_share: float | None
    dominant_share: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "used_bytes": self.used_bytes,
            "memory_bytes": self.memory_bytes,
            "index_count": self.index_count,
            "disk_share": _round(self.disk_share),
            "memory_share": _round(self.memory_share),
            "dominant_share": _round(self.dominant_share),
        }


@dataclass(frozen=True, slots=True)
class NodeBalance:
    node_id: int
    name: str
    receiving: bool
    now: NodeFigures
    desired: NodeFigures

    def as_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "name": self.name,
            "receiving": self.receiving,
            "now": self.now.as_dict(),
            "desired": self.desired.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class PlannedMove:
    """One move of the plan, with the dominant shares at its turn."""

    index_id: int
    enabled_namespace_id: int | None
    from_node_id: int
    to_node_id: int
    bytes: int
    memory_bytes: int
    reason: str
    busiest_before: float
    busiest_after: float
    source_before: float
    source_after: float
    target_before: float
    target_after: float

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index_id": self.index_id,
            "enabled_namespace_id": self.enabled_namespace_id,
            "from_node_id": self.from_node_id,
            "to_node_id": self.to_node_id,
            "bytes": self.bytes,
            "memory_bytes": self.memory_bytes,
            "reason": self.reason,
        }
        for key in ("busiest", "source", "target"):
            for when in ("before", "after"):
                out[f"{key}_{when}"] = _round(getattr(self, f"{key}_{when}"))
        return out


@dataclass(frozen=True)
class Balance:
    """The desired balance of a fleet (``desired_balance``)."""

    options: BalanceOptions
    #: Every index's desired node (index id → node id).
    layout: Mapping[int, int]
    moves: tuple[PlannedMove, ...]
    nodes: tuple[NodeBalance, ...]
    #: The indices not where the desired layout has them, by id.
    misplaced: tuple[int, ...]
    bytes_to_move: int
    memory_bytes_to_move: int
    #: Total use over total capacity of the nodes that may hold data, per dimension
    #: (memory: None when off; 0 when such a node has no budget), and the larger.
    disk_lower_bound: float
    memory_lower_bound: float | None
    lower_bound: float
    #: The busiest node's dominant share now and in the desired layout (None: no node
    #: with a disk size).
    busiest_now: float | None
    busiest_desired: float | None
    #: False when the cap on moves stopped the search with moves still qualifying.
    complete: bool = True
    #: Moved indices whose next move could not be folded into one (docs/balance.md).
    held_back: tuple[int, ...] = field(default=())

    @property
    def converged(self) -> bool:
        """No move needed: the fleet is at its desired balance."""
        return not self.moves

    def over_lower_bound(self) -> dict[str, dict[str, float | None]]:
        """The busiest node's dominant share, the lower bound and their ratio, now and when
        converged (the ratio as the planner's ``bounds``: 1 when both are 0, None when
        only the bound is)."""
        out = {}
        for when, busiest in (("now", self.busiest_now), ("desired", self.busiest_desired)):
            entry = bounds_entry(self.lower_bound, busiest)
            out[when] = {
                "busiest": entry["max_utilization"],
                "lower_bound": entry["lower_bound"],
                "ratio": entry["ratio"],
            }
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "converged": self.converged,
            "complete": self.complete,
            "options": self.options.as_dict(),
            "lower_bound": {
                "disk": _round(self.disk_lower_bound),
                "memory": _round(self.memory_lower_bound),
                "dominant": _round(self.lower_bound),
            },
            "busiest_over_lower_bound": self.over_lower_bound(),
            "nodes": [node.as_dict() for node in self.nodes],
            "moves": [move.as_dict() for move in self.moves],
            "misplaced_index_ids": list(self.misplaced),
            "misplaced_count": len(self.misplaced),
            "bytes_to_move": self.bytes_to_move,
            "memory_bytes_to_move": self.memory_bytes_to_move,
            "held_back_index_ids": list(self.held_back),
            "layout": {str(index_id): node_id for index_id, node_id in self.layout.items()},
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _q(value: float) -> float:
    """``value`` to ``_DIGITS`` significant digits: a tie in exact arithmetic stays a tie."""
    return float(f"{value:.{_DIGITS}e}")


# --------------------------------------------------------------------------- #
# Input checks
# --------------------------------------------------------------------------- #


def _check(
    nodes: Sequence[BalanceNode], indices: Sequence[BalanceIndex], options: BalanceOptions
) -> None:
    """Refuse an input that breaks the balance's assumptions, naming the field."""
    if not 0 <= options.margin < 1:
        raise BalanceError("options.margin", "must be at least 0 and below 1")
    if not options.disk_ceiling > 0:
        raise BalanceError("options.disk_ceiling", "must be above 0")
    if not options.high_memory_watermark > 0:
        raise BalanceError("options.high_memory_watermark", "must be above 0")
    if options.max_moves is not None and options.max_moves < 0:
        raise BalanceError("options.max_moves", "must be at least 0 or null")
    seen: set[int] = set()
    for k, node in enumerate(nodes):
        if node.id in seen:
            raise BalanceError(f"nodes[{k}].id", f"node {node.id} appears twice")
        seen.add(node.id)
        if node.total_bytes < 0 or node.used_bytes < 0:
            raise BalanceError(f"nodes[{k}]", "byte counts must be at least 0")
        if node.memory_budget_bytes is not None and node.memory_budget_bytes <= 0:
            raise BalanceError(f"nodes[{k}].memory_budget_bytes", "must be above 0 or null")
    placed: set[int] = set()
    slots: set[tuple[int, int]] = set()
    for k, index in enumerate(indices):
        if index.id in placed:
            raise BalanceError(f"indices[{k}].id", f"index {index.id} appears twice")
        placed.add(index.id)
        if index.node_id not in seen:
            raise BalanceError(f"indices[{k}].node_id", f"node {index.node_id} is not given")
        if index.used_bytes < 0 or index.estimated_memory_bytes < 0:
            raise BalanceError(f"indices[{k}]", "byte counts must be at least 0")
        slot = (index.enabled_namespace_id, index.node_id)
        if index.enabled_namespace_id is not None and slot in slots:
            raise BalanceError(
                f"indices[{k}].node_id",
                f"node {index.node_id} holds two indices of enabled namespace "
                f"{index.enabled_namespace_id}",
            )
        slots.add(slot)


# --------------------------------------------------------------------------- #
# The layout being computed
# --------------------------------------------------------------------------- #


class _Fleet:
    """A layout: per node its used bytes, memory estimates, namespaces and indices."""

    __slots__ = (
        "floor",
        "holders",
        "indices",
        "mem",
        "memory",
        "nodes",
        "on",
        "options",
        "used",
        "where",
        "zoned",
    )

    def __init__(
        self,
        nodes: Mapping[int, BalanceNode],
        indices: Mapping[int, BalanceIndex],
        options: BalanceOptions,
        floor: float = 0.0,
    ) -> None:
        #: The lower bound of the current layout: a node at or under it sheds nothing.
        self.floor = floor
        self.nodes = nodes
        self.indices = indices
        self.options = options
        self.memory = options.memory
        self.used = {node_id: node.used_bytes for node_id, node in nodes.items()}
        self.mem = dict.fromkeys(nodes, 0)
        self.on: dict[int, set[int]] = {node_id: set() for node_id in nodes}
        self.holders: dict[int | None, set[int]] = {None: set()}
        self.where: dict[int, int] = {}
        for index in indices.values():
            self.mem[index.node_id] += index.estimated_memory_bytes
            self.on[index.node_id].add(index.id)
            if index.enabled_namespace_id is not None:
                self.holders.setdefault(index.enabled_namespace_id, set()).add(index.node_id)
            self.where[index.id] = index.node_id
        #: With zones: per enabled namespace, its replicas' indices (the zone rule's
        #: reading); None without zones, and the rule costs nothing.
        self.zoned: dict[int, list[int]] | None = None
        if any(node.zone is not None for node in nodes.values()):
            self.zoned = {}
            for index in indices.values():
                if index.enabled_namespace_id is not None and index.replica_id is not None:
                    self.zoned.setdefault(index.enabled_namespace_id, []).append(index.id)

    def zone_company(self, index_id: int, zone: str | None) -> tuple[bool, bool]:
        """Who else of the index's namespace a node in ``zone`` holds (as the layout
        stands): (an index of another replica, another index of its own replica). A
        node without a zone shares it with none."""
        if zone is None or self.zoned is None:
            return False, False
        index = self.indices[index_id]
        nodes = self.nodes
        other = own = False
        for other_id in self.zoned.get(index.enabled_namespace_id, ()):  # type: ignore[arg-type]
            if other_id == index_id or nodes[self.where[other_id]].zone != zone:
                continue
            if self.indices[other_id].replica_id == index.replica_id:
                own = True
            else:
                other = True
        return other, own

    def adds_zone_clash(self, index_id: int, node_id: int) -> bool:
        """Whether moving the index to ``node_id`` puts its replica in a zone another
        replica of the namespace occupies, without taking it out of one: the number of
        replicas sharing a zone would grow."""
        zone = self.nodes[node_id].zone
        other, own = self.zone_company(index_id, zone)
        if not other or own:
            return False  # a free zone, or its replica is there already
        source = self.nodes[self.where[index_id]].zone
        left_other, left_own = self.zone_company(index_id, source)
        # It leaves a shared zone for good: one clash for another.
        return not (left_other and not left_own)

    def budget(self, node_id: int) -> int | None:
        return self.nodes[node_id].memory_budget_bytes if self.memory else None

    def share(self, node_id: int, used: int | None = None, mem: int | None = None) -> float | None:
        """The node's dominant share (with ``used``/``mem`` in place of its own), or None
        without a disk size."""
        total = self.nodes[node_id].total_bytes
        if total <= 0:
            return None
        disk = (self.used[node_id] if used is None else used) / total
        budget = self.budget(node_id)
        if budget is None:
            return disk
        memory = (self.mem[node_id] if mem is None else mem) / budget
        return memory if memory > disk else disk

    def figures(self, node_id: int) -> NodeFigures:
        total = self.nodes[node_id].total_bytes
        budget = self.budget(node_id)
        return NodeFigures(
            used_bytes=self.used[node_id],
            memory_bytes=self.mem[node_id],
            index_count=len(self.on[node_id]),
            disk_share=self.used[node_id] / total if total > 0 else None,
            memory_share=self.mem[node_id] / budget if budget is not None else None,
            dominant_share=self.share(node_id),
        )

    def busiest(self) -> float | None:
        shares = [s for node_id in self.nodes if (s := self.share(node_id)) is not None]
        return max(shares) if shares else None

    def move(self, index_id: int, to: int) -> None:
        index = self.indices[index_id]
        source = self.where[index_id]
        self.used[source] -= index.used_bytes
        self.used[to] += index.used_bytes
        self.mem[source] -= index.estimated_memory_bytes
        self.mem[to] += index.estimated_memory_bytes
        self.on[source].discard(index_id)
        self.on[to].add(index_id)
        holders = self.holders[index.enabled_namespace_id]
        holders.discard(source)
        holders.add(to)
        self.where[index_id] = to

    def target_refusal(self, index_id: int, node_id: int) -> str | None:
        """Why ``node_id`` cannot take the index now (a stable code), or None: the first
        of ``target_refusals``."""
        return next(self.target_refusals(index_id, node_id), None)

    def target_refusals(self, index_id: int, node_id: int) -> Iterator[str]:
        """Every reason ``node_id`` cannot take the index now (stable codes), lazily: the
        placement rules, in ``eviction.moves.target_refusal``'s order and words."""
        index = self.indices[index_id]
        node = self.nodes[node_id]
        if self.where[index_id] == node_id:
            yield str(Reason.MOVE_TARGET_IS_SOURCE)
        if not node.receiving:
            yield node.not_receiving_reason or str(Reason.BALANCE_TARGET_NOT_RECEIVING)
        if node_id in self.holders[index.enabled_namespace_id]:
            yield str(Reason.MOVE_TARGET_HOLDS_NAMESPACE)
        if self.zoned is not None and self.adds_zone_clash(index_id, node_id):
            # Two replicas in one zone that were not: never a move of the balance's
            # (one already sharing its zone may move to another shared one).
            yield str(Reason.MOVE_TARGET_ZONE_HOLDS_REPLICA)
        if node.total_bytes <= 0:
            yield str(Reason.MOVE_TARGET_NO_DISK_ROOM)
        budget = self.budget(node_id)
        if budget is not None and (
            self.mem[node_id] + index.estimated_memory_bytes
            >= self.options.high_memory_watermark * budget
        ):
            yield str(Reason.MOVE_TARGET_NO_MEMORY_ROOM)
        if (
            node.total_bytes > 0
            and (self.used[node_id] + index.used_bytes) / node.total_bytes
            >= self.options.disk_ceiling
        ):
            yield str(Reason.MOVE_TARGET_NO_DISK_ROOM)


# --------------------------------------------------------------------------- #
# The search
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A qualifying move and its preference key (smaller is better)."""

    key: tuple
    index_id: int
    source: int
    target: int


def _after(fleet: _Fleet, index: BalanceIndex, node_id: int, sign: int) -> float:
    """The node's dominant share once the index leaves (``sign`` -1) or arrives (+1)."""
    share = fleet.share(
        node_id,
        fleet.used[node_id] + sign * index.used_bytes,
        fleet.mem[node_id] + sign * index.estimated_memory_bytes,
    )
    assert share is not None  # sources and targets have a disk size
    return share


def _best_from(
    fleet: _Fleet,
    source: int,
    source_share: float,
    allowed: Iterable[int],
    targets: Sequence[tuple[float, int]],
) -> _Candidate | None:
    """The preferred qualifying move of one of ``allowed`` (indices on ``source``).

    ``targets`` are the receiving nodes with their shares, lowest first. Key: the fall
    above the lower bound per byte, the fall per byte, the fall, the target's share after,
    index id, node id (largest first for the falls).
    """
    limit = source_share * (1 - fleet.options.margin)
    floor = fleet.floor
    best: _Candidate | None = None
    for index_id in sorted(allowed):
        index = fleet.indices[index_id]
        source_after = _after(fleet, index, source, -1)
        if source_after >= source_share:
            continue
        low: tuple[float, int] | None = None
        for target_share, node_id in targets:
            if target_share >= limit or (low is not None and target_share > low[0]):
                break  # the share only rises with the index: nothing later beats ``low``
            if node_id == source or fleet.target_refusal(index_id, node_id) is not None:
                continue
            target_after = _after(fleet, index, node_id, +1)
            if target_after < limit and (low is None or (target_after, node_id) < low):
                low = (target_after, node_id)
        if low is None:
            continue
        top = max(source_after, low[0])
        fall = source_share - top
        useful = max(0.0, source_share - max(top, floor))
        size = max(index.used_bytes, 1)
        key = (-_q(useful / size), -_q(fall / size), -_q(fall), low[0], index_id, low[1])
        if best is None or key < best.key:
            best = _Candidate(key, index_id, source, low[1])
    return best


def _next_move(fleet: _Fleet, allowed: Collection[int]) -> tuple[_Candidate, str] | None:
    """The move to make next among the ``allowed`` indices, and its reason: from the
    busiest node over the lower bound that has a qualifying one (ties by id)."""
    shares = sorted(
        (-s, node_id) for node_id in fleet.nodes if (s := fleet.share(node_id)) is not None
    )
    if not shares:
        return None
    targets = sorted(
        (-negative, node_id) for negative, node_id in shares if fleet.nodes[node_id].receiving
    )
    busiest = -shares[0][0]
    for negative, source in shares:
        if -negative <= fleet.floor:
            break  # at or under the lower bound: nothing to shed, here and after
        mine = [i for i in fleet.on[source] if i in allowed]
        if not mine:
            continue
        found = _best_from(fleet, source, -negative, mine, targets)
        if found is not None:
            reason = (
                Reason.REBALANCE_BUSIEST_NODE
                if -negative >= busiest
                else Reason.REBALANCE_NEXT_BUSIEST_NODE
            )
            return found, str(reason)
    return None


def _lower_bounds(fleet: _Fleet) -> tuple[float, float | None]:
    """(disk, memory) lower bounds over the nodes that may hold data: those with a disk
    size that may receive or hold some (bytes, or memory estimates). A node that may
    not receive only loses data, so a layout the moves lead to never has a lower bound
    below its start's: the rule the search ended by holds there too."""
    counted = [
        node_id
        for node_id, node in fleet.nodes.items()
        if node.total_bytes > 0
        and (node.receiving or fleet.used[node_id] > 0 or fleet.mem[node_id] > 0)
    ]
    total = sum(fleet.nodes[n].total_bytes for n in counted)
    disk = sum(fleet.used[n] for n in counted) / total if total else 0.0
    if not fleet.memory:
        return disk, None
    budgets = [fleet.nodes[n].memory_budget_bytes for n in counted]
    if not counted or any(b is None for b in budgets):
        return disk, 0.0
    return disk, sum(fleet.mem[n] for n in counted) / sum(budgets)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- #
# The sequence of moves, replayed
# --------------------------------------------------------------------------- #

#: One step: (index id, from node id, to node id).
Step = tuple[int, int, int]


def _index_refusals(fleet: _Fleet, index_id: int) -> Iterator[str]:
    """Every reason the index may not move anywhere now (stable codes), lazily: the rules
    about the index and its node. It moves only when it may (``movable``, an enabled
    namespace), its node has a disk share over the lower bound, and leaving lowers it."""
    index = fleet.indices[index_id]
    if index.enabled_namespace_id is None:
        yield str(Reason.BALANCE_INDEX_ORPHANED)
    if not index.movable:
        yield from index.pinned_by or (str(Reason.BALANCE_INDEX_PINNED),)
    source = fleet.where[index_id]
    source_share = fleet.share(source)
    if source_share is None:
        yield str(Reason.BALANCE_SOURCE_NO_DISK_SIZE)
        return
    if source_share <= fleet.floor:
        yield str(Reason.BALANCE_SOURCE_AT_LOWER_BOUND)
    if _after(fleet, index, source, -1) >= source_share:
        yield str(Reason.BALANCE_SOURCE_DOES_NOT_FALL)


def _margin_refusals(fleet: _Fleet, index_id: int, target: int) -> Iterator[str]:
    """The margin: the target's dominant share with the index must stay more than the
    margin below the source's before the move (where both have a disk size)."""
    source_share = fleet.share(fleet.where[index_id])
    if source_share is None or fleet.nodes[target].total_bytes <= 0:
        return
    target_after = _after(fleet, fleet.indices[index_id], target, +1)
    if target_after >= source_share * (1 - fleet.options.margin):
        yield str(Reason.BALANCE_MARGIN_NOT_MET)


def _move_refusals(fleet: _Fleet, index_id: int, target: int) -> Iterator[str]:
    """Every reason moving the index from where it is to ``target`` is not allowed, or
    does not qualify, in this layout: the index's rules, the target's, the margin."""
    yield from _index_refusals(fleet, index_id)
    yield from fleet.target_refusals(index_id, target)
    yield from _margin_refusals(fleet, index_id, target)


def _judge(fleet: _Fleet, index_id: int, target: int) -> tuple[float, float, float] | None:
    """(source before, source after, target after) when moving the index from where it
    is to ``target`` is allowed and qualifies (``_move_refusals`` says nothing); None
    otherwise."""
    if next(_move_refusals(fleet, index_id, target), None) is not None:
        return None
    index = fleet.indices[index_id]
    source = fleet.where[index_id]
    source_share = fleet.share(source)
    assert source_share is not None  # the source rules refuse a node without a disk size
    return source_share, _after(fleet, index, source, -1), _after(fleet, index, target, +1)


def _replay(
    nodes: Mapping[int, BalanceNode],
    indices: Mapping[int, BalanceIndex],
    options: BalanceOptions,
    floor: float,
    steps: Sequence[Step],
) -> tuple[_Fleet, list[PlannedMove], list[Step]]:
    """Apply ``steps`` from the current layout, each judged at its turn (the index on its
    node, the target allowed, the move qualifying); a step that is not is left out.
    Returns the layout reached, the moves with their figures, and the steps kept."""
    fleet = _Fleet(nodes, indices, options, floor)
    moves: list[PlannedMove] = []
    kept: list[Step] = []
    for index_id, source, target in steps:
        judged = _judge(fleet, index_id, target) if fleet.where[index_id] == source else None
        if judged is None:
            continue
        source_before, source_after, target_after = judged
        index = indices[index_id]
        busiest = fleet.busiest()
        assert busiest is not None  # the source has a share
        target_before = fleet.share(target)
        assert target_before is not None  # a target has a disk size
        fleet.move(index_id, target)
        reason = (
            Reason.REBALANCE_BUSIEST_NODE
            if source_before >= busiest
            else Reason.REBALANCE_NEXT_BUSIEST_NODE
        )
        kept.append((index_id, source, target))
        moves.append(
            PlannedMove(
                index_id=index_id,
                enabled_namespace_id=index.enabled_namespace_id,
                from_node_id=source,
                to_node_id=target,
                bytes=index.used_bytes,
                memory_bytes=index.estimated_memory_bytes,
                reason=str(reason),
                busiest_before=busiest,
                busiest_after=fleet.busiest(),  # type: ignore[arg-type]
                source_before=source_before,
                source_after=source_after,
                target_before=target_before,
                target_after=target_after,
            )
        )
    return fleet, moves, kept


def _potential(fleet: _Fleet) -> list[float]:
    """The nodes' dominant shares, busiest first: every accepted step makes it smaller
    (lexicographically), so the search cannot run in circles."""
    return sorted(
        (s for node_id in fleet.nodes if (s := fleet.share(node_id)) is not None), reverse=True
    )


# --------------------------------------------------------------------------- #
# The desired balance
# --------------------------------------------------------------------------- #


@dataclass
class _Search:
    """The search's state: the steps so far and the layout they lead to."""

    nodes: Mapping[int, BalanceNode]
    indices: Mapping[int, BalanceIndex]
    options: BalanceOptions
    fleet: _Fleet
    steps: list[Step] = field(default_factory=list)
    #: Moved indices whose next move does not fold into a better layout: left where
    #: the plan put them.
    held: set[int] = field(default_factory=set)
    movable: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        self.movable = frozenset(_movable(self.indices))

    def full(self) -> bool:
        return self.options.max_moves is not None and len(self.steps) >= self.options.max_moves

    def advance(self) -> bool:
        """Move an index not moved yet; False when none qualifies (or the cap is reached)."""
        if self.full():
            return False
        moved = {step[0] for step in self.steps}
        found = _next_move(self.fleet, self.movable - moved)
        if found is None:
            return False
        candidate = found[0]
        self.fleet.move(candidate.index_id, candidate.target)
        self.steps.append((candidate.index_id, candidate.source, candidate.target))
        return True

    def step(self) -> bool:
        """Make the next move, or fold a moved index's next one; False when nothing
        qualifies (or the cap is reached)."""
        if self.advance():
            self.held.clear()
            return True
        if self.full():
            return False
        moved = {step[0] for step in self.steps}
        while (found := _next_move(self.fleet, moved - self.held)) is not None:
            if self.fold(found[0]):
                self.held.clear()
                return True
            self.held.add(found[0].index_id)
        return False

    def fold(self, candidate: _Candidate) -> bool:
        """A moved index qualifies to move on (B to C): plan it from its own node A to C
        instead (nowhere, when C is A). The steps that relied on it being at B and no
        longer qualify are left out, and the indices they moved may move again. Taken
        only when the layout then reached is better: False leaves the plan as it was."""
        index_id = candidate.index_id
        origin = self.indices[index_id].node_id
        rest = [step for step in self.steps if step[0] != index_id]
        fleet, _moves, kept = _replay(
            self.nodes, self.indices, self.options, self.fleet.floor, rest
        )
        if candidate.target != origin and _judge(fleet, index_id, candidate.target) is not None:
            fleet.move(index_id, candidate.target)
            kept.append((index_id, origin, candidate.target))
        trial = _Search(self.nodes, self.indices, self.options, fleet, kept)
        while trial.advance():
            pass
        if _potential(trial.fleet) >= _potential(self.fleet):
            return False
        self.fleet, self.steps = trial.fleet, trial.steps
        return True


def desired_balance(
    nodes: Iterable[BalanceNode],
    indices: Iterable[BalanceIndex],
    options: BalanceOptions | None = None,
    *,
    progress: Callable[[int], None] | None = None,
) -> Balance:
    """The layout the fleet should converge to and the moves that get it there.

    ``progress``, when given, is called with the number of moves planned so far after
    each step of the search (for a command's progress line)."""
    options = options or BalanceOptions()
    node_list = sorted(nodes, key=lambda node: node.id)
    index_list = sorted(indices, key=lambda index: index.id)
    _check(node_list, index_list, options)
    by_node = {node.id: node for node in node_list}
    by_index = {index.id: index for index in index_list}
    now = _Fleet(by_node, by_index, options)
    disk_bound, memory_bound = _lower_bounds(now)
    bound = max(disk_bound, memory_bound or 0.0)
    search = _Search(by_node, by_index, options, _Fleet(by_node, by_index, options, bound))
    while search.step():
        if progress is not None:
            progress(len(search.steps))
    complete = not search.full() or _next_move(search.fleet, search.movable) is None
    desired, moves, kept = _replay(by_node, by_index, options, bound, search.steps)
    assert kept == search.steps  # every accepted step replays as it was judged
    return Balance(
        options=options,
        layout=dict(sorted(desired.where.items())),
        moves=tuple(moves),
        nodes=tuple(
            NodeBalance(
                node_id=node.id,
                name=node.name,
                receiving=node.receiving,
                now=now.figures(node.id),
                desired=desired.figures(node.id),
            )
            for node in node_list
        ),
        misplaced=tuple(sorted(move.index_id for move in moves)),
        bytes_to_move=sum(move.bytes for move in moves),
        memory_bytes_to_move=sum(move.memory_bytes for move in moves),
        disk_lower_bound=disk_bound,
        memory_lower_bound=memory_bound,
        lower_bound=bound,
        busiest_now=now.busiest(),
        busiest_desired=desired.busiest(),
        complete=complete,
        held_back=tuple(sorted(search.held)),
    )


def _movable(indices: Mapping[int, BalanceIndex]) -> set[int]:
    return {
        index_id
        for index_id, index in indices.items()
        if index.movable and index.enabled_namespace_id is not None
    }


def relocated(
    nodes: Iterable[BalanceNode], indices: Iterable[BalanceIndex], layout: Mapping[int, int]
) -> tuple[list[BalanceNode], list[BalanceIndex]]:
    """The fleet with its indices where ``layout`` puts them (the nodes' used bytes moved
    with them): the input of the desired layout's own balance, or of a what-if."""
    node_list = list(nodes)
    index_list = list(indices)
    delta = {node.id: 0 for node in node_list}
    moved = []
    for index in index_list:
        to = layout.get(index.id, index.node_id)
        if to != index.node_id:
            delta[index.node_id] -= index.used_bytes
            delta[to] += index.used_bytes
            index = replace(index, node_id=to)
        moved.append(index)
    return [replace(node, used_bytes=node.used_bytes + delta[node.id]) for node in node_list], moved


# --------------------------------------------------------------------------- #
# The explain of one index
# --------------------------------------------------------------------------- #

YES = "yes"
NO = "no"


@dataclass(frozen=True, slots=True)
class NodeDecision:
    """Whether the index could move to one other node now, and every rule refusing it."""

    node_id: int
    name: str
    #: ``yes``: the move is allowed and qualifies now; ``no``: ``refusals`` say why.
    decision: str
    refusals: tuple[str, ...]
    #: The node's dominant share now, and with the index added (None: no disk size).
    share_now: float | None
    share_with: float | None
    #: The node the desired balance puts the index on.
    desired: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "name": self.name,
            "decision": self.decision,
            "refusals": list(self.refusals),
            "share_now": _round(self.share_now),
            "share_with": _round(self.share_with),
            "desired": self.desired,
        }


@dataclass(frozen=True, slots=True)
class IndexExplain:
    """One index in the desired balance (``explain_indices``): where it is, where the
    desired balance wants it and why, and for every other node whether it could go there
    now and why not (Elasticsearch's ``_cluster/allocation/explain``)."""

    index_id: int
    enabled_namespace_id: int | None
    replica_id: int | None
    bytes: int
    memory_bytes: int
    node_id: int
    node_name: str
    #: Its node's dominant share now, and once the index left (None: no disk size).
    node_share: float | None
    node_share_without: float | None
    lower_bound: float
    margin: float
    #: The reasons it may move to no node now (the index's and its node's rules).
    index_refusals: tuple[str, ...]
    desired_node_id: int
    desired_node_name: str
    #: Its move in the desired balance (None: it stays), that move's place in the
    #: plan (1 is the first) and the plan's length.
    move: PlannedMove | None
    move_order: int | None
    moves_planned: int
    #: Moved by the plan, and would move on once there (``Balance.held_back``).
    held_back: bool
    #: Why it stays (None when it moves): the first of ``index_refusals``, else
    #: ``balance_no_target_qualifies``, ``balance_plan_capped`` or
    #: ``balance_other_moves_preferred``.
    stays_reason: str | None
    #: Every other node, by id.
    nodes: tuple[NodeDecision, ...]

    @property
    def candidates(self) -> tuple[int, ...]:
        """The nodes it could move to now."""
        return tuple(entry.node_id for entry in self.nodes if entry.decision == YES)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index_id": self.index_id,
            "enabled_namespace_id": self.enabled_namespace_id,
            "replica_id": self.replica_id,
            "bytes": self.bytes,
            "memory_bytes": self.memory_bytes,
            "node_id": self.node_id,
            "node_name": self.node_name,
            "node_share": _round(self.node_share),
            "node_share_without": _round(self.node_share_without),
            "lower_bound": _round(self.lower_bound),
            "margin": self.margin,
            "index_refusals": list(self.index_refusals),
            "desired_node_id": self.desired_node_id,
            "desired_node_name": self.desired_node_name,
            "stays": self.move is None,
            "stays_reason": self.stays_reason,
            "move": None if self.move is None else self.move.as_dict(),
            "move_order": self.move_order,
            "moves_planned": self.moves_planned,
            "held_back": self.held_back,
            "candidate_node_ids": list(self.candidates),
            "nodes": [entry.as_dict() for entry in self.nodes],
        }


def explain_indices(
    nodes: Iterable[BalanceNode],
    indices: Iterable[BalanceIndex],
    index_ids: Iterable[int],
    options: BalanceOptions | None = None,
    *,
    balance: Balance | None = None,
) -> list[IndexExplain]:
    """The explain of each of ``index_ids`` (in that order) in the fleet's desired balance.

    The per-node decisions are those of a move now, in the layout as it is, by the rules
    the desired balance applies (``_move_refusals``: the index's, the target's placement
    rules of ``_Fleet.target_refusals`` and the margin), every refusal listed; the
    desired node is where the plan puts it, judged at its turn (after the moves before
    it). ``balance``: the desired balance of this same input, when the caller has it."""
    options = options or BalanceOptions()
    node_list = sorted(nodes, key=lambda node: node.id)
    index_list = sorted(indices, key=lambda index: index.id)
    if balance is None:
        balance = desired_balance(node_list, index_list, options)
    else:
        _check(node_list, index_list, options)
    by_node = {node.id: node for node in node_list}
    by_index = {index.id: index for index in index_list}
    fleet = _Fleet(by_node, by_index, options, balance.lower_bound)
    order = {move.index_id: (k, move) for k, move in enumerate(balance.moves, 1)}
    out = []
    for k, index_id in enumerate(index_ids):
        if index_id not in by_index:
            raise BalanceError(f"index_ids[{k}]", f"index {index_id} is not given")
        out.append(_explain(fleet, balance, index_id, order.get(index_id)))
    return out


def explain_index(
    nodes: Iterable[BalanceNode],
    indices: Iterable[BalanceIndex],
    index_id: int,
    options: BalanceOptions | None = None,
    *,
    balance: Balance | None = None,
) -> IndexExplain:
    """The explain of one index (``explain_indices``)."""
    return explain_indices(nodes, indices, [index_id], options, balance=balance)[0]


def _explain(
    fleet: _Fleet, balance: Balance, index_id: int, planned: tuple[int, PlannedMove] | None
) -> IndexExplain:
    index = fleet.indices[index_id]
    source = index.node_id
    index_wide = tuple(_index_refusals(fleet, index_id))
    desired_node = balance.layout.get(index_id, source)
    decisions = tuple(
        _decision(fleet, index_id, node_id, desired_node)
        for node_id in fleet.nodes
        if node_id != source
    )
    source_share = fleet.share(source)
    if planned is not None:
        stays = None
    elif index_wide:
        stays = index_wide[0]
    elif not any(entry.decision == YES for entry in decisions):
        stays = str(Reason.BALANCE_NO_TARGET_QUALIFIES)
    elif not balance.complete:
        stays = str(Reason.BALANCE_PLAN_CAPPED)
    else:
        stays = str(Reason.BALANCE_OTHER_MOVES_PREFERRED)
    return IndexExplain(
        index_id=index_id,
        enabled_namespace_id=index.enabled_namespace_id,
        replica_id=index.replica_id,
        bytes=index.used_bytes,
        memory_bytes=index.estimated_memory_bytes,
        node_id=source,
        node_name=fleet.nodes[source].name,
        node_share=source_share,
        node_share_without=None if source_share is None else _after(fleet, index, source, -1),
        lower_bound=balance.lower_bound,
        margin=fleet.options.margin,
        index_refusals=index_wide,
        desired_node_id=desired_node,
        desired_node_name=fleet.nodes[desired_node].name,
        move=None if planned is None else planned[1],
        move_order=None if planned is None else planned[0],
        moves_planned=len(balance.moves),
        held_back=index_id in balance.held_back,
        stays_reason=stays,
        nodes=decisions,
    )


def _decision(fleet: _Fleet, index_id: int, node_id: int, desired: int) -> NodeDecision:
    """One other node: every reason the move there now is not allowed or does not
    qualify (``_move_refusals``, as the plan judges a move), or none: ``yes``."""
    refusals = tuple(_move_refusals(fleet, index_id, node_id))
    share_now = fleet.share(node_id)
    return NodeDecision(
        node_id=node_id,
        name=fleet.nodes[node_id].name,
        decision=NO if refusals else YES,
        refusals=refusals,
        share_now=share_now,
        share_with=None
        if share_now is None
        else _after(fleet, fleet.indices[index_id], node_id, +1),
        desired=node_id == desired,
    )
