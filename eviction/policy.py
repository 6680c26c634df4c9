"""What to evict from which node, and why: a pure function of plain data.

Node snapshots, index rows, the policy's settings and the clock's *now* go
in; a list of ``Decision`` comes out, one per node considered, applied or
skipped, each with its trigger, its mode, a reason code, the indices chosen
with their bytes, and the disk use projected after it. No Django, no
database, no clock: ``eviction.actions`` reads the database into these
shapes and carries the decisions out, and the tests call this directly.

Three triggers (GitLab's three eviction paths, reference 6.5 and
``eviction-and-moves.md`` a.2–a.4):

* ``node_level`` (a): a node over the high disk watermark;
* ``index_watermark`` (b): indices over their critical watermark (used ÷
  reserved ≥ 0.80);
* ``negative_unclaimed`` (c): a node whose reservations exceed its usable
  storage.

Two modes: ``safeguards`` (docs/eviction.md) and ``legacy`` (GitLab's
behaviour before its MRs 264628 and 266206, kept for comparison). A
decision names what to take off the node; how it is taken off (today:
delete the replica that holds the index; with moves: build it elsewhere
first) is ``eviction.actions``' business, so the policy does not change when
the step does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from planner.filters import share_left, storage_capacity
from zoekt.reasons import Reason

NODE_LEVEL = "node_level"
INDEX_WATERMARK = "index_watermark"
NEGATIVE_UNCLAIMED = "negative_unclaimed"
TRIGGERS = (NODE_LEVEL, INDEX_WATERMARK, NEGATIVE_UNCLAIMED)

SAFEGUARDS = "safeguards"
LEGACY = "legacy"

SMALLEST_USED_FIRST = "smallest_used_first"
LARGEST_THAT_FITS = "largest_that_fits"
ORDERS = (SMALLEST_USED_FIRST, LARGEST_THAT_FITS)

#: GitLab's index states by name (``zoekt_indices.state``).
READY = "ready"
#: The states an index of GitLab's eviction or deletion pipeline is in.
ON_ITS_WAY_OUT = frozenset({"pending_eviction", "evicted", "orphaned", "pending_deletion"})


@dataclass(frozen=True, slots=True)
class NodeState:
    id: int
    name: str
    total_bytes: int
    used_bytes: int
    #: When disk use reached the high watermark and stayed (the sustain clock).
    high_watermark_exceeded_at: datetime | None = None
    #: No eviction from the node before this.
    cooldown_until: datetime | None = None
    #: usable − reserved (negative: over-committed).
    unclaimed_storage_bytes: int = 0

    @property
    def percent_used(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes > 0 else 0.0

    def cooling(self, now: datetime) -> bool:
        return self.cooldown_until is not None and self.cooldown_until > now


@dataclass(frozen=True, slots=True)
class IndexRow:
    id: int
    node_id: int
    #: The root namespace.
    namespace_id: int
    replica_id: int | None
    state: str
    used_storage_bytes: int
    reserved_storage_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Target:
    """A node an evicted index could go to (the planner's capacity view)."""

    id: int
    unclaimed_storage_bytes: int
    #: The node's disk size (``total_bytes``): what its room is scored against.
    total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    safeguards: bool = True
    sustain_seconds: int = 8 * 3600
    order: str = SMALLEST_USED_FIRST
    low: float = 0.60
    high: float = 0.75
    critical: float = 0.85
    #: ``used_storage_bytes`` of an index nobody has measured yet (GitLab's 1 KiB).
    placeholder_bytes: int = 1024
    #: What placing an index elsewhere reserves per used byte ("largest that fits").
    buffer_factor: float = 3.0

    @property
    def mode(self) -> str:
        return SAFEGUARDS if self.safeguards else LEGACY


@dataclass(frozen=True, slots=True)
class Chosen:
    index_id: int
    namespace_id: int
    replica_id: int | None
    used_storage_bytes: int
    reserved_storage_bytes: int = 0
    #: ``largest_that_fits``: the node whose room the re-placement was counted on.
    target_node_id: int | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    node_id: int
    node_name: str
    trigger: str
    mode: str
    reason: str
    #: Whether to carry it out (False: skipped, recorded with its reason).
    apply: bool
    used_bytes: int
    total_bytes: int
    chosen: tuple[Chosen, ...] = ()
    #: The node's disk use once the chosen indices are gone.
    projected_used_bytes: int | None = None
    #: Legacy node-level only: the root namespaces whose every replica goes.
    namespace_ids: tuple[int, ...] = ()
    details: Mapping[str, object] = field(default_factory=dict)

    @property
    def namespaces(self) -> tuple[int, ...]:
        """The root namespaces the decision affects, ascending."""
        if self.namespace_ids:
            return tuple(sorted(set(self.namespace_ids)))
        return tuple(sorted({c.namespace_id for c in self.chosen}))

    @property
    def chosen_bytes(self) -> int:
        return sum(c.used_storage_bytes for c in self.chosen)


def _skip(node: NodeState, trigger: str, mode: str, reason: str, **details) -> Decision:
    return Decision(
        node.id,
        node.name,
        trigger,
        mode,
        reason,
        False,
        node.used_bytes,
        node.total_bytes,
        details=details,
    )


# --------------------------------------------------------------------------- #
# (a) node level
# --------------------------------------------------------------------------- #


def node_level(
    nodes: Iterable[NodeState],
    indices: Iterable[IndexRow],
    policy: Policy,
    now: datetime,
    *,
    namespace_sizes: Mapping[int, int] | None = None,
    targets: Sequence[Target] = (),
) -> list[Decision]:
    """Decisions for the nodes at or over the high watermark (the others need none).

    ``namespace_sizes`` (legacy only): root namespace id → its root storage
    statistics' repository size, GitLab's sizing. ``targets`` (order
    ``largest_that_fits`` only): the nodes an index could be placed on.
    """
    by_node: dict[int, list[IndexRow]] = {}
    for row in indices:
        by_node.setdefault(row.node_id, []).append(row)
    out = []
    for node in sorted(nodes, key=lambda n: n.id):
        if node.percent_used < policy.high:
            continue
        rows = by_node.get(node.id, [])
        if policy.safeguards:
            out.append(_node_level_safeguarded(node, rows, policy, now, targets))
        else:
            out.append(_node_level_legacy(node, rows, policy, namespace_sizes or {}))
    return out


def _node_level_legacy(
    node: NodeState, rows: list[IndexRow], policy: Policy, sizes: Mapping[int, int]
) -> Decision:
    """GitLab's: the root namespaces on the node, smallest whole repository size first,
    until the node's used bytes less their sizes are under the low watermark; every
    replica of each goes."""
    namespace_ids = {row.namespace_id for row in rows}
    ordered = sorted(namespace_ids, key=lambda nid: (sizes.get(nid) or 0, nid))
    used = node.used_bytes
    chosen: list[int] = []
    for namespace_id in ordered:
        if node.total_bytes and used / node.total_bytes < policy.low:
            break
        used -= sizes.get(namespace_id) or 0
        chosen.append(namespace_id)
    if not chosen:
        return _skip(node, NODE_LEVEL, LEGACY, Reason.EVICTION_NOTHING_ELIGIBLE)
    picked = set(chosen)
    return Decision(
        node.id,
        node.name,
        NODE_LEVEL,
        LEGACY,
        Reason.EVICTION_OVER_HIGH_WATERMARK,
        True,
        node.used_bytes,
        node.total_bytes,
        chosen=tuple(
            Chosen(r.id, r.namespace_id, r.replica_id, r.used_storage_bytes)
            for r in sorted(rows, key=lambda r: r.id)
            if r.namespace_id in picked
        ),
        projected_used_bytes=used,
        namespace_ids=tuple(chosen),
        details={"sized_by": "root_storage_statistics.repository_size"},
    )


def _pressure(node: NodeState, policy: Policy, now: datetime) -> tuple[str | None, int | None]:
    """Whether the safeguards let a node be evicted from now, and how long it has been
    over the high watermark: ``critical`` at once, ``sustained`` after the sustain
    period, else None (a transient spike waits)."""
    over_seconds = (
        None
        if node.high_watermark_exceeded_at is None
        else max(0, int((now - node.high_watermark_exceeded_at).total_seconds()))
    )
    if node.percent_used >= policy.critical:
        return Reason.EVICTION_CRITICAL_WATERMARK, over_seconds
    if over_seconds is not None and over_seconds >= policy.sustain_seconds:
        return Reason.EVICTION_SUSTAINED_OVER_HIGH_WATERMARK, over_seconds
    return None, over_seconds


def _node_level_safeguarded(
    node: NodeState,
    rows: list[IndexRow],
    policy: Policy,
    now: datetime,
    targets: Sequence[Target],
) -> Decision:
    mode = SAFEGUARDS
    if node.cooling(now):
        return _skip(
            node,
            NODE_LEVEL,
            mode,
            Reason.EVICTION_NODE_COOLING_DOWN,
            cooldown_until=node.cooldown_until.isoformat(),
        )
    reason, over_seconds = _pressure(node, policy, now)
    if reason is None:
        return _skip(
            node,
            NODE_LEVEL,
            mode,
            Reason.EVICTION_SUSTAIN_NOT_REACHED,
            over_high_watermark_seconds=over_seconds or 0,
            sustain_seconds=policy.sustain_seconds,
        )
    chosen, projected, passed_over = choose_indices(node, rows, policy, targets)
    if not chosen:
        return _skip(
            node,
            NODE_LEVEL,
            mode,
            Reason.EVICTION_NOTHING_ELIGIBLE,
            over_high_watermark_seconds=over_seconds or 0,
            **passed_over,
        )
    return Decision(
        node.id,
        node.name,
        NODE_LEVEL,
        mode,
        reason,
        True,
        node.used_bytes,
        node.total_bytes,
        chosen=tuple(chosen),
        projected_used_bytes=projected,
        details={
            "over_high_watermark_seconds": over_seconds or 0,
            "order": policy.order,
            **passed_over,
        },
    )


def eligible(rows: Iterable[IndexRow], policy: Policy) -> list[IndexRow]:
    """Ready indices whose used bytes were measured (not the placeholder)."""
    return [r for r in rows if r.state == READY and r.used_storage_bytes > policy.placeholder_bytes]


def choose_indices(
    node: NodeState,
    rows: Iterable[IndexRow],
    policy: Policy,
    targets: Sequence[Target] = (),
) -> tuple[list[Chosen], int, dict[str, int]]:
    """Indices to take off ``node`` until its projected use is under the low watermark.

    Smallest ``used_storage_bytes`` first, or (``largest_that_fits``) the
    largest whose re-placement fits on another node, each target's room
    shrinking as indices are sent its way; among the targets with the room,
    the least allocated (``planner.filters.share_left``, the balanced
    placement's score; ties by id). Returns the chosen indices, the
    projected used bytes, and counts of what was passed over.
    """
    rows = list(rows)
    candidates = eligible(rows, policy)
    passed = {
        "not_ready": sum(1 for r in rows if r.state != READY),
        "placeholder_size": sum(
            1 for r in rows if r.state == READY and r.used_storage_bytes <= policy.placeholder_bytes
        ),
    }
    target = policy.low * node.total_bytes
    projected = node.used_bytes
    chosen: list[Chosen] = []
    if policy.order == LARGEST_THAT_FITS:
        room = {t.id: t.unclaimed_storage_bytes for t in targets if t.id != node.id}
        capacity = {
            t.id: storage_capacity(t.total_bytes, t.unclaimed_storage_bytes) for t in targets
        }
        candidates.sort(key=lambda r: (-r.used_storage_bytes, r.id))
        no_room = 0
        for row in candidates:
            if projected < target:
                break
            need = -(-row.used_storage_bytes * policy.buffer_factor // 1)
            fits = [tid for tid, left in room.items() if left >= need]
            if not fits:
                no_room += 1
                continue
            best = max(fits, key=lambda tid: (share_left(room[tid], capacity[tid]), -tid))
            room[best] -= need
            chosen.append(_chosen(row, best))
            projected -= row.used_storage_bytes
        passed["no_room_elsewhere"] = no_room
    else:
        candidates.sort(key=lambda r: (r.used_storage_bytes, r.id))
        for row in candidates:
            if projected < target:
                break
            chosen.append(_chosen(row))
            projected -= row.used_storage_bytes
    return chosen, projected, passed


def _chosen(row: IndexRow, target_node_id: int | None = None) -> Chosen:
    return Chosen(
        row.id,
        row.namespace_id,
        row.replica_id,
        row.used_storage_bytes,
        row.reserved_storage_bytes,
        target_node_id,
    )


# --------------------------------------------------------------------------- #
# (b) index watermark
# --------------------------------------------------------------------------- #


def index_watermark(
    nodes: Iterable[NodeState], critical: Iterable[IndexRow], policy: Policy, now: datetime
) -> list[Decision]:
    """Indices over their critical watermark, one decision per node holding some.

    Legacy (GitLab's): every such index not already on its way out. With the
    safeguards: only ready ones, and none on a cooling node.
    """
    by_node: dict[int, list[IndexRow]] = {}
    for row in critical:
        if row.state not in ON_ITS_WAY_OUT:
            by_node.setdefault(row.node_id, []).append(row)
    out = []
    for node in sorted(nodes, key=lambda n: n.id):
        rows = sorted(by_node.get(node.id, []), key=lambda r: r.id)
        if not rows:
            continue
        if policy.safeguards:
            if node.cooling(now):
                out.append(
                    _skip(
                        node,
                        INDEX_WATERMARK,
                        SAFEGUARDS,
                        Reason.EVICTION_NODE_COOLING_DOWN,
                        cooldown_until=node.cooldown_until.isoformat(),
                        critical_indices=len(rows),
                    )
                )
                continue
            ready = [r for r in rows if r.state == READY]
            if not ready:
                out.append(
                    _skip(
                        node,
                        INDEX_WATERMARK,
                        SAFEGUARDS,
                        Reason.EVICTION_NOTHING_ELIGIBLE,
                        critical_indices=len(rows),
                        not_ready=len(rows),
                    )
                )
                continue
            rows = ready
        chosen = tuple(_chosen(r) for r in rows)
        out.append(
            Decision(
                node.id,
                node.name,
                INDEX_WATERMARK,
                policy.mode,
                Reason.EVICTION_INDEX_CRITICAL_WATERMARK,
                True,
                node.used_bytes,
                node.total_bytes,
                chosen=chosen,
                projected_used_bytes=node.used_bytes - sum(c.used_storage_bytes for c in chosen),
            )
        )
    return out


# --------------------------------------------------------------------------- #
# (c) negative unclaimed storage
# --------------------------------------------------------------------------- #


def negative_unclaimed(
    nodes: Iterable[NodeState],
    indices: Iterable[IndexRow],
    policy: Policy,
    now: datetime,
    *,
    limit: int = 1_000,
) -> list[Decision]:
    """Nodes whose reservations exceed their usable storage.

    Legacy (GitLab's worker): the node's indices not already pending
    eviction, in id order, until their positive reservations cover the
    shortfall (at most ``limit``). With the safeguards (GitLab's MR 266206
    and ours): nodes under the high watermark, nodes over it for less than the
    sustain period (and under critical) and cooling nodes are skipped; among
    ready indices, the smallest whose reservation alone covers the
    shortfall, else the largest first until it is covered.
    """
    by_node: dict[int, list[IndexRow]] = {}
    for row in indices:
        by_node.setdefault(row.node_id, []).append(row)
    out = []
    for node in sorted(nodes, key=lambda n: n.id):
        if node.unclaimed_storage_bytes >= 0:
            continue
        rows = sorted(by_node.get(node.id, []), key=lambda r: r.id)
        out.append(_negative_unclaimed_node(node, rows, policy, now, limit))
    return out


def _negative_unclaimed_node(
    node: NodeState, rows: list[IndexRow], policy: Policy, now: datetime, limit: int
) -> Decision:
    """The decision for one node with negative unclaimed storage (``rows``: its
    indices in id order)."""
    shortfall = -node.unclaimed_storage_bytes
    pressure = None
    if not policy.safeguards:
        chosen, covered = _cover_in_id_order(rows, shortfall, limit)
    else:
        skip, pressure = _negative_unclaimed_waits(node, shortfall, policy, now)
        if skip is not None:
            return skip
        chosen, covered = _cover_from_ready(rows, shortfall, limit)
    if not chosen:
        return _skip(
            node,
            NEGATIVE_UNCLAIMED,
            policy.mode,
            Reason.EVICTION_NOTHING_ELIGIBLE,
            shortfall_bytes=shortfall,
        )
    return Decision(
        node.id,
        node.name,
        NEGATIVE_UNCLAIMED,
        policy.mode,
        Reason.EVICTION_NEGATIVE_UNCLAIMED_STORAGE,
        True,
        node.used_bytes,
        node.total_bytes,
        chosen=tuple(chosen),
        projected_used_bytes=node.used_bytes - sum(c.used_storage_bytes for c in chosen),
        details={
            "shortfall_bytes": shortfall,
            "reserved_bytes_covered": covered,
            **({"pressure": pressure} if pressure else {}),
        },
    )


def _cover_in_id_order(
    rows: list[IndexRow], shortfall: int, limit: int
) -> tuple[list[Chosen], int]:
    """Legacy: the indices not already pending eviction, in id order, until their
    positive reservations cover the shortfall (at most ``limit``)."""
    chosen: list[Chosen] = []
    covered = 0
    for row in rows:
        if row.state == "pending_eviction":
            continue
        if len(chosen) >= limit:
            break
        covered += max(row.reserved_storage_bytes, 0)
        chosen.append(_chosen(row))
        if covered >= shortfall:
            break
    return chosen, covered


def _negative_unclaimed_waits(
    node: NodeState, shortfall: int, policy: Policy, now: datetime
) -> tuple[Decision | None, str | None]:
    """With the safeguards: the skip of a node that waits (under the high
    watermark, cooling down, or over it for less than the sustain period), or
    ``None`` and the node's pressure."""
    if node.percent_used < policy.high:
        skip = _skip(
            node,
            NEGATIVE_UNCLAIMED,
            SAFEGUARDS,
            Reason.EVICTION_UNDER_HIGH_WATERMARK,
            shortfall_bytes=shortfall,
        )
        return skip, None
    if node.cooling(now):
        skip = _skip(
            node,
            NEGATIVE_UNCLAIMED,
            SAFEGUARDS,
            Reason.EVICTION_NODE_COOLING_DOWN,
            cooldown_until=node.cooldown_until.isoformat(),
            shortfall_bytes=shortfall,
        )
        return skip, None
    pressure, over_seconds = _pressure(node, policy, now)
    if pressure is None:
        # A shortfall that a transient spike caused (less free disk, the same
        # reservations) waits for the sustain period like node-level eviction.
        skip = _skip(
            node,
            NEGATIVE_UNCLAIMED,
            SAFEGUARDS,
            Reason.EVICTION_SUSTAIN_NOT_REACHED,
            over_high_watermark_seconds=over_seconds or 0,
            sustain_seconds=policy.sustain_seconds,
            shortfall_bytes=shortfall,
        )
        return skip, None
    return None, pressure


def _cover_from_ready(rows: list[IndexRow], shortfall: int, limit: int) -> tuple[list[Chosen], int]:
    """With the safeguards: among the ready indices, the smallest whose
    reservation alone covers the shortfall, else the largest first until it is
    covered (at most ``limit``)."""
    ready = [r for r in rows if r.state == READY]
    covering = [r for r in ready if r.reserved_storage_bytes >= shortfall]
    if covering:
        best = min(covering, key=lambda r: (r.reserved_storage_bytes, r.id))
        return [_chosen(best)], best.reserved_storage_bytes
    chosen: list[Chosen] = []
    covered = 0
    for row in sorted(ready, key=lambda r: (-r.reserved_storage_bytes, r.id)):
        if covered >= shortfall or len(chosen) >= limit:
            break
        covered += max(row.reserved_storage_bytes, 0)
        chosen.append(_chosen(row))
    return chosen, covered
