"""The drain job: every index off a node being removed or replaced, by the move machinery.

A live ``remove`` or ``replace`` record (``NodeShutdown``, docs/operations.md)
is a drain. Once a minute (beat entry ``drain-nodes``) ``run_drains`` takes
each live drain through one pass, in one transaction that holds the record's
row lock (``SKIP LOCKED``: a second run at once passes over a record the
first holds, so the job is safe to run twice) and the node's row lock (as an
eviction decision does; lost-node handling and an operator's delete lock it
too). A pass:

1. **turns back** replacements still building *on* the node (a move started
   before the request, of any trigger): retired, and planned again at once
   for another node (``eviction.moves.turn_back``, ``move_target_shutting_down``).
   The node takes nothing new, and a replacement on it would only have to
   leave again. One past building (ready to swap, swapping) finishes; the
   drain moves it off afterwards.
2. **retires replicas that serve nothing** (``drain_replica_not_serving``): a
   not-yet-ready index on the node (pending, initializing) whose replica holds
   no ready index anywhere is not worth moving (a move needs a ready copy to
   build from, and the replica answers no search): its replica is evicted
   through the one replica-eviction path, and the rollout places it again on
   other nodes (the node is no candidate). No ready range loses a copy. A
   not-yet-ready index in a replica that does serve other ranges is left to
   finish indexing on the node, and is then moved like any other: evicting
   its replica would take the other ranges' copy away.
3. **completes** the record (``node_drained``) when the node holds no index
   row at all (the sources evicted by the swaps are deleted by GitLab's
   pipeline, on the node, first).
4. **starts moves**, trigger ``drain``, each carrying ``details.shutdown_id``,
   for the node's ready indices (in a replica, not already moving, not a live
   move's build replica) **biggest first** (``used_storage_bytes``
   descending, then id): the longest-processing-time order. A drain's length
   is set by its biggest moves (a 200 GiB index takes as long as a hundred
   2 GiB ones), so starting them first keeps them off the end of the critical
   path, and the node's disk empties fastest in bytes. Moves are created only
   as throttle slots free (``eviction.moves.try_start``: two building off one
   node, two onto one node, ten in the fleet): the first one that has to wait
   stays ``planned`` (``advance_moves`` starts it when a slot frees) and the
   pass stops; while it waits no other is created. So a drain holds the lease
   of only the namespaces it is moving, never of every namespace on the node.
5. **stalls** the record when some index has nowhere to go (no node passes
   ``choose_target``'s filters: ``drain_no_target``, the index ids in
   ``details.no_target_index_ids``) or a drain move was parked after its
   retries (``drain_move_parked``, ``details.parked_move_ids``; the drain does
   not retry it: an operator reads why, and may cancel and ask again). The
   other indices keep moving; the record is back ``in_progress`` on the first
   pass that finds nothing blocked.

For a ``replace``, each move is aimed at the named node
(``details.replace_target_node_id`` and ``planned_target_node_id``) and is
checked against ``choose_target``'s own filters each time it is about to
start; where the named node cannot take it, it falls back to the balanced
choice and records why (``eviction.moves._check_replace_target``).

Each move is the move machinery's: built on its target while the old copy
serves, swapped in only on a confirmed ready copy, crash safe step by step
(``eviction.moves``). A pass killed at any point leaves nothing: its
transaction rolls back, and the next pass does it again.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import datetime
from typing import Any

from django.db import transaction

from eviction import moves
from zoekt import actions, app_settings, capacity, clock, drains
from zoekt.logging import get_logger
from zoekt.models import Index, Move, Node, NodeShutdown
from zoekt.reasons import Reason

log = get_logger(__name__)

DRAIN = drains.DRAIN
Status = NodeShutdown.Status


@dataclasses.dataclass
class Pass:
    """What one pass over one drain found and did."""

    #: The pass looked for indices to move (False while one of its moves waits for a slot).
    evaluated: bool = False
    started: list[int] = dataclasses.field(default_factory=list)
    waiting: int | None = None
    no_target: list[int] = dataclasses.field(default_factory=list)
    already_moving: list[int] = dataclasses.field(default_factory=list)
    parked: list[int] = dataclasses.field(default_factory=list)
    turned_back: list[int] = dataclasses.field(default_factory=list)
    replicas_retired: list[int] = dataclasses.field(default_factory=list)


def run_drains(*, now: datetime | None = None) -> dict[str, Any]:
    """One pass over every live drain (remove or replace); returns the outcomes by code."""
    now = now or clock.now()
    ids = list(
        NodeShutdown.objects.live()
        .filter(type__in=NodeShutdown.DRAINS)
        .order_by("id")
        .values_list("id", flat=True)
    )
    outcomes: Counter = Counter()
    for shutdown_id in ids:
        outcomes[drain_node(shutdown_id, now=now)] += 1
    return {"live_drains": len(ids), "outcomes": dict(sorted(outcomes.items()))}


def drain_node(shutdown_id: int, *, now: datetime | None = None) -> str:
    """One pass over one drain, in one transaction; returns the record's status after it
    (or ``locked_or_settled`` when another run holds it or it is no longer live)."""
    now = now or clock.now()
    settings = app_settings.current()
    with transaction.atomic():
        record = (
            NodeShutdown.objects.live()
            .filter(pk=shutdown_id, type__in=NodeShutdown.DRAINS)
            .select_for_update(skip_locked=True)
            .first()
        )
        if record is None:
            return "locked_or_settled"
        node = (
            Node.objects.select_for_update().filter(pk=record.node_id).first()
            if record.node_id
            else None
        )
        if node is None:
            record.transition(Status.COMPLETE, now, status_reason=Reason.SHUTDOWN_NODE_DELETED)
            return str(Reason.SHUTDOWN_NODE_DELETED)
        done = Pass(turned_back=_turn_back_inbound(node, now), replicas_retired=_retire(node, now))
        if not Index.objects.filter(zoekt_node=node).exists():
            details = _details(record, done)
            details.pop("no_target_index_ids", None)
            record.transition(
                Status.COMPLETE, now, status_reason=Reason.NODE_DRAINED, details=details
            )
            outcome = str(Reason.NODE_DRAINED)
        else:
            _start_moves(record, node, done, settings, now)
            outcome = _settle_status(record, done, now)
    log.info(
        "drain_pass",
        shutdown_id=shutdown_id,
        node_id=record.node_ref,
        outcome=outcome,
        **{key: value for key, value in dataclasses.asdict(done).items() if value},
    )
    return outcome


def _turn_back_inbound(node: Node, now: datetime) -> list[int]:
    """Moves whose replacement still builds on the node: planned again for another node.
    A move another worker holds is passed over (the next pass turns it back)."""
    turned = []
    building = (
        Move.objects.filter(state=Move.State.BUILDING, target_node=node)
        .select_for_update(skip_locked=True)
        .order_by("id")
    )
    for move in building:
        moves.turn_back(move, Reason.MOVE_TARGET_SHUTTING_DOWN, now)
        turned.append(move.id)
    return turned


def _retire(node: Node, now: datetime) -> list[int]:
    """Replicas with a not-yet-ready index on the node and no ready index anywhere (not a
    live move's build replica): evicted, for the rollout to place elsewhere."""
    build = (
        Move.objects.live().exclude(replacement_replica_id=None).values("replacement_replica_id")
    )
    candidates = set(
        Index.objects.filter(
            zoekt_node=node, state__in=Index.PRE_READY_STATES, zoekt_replica__isnull=False
        )
        .exclude(zoekt_replica_id__in=build)
        .values_list("zoekt_replica_id", flat=True)
    )
    if not candidates:
        return []
    serving = set(
        Index.objects.filter(zoekt_replica_id__in=candidates, state=Index.State.READY).values_list(
            "zoekt_replica_id", flat=True
        )
    )
    retired = sorted(candidates - serving)
    if retired:
        actions.do_evict_replicas(retired, now=now)
    return retired


def _target_ceiling() -> float:
    """A target's disk stays under the high watermark less the hysteresis band, as for
    every move (it never starts its own sustain clock)."""
    high = capacity.watermark_limits(app_settings.development_watermarks())[1]
    return capacity.hysteresis_floor(high)


def _movable(node: Node, parked_sources: set[int]):
    """The node's indices a drain move may start for, biggest first (see the module)."""
    live = Move.objects.live()
    return (
        Index.objects.filter(
            zoekt_node=node,
            state=Index.State.READY,
            zoekt_replica__isnull=False,
            zoekt_enabled_namespace__isnull=False,
        )
        .exclude(id__in=live.values("source_index_ref"))
        .exclude(
            zoekt_replica_id__in=live.exclude(replacement_replica_id=None).values(
                "replacement_replica_id"
            )
        )
        .exclude(id__in=parked_sources)
        .order_by("-used_storage_bytes", "id")
    )


def _start_moves(
    record: NodeShutdown, node: Node, done: Pass, settings: app_settings.ZoektSettings, now
) -> None:
    """Start moves biggest first until one has to wait for a throttle slot (it stays
    planned); indices with nowhere to go are left serving and listed."""
    mine = drains.drain_moves(record)
    parked = dict(
        mine.filter(
            state=Move.State.PARKED,
            source_index_ref__in=Index.objects.filter(zoekt_node=node).values("id"),
        ).values_list("source_index_ref", "id")
    )
    done.parked = sorted(parked.values())
    waiting = mine.filter(state=Move.State.PLANNED).values_list("id", flat=True).first()
    if waiting is not None:
        done.waiting = waiting
        return
    done.evaluated = True
    base = {"shutdown_id": record.id, "critical": False, "target_ceiling": _target_ceiling()}
    if record.type == NodeShutdown.Type.REPLACE and record.target_node_id is not None:
        base["replace_target_node_id"] = base["planned_target_node_id"] = record.target_node_id
    # Fetched a chunk at a time: a pass usually stops at the throttle after a few.
    for index in _movable(node, set(parked)).iterator(chunk_size=50):
        if moves.start_and_tally(index, DRAIN, dict(base), done, settings=settings, now=now):
            return


def _details(record: NodeShutdown, done: Pass) -> dict[str, Any]:
    """The record's details after a pass: what it turned back and retired (kept across
    passes), and what blocks it now."""
    details = dict(record.details)
    for key, ids in (
        ("moves_turned_back", done.turned_back),
        ("replicas_retired", done.replicas_retired),
    ):
        if ids:
            details[key] = sorted({*details.get(key, []), *ids})
    if done.evaluated:
        details["no_target_index_ids"] = done.no_target
    details["parked_move_ids"] = done.parked
    return {key: value for key, value in details.items() if value != []}


def _settle_status(record: NodeShutdown, done: Pass, now: datetime) -> str:
    """Stalled while something has nowhere to go or a move of it is parked; in progress
    again once nothing is blocked. Writes only what changed."""
    details = _details(record, done)
    if details.get("no_target_index_ids"):
        blocked = Reason.DRAIN_NO_TARGET
    elif details.get("parked_move_ids"):
        blocked = Reason.DRAIN_MOVE_PARKED
    else:
        blocked = None
    if blocked is not None and record.status != Status.STALLED:
        record.transition(Status.STALLED, now, status_reason=str(blocked), details=details)
    elif blocked is None and record.status == Status.STALLED:
        record.transition(Status.IN_PROGRESS, now, status_reason="", details=details)
    elif details != record.details or (blocked and record.status_reason != blocked):
        record.details = details
        record.status_reason = str(blocked or "")
        record.save(update_fields=["details", "status_reason", "updated_at"])
    return record.status
