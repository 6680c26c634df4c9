"""Memory-pressure moves: a node whose webserver stays over its memory budget's high
watermark moves its hottest namespace that another node can take, whole, with a move.

Off until ``zoekt_memory_pressure_moves`` is on; it needs memory planning
(``zoekt_node_memory_budget_bytes``) and moves. The policy is pure
(``eviction.memory_policy.decide``: plain rows in, one ``Choice`` per node over
the watermark out, each with its reason); ``run_memory_pressure``, here, is the
database edge (``eviction.actions``
style: read, decide, then one transaction per node that starts the move).

The rules, per online search node with a memory budget and a reported RSS:

* **the clock**: ``zoekt_nodes.memory_high_watermark_exceeded_at`` is set when
  RSS ÷ budget reaches the high memory watermark (75 %) and cleared below the
  high watermark less the hysteresis band (70 %), as the disk clock is; the
  job (every 5 minutes) keeps it;
* **when**: after the node stayed over high for the sustain period
  (``zoekt_eviction_sustain_period``, 8 h), or at once over critical (85 %);
  never while the node is cooling down after an eviction, and never while a
  move off it is live (one at a time: its relief is counted before the next);
* **what**: the node's ready indices, hottest first by the control plane's
  estimate (repository bytes in the index's range × ``memory_ratio``, the
  planner's figure), leaving out what is moving and any namespace that moved
  in the last 24 hours (no namespace moves twice in a day); the hottest, or
  else one whose departure alone brings the node under the high watermark,
  that a target accepts: the hot one goes, never a train of small ones that
  each relieve nothing;
* **where**: an online search node holding no index of the namespace, not
  cooling down, whose memory after taking it, ``max(estimate, RSS) +`` the
  index's estimate, stays under the high watermark less the hysteresis band
  of its budget (the move would not start its own clock), and whose disk,
  used plus inbound plus the index's bytes, stays under 70 %; the one left
  with the most memory headroom. An index no node can take whole is left
  where it is (``memory_pressure_no_target``): splitting it is
  ``manage.py zoekt_move --resplit``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from eviction.memory_policy import (
    COOLING,
    CRITICAL,
    IN_FLIGHT,
    MEMORY_PRESSURE,
    MOVED_RECENTLY_SECONDS,
    NO_TARGET,
    NOT_SUSTAINED,
    SUSTAINED,
    Choice,
    MemoryIndex,
    MemoryNode,
    clock_update,
    decide,
)
from zoekt import memory

__all__ = [
    "COOLING",
    "CRITICAL",
    "IN_FLIGHT",
    "MEMORY_PRESSURE",
    "MOVED_RECENTLY_SECONDS",
    "NOT_SUSTAINED",
    "NO_TARGET",
    "SUSTAINED",
    "Choice",
    "MemoryIndex",
    "MemoryNode",
    "clock_update",
    "decide",
    "run_memory_pressure",
]


# --------------------------------------------------------------------------- #
# The database edge
# --------------------------------------------------------------------------- #


def run_memory_pressure(*, now: datetime | None = None) -> dict[str, Any]:
    """Keep every node's memory clock, decide, and start the chosen moves (idempotent: a
    second run finds the moves live and the nodes ``memory_pressure_move_in_flight``)."""
    from django.db.models import Q

    from eviction import moves
    from zoekt import app_settings, clock
    from zoekt.models import Index, Move, Node

    now = now or clock.now()
    settings = app_settings.current()
    configured = settings.node_memory_budget_bytes
    if not (settings.memory_pressure_moves and settings.eviction_moves) or configured is None:
        return {"skipped": "memory_pressure_moves_off"}
    rows = list(Node.objects.for_search().online(now).not_in_shutdown(now))
    ids = [node.id for node in rows]
    estimates = memory.estimated_memory_by_node(ids, settings.memory_ratio)
    inbound_bytes = moves.live_bytes_by_node("target_node_id")
    moving_out = set(moves.live_bytes_by_node("source_node_id"))
    inbound_estimates: dict[int, int] = {}
    for target, details in Move.objects.live().values_list("target_node_id", "details"):
        if target is not None:
            estimate = int((details or {}).get("estimate_bytes", 0))
            inbound_estimates[target] = inbound_estimates.get(target, 0) + estimate
    nodes = []
    for node in rows:
        metadata = node.metadata or {}
        budget, _source = memory.memory_budget(metadata, configured)
        rss = memory.webserver_counter(metadata, "rss_bytes")
        since = clock_update(
            memory.memory_percent_used(rss, budget), node.memory_high_watermark_exceeded_at, now
        )
        if since != node.memory_high_watermark_exceeded_at:
            Node.objects.filter(id=node.id).update(memory_high_watermark_exceeded_at=since)
        nodes.append(
            MemoryNode(
                id=node.id,
                name=node.name,
                budget_bytes=budget,
                rss_bytes=rss,
                estimated_bytes=estimates.get(node.id, 0),
                over_high_since=since,
                cooling_until=node.eviction_cooldown_until,
                total_bytes=node.total_bytes,
                used_bytes=node.used_bytes,
                inbound_bytes=inbound_bytes.get(node.id, 0),
                inbound_estimate_bytes=inbound_estimates.get(node.id, 0),
                moving_out=node.id in moving_out,
                zone=node.zone,
            )
        )
    pressed = [n.id for n in nodes if (n.percent or 0) >= memory.MEMORY_WATERMARK_LIMIT_HIGH]
    if not pressed:
        return {"nodes": len(nodes), "over_high": 0, "moves_started": []}
    candidates = list(
        Index.objects.filter(
            zoekt_node_id__in=pressed, state=Index.State.READY, zoekt_replica__isnull=False
        ).values_list(
            "id",
            "zoekt_node_id",
            "zoekt_enabled_namespace_id",
            "used_storage_bytes",
            "zoekt_replica_id",
        )
    )
    sizes = memory.repository_bytes_by_index([row[0] for row in candidates])
    recently = set(
        Move.objects.filter(
            Q(state__in=Move.LIVE) | Q(done_at__gte=now - timedelta(seconds=MOVED_RECENTLY_SECONDS))
        ).values_list("zoekt_enabled_namespace_id", flat=True)
    )
    indices = [
        MemoryIndex(
            index_id=index_id,
            node_id=node_id,
            enabled_namespace_id=enabled_id,
            estimate_bytes=memory.estimate_memory_bytes(
                sizes.get(index_id, 0), settings.memory_ratio
            ),
            used_bytes=used or 0,
            excluded=enabled_id in recently,
            replica_id=replica_id,
        )
        for index_id, node_id, enabled_id, used, replica_id in candidates
    ]
    holding: dict[int, set[int]] = {}
    replica_zones: dict[int, list[tuple[int | None, str]]] = {}
    for enabled_id, node_id, replica_id, zone in Index.objects.filter(
        zoekt_enabled_namespace_id__in={i.enabled_namespace_id for i in indices}
    ).values_list(
        "zoekt_enabled_namespace_id", "zoekt_node_id", "zoekt_replica_id", "zoekt_node__zone"
    ):
        holding.setdefault(enabled_id, set()).add(node_id)
        if zone is not None:
            replica_zones.setdefault(enabled_id, []).append((replica_id, zone))
    choices = decide(
        nodes,
        indices,
        holding=holding,
        replica_zones=replica_zones,
        sustain_seconds=settings.eviction_sustain_seconds,
        now=now,
    )
    started = []
    for choice in choices:
        if not choice.moves:
            continue
        move = moves.start_planned_move(
            choice.index_id,
            trigger=MEMORY_PRESSURE,
            target_node_id=choice.target_node_id,
            details={**choice.details, "memory_reason": choice.reason},
            settings=settings,
            now=now,
        )
        if move is not None:
            started.append(move.id)
    return {
        "nodes": len(nodes),
        "over_high": len(pressed),
        "choices": [
            {"node_id": c.node_id, "reason": c.reason, "index_id": c.index_id} for c in choices
        ],
        "moves_started": started,
    }
