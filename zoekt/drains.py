"""A drain's moves and its progress, as the domain sees them.

A ``remove`` or ``replace`` record (``NodeShutdown``, docs/operations.md)
drains its node: the drain job (``eviction.drain``, every minute) starts a
move with the trigger ``drain`` for each index still on the node, biggest
first, as the move throttles free slots, and each such move carries the
record's id in ``details.shutdown_id``. The machinery that builds and swaps
them is the eviction package's; this module is the domain's side of it, since
nothing in ``zoekt`` imports ``eviction``:

* ``drain_progress``: what is left on the node, what this drain moved, how
  fast, and when it should be done (the API's and the CLI's ``drain`` object);
* ``wind_down``: a cancel in the middle, in the cancel's transaction. A move
  past building (``ready_to_swap``, ``swapping``) finishes: its replacement
  serves already. A ``planned`` one is cancelled, a ``building`` one is parked
  (``drain_cancelled``) through the one park path
  (``zoekt.actions.do_park_move``): its replacement is retired, the old copy
  never stopped serving.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q, Sum
from django.db.models.fields.json import KT

from zoekt import actions, clock
from zoekt.logging import get_logger
from zoekt.models import Index, Move, NodeShutdown
from zoekt.reasons import Reason

log = get_logger(__name__)

#: The trigger of a drain's moves (``Move.trigger``).
DRAIN = "drain"

#: An index in these states is on its way off its node already (evicted by a swap,
#: orphaned, pending deletion or eviction): GitLab's deletion pipeline removes it.
LEAVING_STATES = (*Index.EVICTION_STATES, *Index.SHOULD_BE_DELETED_STATES)


def drain_moves(record: NodeShutdown):
    """Every move this drain started (any state)."""
    return Move.objects.filter(trigger=DRAIN, details__shutdown_id=record.id)


def drain_progress(record: NodeShutdown, now: datetime | None = None) -> dict[str, Any]:
    """Where a drain stands (``drain_progress_many`` for one record).

    ``indices_left``: index rows still on the node, in any state (the record
    completes at zero); ``indices_to_move`` and ``bytes_left`` (their
    ``used_storage_bytes``): those of them not on their way out already.
    ``moves_in_flight`` (planned to swapping), ``moves_done``, ``moves_parked``
    and ``bytes_moved``: this drain's moves. ``observed_rate_bytes_per_second``:
    the bytes of its done moves over the time since its first move started
    building; ``eta_seconds``: ``bytes_left`` at that rate (None until a move
    is done). ``moves_done_on_target``: a replace's done moves that went to the
    named node (None for a remove).
    """
    return drain_progress_many([record], now)[record.id]


def drain_progress_many(
    records: Iterable[NodeShutdown], now: datetime | None = None
) -> dict[int, dict[str, Any]]:
    """``drain_progress`` of each record, by record id, in two grouped queries
    whatever the number of records (the dashboard's and ``/metrics``' form)."""
    now = now or clock.now()
    records = list(records)
    if not records:
        return {}
    leaving = Q(state__in=LEAVING_STATES)
    left = {
        row["zoekt_node_id"]: row
        for row in Index.objects.filter(zoekt_node_id__in=[r.node_id for r in records if r.node_id])
        .order_by()
        .values("zoekt_node_id")
        .annotate(
            indices=Count("id"),
            to_move=Count("id", filter=~leaving),
            bytes=Sum("used_storage_bytes", filter=~leaving),
        )
    }
    moves: dict[int, list[dict[str, Any]]] = {}
    for row in (
        Move.objects.filter(trigger=DRAIN, details__shutdown_id__in=[r.id for r in records])
        .order_by()
        .values("state", "target_node_id", shutdown=KT("details__shutdown_id"))
        .annotate(count=Count("id"), bytes=Sum("bytes"), first_building_at=Min("building_at"))
    ):
        moves.setdefault(int(row["shutdown"]), []).append(row)
    return {
        record.id: _progress(
            record,
            left.get(record.node_id, {}) if record.node_id else {},
            moves.get(record.id, []),
            now,
        )
        for record in records
    }


def _progress(
    record: NodeShutdown, left: dict[str, Any], moves: list[dict[str, Any]], now: datetime
) -> dict[str, Any]:
    """One record's progress from its node's index row and its moves' rows (by state
    and target)."""

    def count(state: str | tuple, target: int | None = None) -> int:
        states = (state,) if isinstance(state, str) else state
        return sum(
            row["count"]
            for row in moves
            if row["state"] in states and (target is None or row["target_node_id"] == target)
        )

    bytes_left = int(left.get("bytes") or 0)
    done = count(Move.State.DONE)
    moved = sum(int(row["bytes"] or 0) for row in moves if row["state"] == Move.State.DONE)
    started = min(
        (row["first_building_at"] for row in moves if row["first_building_at"]), default=None
    )
    rate = None
    if done and started is not None and now > started:
        rate = moved / (now - started).total_seconds()
    replace = record.type == NodeShutdown.Type.REPLACE
    return {
        "indices_left": left.get("indices", 0),
        "indices_to_move": left.get("to_move", 0),
        "bytes_left": bytes_left,
        "moves_in_flight": count(tuple(Move.LIVE)),
        "moves_done": done,
        "moves_parked": count(Move.State.PARKED),
        "bytes_moved": moved,
        "first_move_started_at": started,
        "observed_rate_bytes_per_second": None if rate is None else round(rate, 3),
        "eta_seconds": math.ceil(bytes_left / rate) if rate else None,
        "moves_done_on_target": count(Move.State.DONE, record.target_node_id) if replace else None,
    }


def wind_down(record: NodeShutdown, now: datetime) -> dict[str, list[int]]:
    """A drain cancelled in the middle: each of its live moves, locked, finishes (past
    building), is cancelled (planned) or is parked (building). In the caller's
    transaction, which holds the record's lock; returns the move ids by outcome."""
    out: dict[str, list[int]] = {"moves_cancelled": [], "moves_parked": [], "moves_finishing": []}
    live = drain_moves(record).filter(state__in=Move.LIVE).select_for_update().order_by("id")
    for move in live:
        if move.state == Move.State.PLANNED:
            move.transition(Move.State.CANCELLED, now, reason=str(Reason.DRAIN_CANCELLED))
            out["moves_cancelled"].append(move.id)
        elif move.state == Move.State.BUILDING:
            actions.do_park_move(
                move,
                Reason.DRAIN_CANCELLED,
                details={**move.details, "cancelled_with_shutdown": record.id},
                now=now,
            )
            out["moves_parked"].append(move.id)
        else:
            out["moves_finishing"].append(move.id)
    if any(out.values()):
        log.info("drain_wound_down", shutdown_id=record.id, **out)
    return out
