"""The memory-pressure rule, pure: plain rows in, one ``Choice`` per node over the
high memory watermark out, each with its reason (``eviction.memory_pressure``
holds the rules in words and the database edge that feeds this).

Importing it loads no Django, DRF or Celery module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from planner.filters import node_score
from planner.scenario import DISK, MEMORY
from zoekt import capacity

MEMORY_PRESSURE = "memory_pressure"
#: A namespace that moved in this window is not chosen again.
MOVED_RECENTLY_SECONDS = 24 * 3600

SUSTAINED = "memory_pressure_sustained"
CRITICAL = "memory_pressure_critical"
NOT_SUSTAINED = "memory_pressure_not_sustained"
COOLING = "memory_pressure_node_cooling_down"
IN_FLIGHT = "memory_pressure_move_in_flight"
NO_TARGET = "memory_pressure_no_target"


@dataclass(frozen=True)
class MemoryNode:
    id: int
    name: str | None
    budget_bytes: int | None
    rss_bytes: int | None
    #: The control plane's estimate of the indices it holds (and is building).
    estimated_bytes: int
    over_high_since: datetime | None
    cooling_until: datetime | None
    total_bytes: int
    used_bytes: int
    #: Bytes of live moves heading to it (disk), and their estimates (memory).
    inbound_bytes: int = 0
    inbound_estimate_bytes: int = 0
    #: A live move leaves it.
    moving_out: bool = False
    #: Its failure domain, or None.
    zone: str | None = None

    @property
    def percent(self) -> float | None:
        return capacity.memory_percent_used(self.rss_bytes, self.budget_bytes)


@dataclass(frozen=True)
class MemoryIndex:
    index_id: int
    node_id: int
    enabled_namespace_id: int
    estimate_bytes: int
    used_bytes: int
    #: It is a live move's source, or its namespace moved in the last 24 h.
    excluded: bool = False
    replica_id: int | None = None


@dataclass
class Choice:
    node_id: int
    reason: str
    index_id: int | None = None
    target_node_id: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def moves(self) -> bool:
        return self.index_id is not None


def clock_update(percent: float | None, since: datetime | None, now: datetime):
    """The memory sustain clock after a reading: set at high, cleared under the band."""
    _low, high, _critical = capacity.memory_watermark_limits()
    if percent is None:
        return since
    if percent >= high:
        return since or now
    if percent < capacity.hysteresis_floor(high):
        return None
    return since


def decide(
    nodes: Iterable[MemoryNode],
    indices: Iterable[MemoryIndex],
    *,
    holding: dict[int, set[int]],
    sustain_seconds: int,
    now: datetime,
    disk_ceiling: float = 0.70,
    replica_zones: dict[int, list[tuple[int | None, str]]] | None = None,
) -> list[Choice]:
    """One choice per node over the high memory watermark (pure).

    ``holding``: enabled namespace id → the node ids holding an index of it
    (any state: a row keeps its node's slot). ``replica_zones``: enabled namespace
    id → (replica id, zone) of each of its indices on a node with a zone; a target
    outside the zones of the index's other replicas is preferred."""
    _low, high, critical = capacity.memory_watermark_limits()
    band = capacity.hysteresis_floor(high)
    nodes = list(nodes)
    by_node: dict[int, list[MemoryIndex]] = {}
    for index in indices:
        by_node.setdefault(index.node_id, []).append(index)
    out: list[Choice] = []
    for node in sorted(nodes, key=lambda n: n.id):
        percent = node.percent
        if percent is None or percent < high:
            continue
        details = {"memory_percent_used": round(percent, 4), "budget_bytes": node.budget_bytes}
        at_critical = percent >= critical
        sustained = node.over_high_since is not None and now - node.over_high_since >= timedelta(
            seconds=sustain_seconds
        )
        if node.cooling_until is not None and node.cooling_until > now:
            out.append(Choice(node.id, COOLING, details=details))
            continue
        if node.moving_out:
            out.append(Choice(node.id, IN_FLIGHT, details=details))
            continue
        if not (sustained or at_critical):
            out.append(Choice(node.id, NOT_SUSTAINED, details=details))
            continue
        reason = CRITICAL if at_critical else SUSTAINED
        choice = None
        # What must leave to bring the node under high: only the hottest index, or one
        # whose departure alone does that, is worth a move (never a train of small ones).
        needed = (node.rss_bytes or 0) - high * node.budget_bytes
        ranked = sorted(
            (i for i in by_node.get(node.id, []) if not i.excluded and i.estimate_bytes > 0),
            key=lambda i: (-i.estimate_bytes, i.index_id),
        )
        for position, index in enumerate(ranked):
            if position > 0 and index.estimate_bytes < needed:
                break
            taken = {
                zone
                for replica_id, zone in (replica_zones or {}).get(index.enabled_namespace_id, ())
                if replica_id is not None and replica_id != index.replica_id
            }
            target = _target(
                index, nodes, holding, band=band, disk_ceiling=disk_ceiling, now=now, taken=taken
            )
            if target is not None:
                choice = Choice(
                    node.id,
                    reason,
                    index_id=index.index_id,
                    target_node_id=target[1],
                    details={
                        **details,
                        "estimate_bytes": index.estimate_bytes,
                        "target_memory_after": round(target[0], 4),
                    },
                )
                break
        out.append(choice or Choice(node.id, NO_TARGET, details=details))
    return out


def _target(
    index: MemoryIndex,
    nodes: list[MemoryNode],
    holding: dict[int, set[int]],
    *,
    band: float,
    disk_ceiling: float,
    now: datetime,
    taken: set[str] | frozenset[str] = frozenset(),
) -> tuple[float, int] | None:
    """(memory share after, node id) of the node that takes it and is then the least
    allocated (``planner.filters.node_score`` of disk and memory, the balanced
    placement's score; ties by id). A node outside the zones ``taken`` by the
    namespace's other replicas comes first (docs/planner.md, "Zones")."""
    zones_taken = taken
    taken = holding.get(index.enabled_namespace_id, set())
    best = None
    best_key: tuple[bool, float, int] | None = None
    for node in nodes:
        if node.id == index.node_id or node.id in taken or not node.budget_bytes:
            continue
        if node.cooling_until is not None and node.cooling_until > now:
            continue
        if node.total_bytes <= 0:
            continue
        held = max(node.estimated_bytes, node.rss_bytes or 0) + node.inbound_estimate_bytes
        after = (held + index.estimate_bytes) / node.budget_bytes
        disk = (node.used_bytes + node.inbound_bytes + index.used_bytes) / node.total_bytes
        if after >= band or disk >= disk_ceiling:
            continue
        score = node_score(
            {
                DISK: node.total_bytes - node.used_bytes - node.inbound_bytes - index.used_bytes,
                MEMORY: node.budget_bytes - held - index.estimate_bytes,
            },
            {DISK: node.total_bytes, MEMORY: node.budget_bytes},
        )
        key = (node.zone is None or node.zone not in zones_taken, score, -node.id)
        if best_key is None or key > best_key:
            best_key = key
            best = (after, node.id)
    return best
