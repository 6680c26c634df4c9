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
from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q, Sum

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
    """Where a drain stands, in four queries.

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
    now = now or clock.now()
    on_node = (
        Index.objects.filter(zoekt_node_id=record.node_id)
        if record.node_id
        else Index.objects.none()
    )
    left = on_node.aggregate(
        indices=Count("id"),
        to_move=Count("id", filter=~Q(state__in=LEAVING_STATES)),
        bytes=Sum("used_storage_bytes", filter=~Q(state__in=LEAVING_STATES)),
    )
    moves = drain_moves(record).aggregate(
        in_flight=Count("id", filter=Q(state__in=Move.LIVE)),
        done=Count("id", filter=Q(state=Move.State.DONE)),
        parked=Count("id", filter=Q(state=Move.State.PARKED)),
        moved=Sum("bytes", filter=Q(state=Move.State.DONE)),
        first_building_at=Min("building_at"),
        on_target=Count(
            "id", filter=Q(state=Move.State.DONE, target_node_id=record.target_node_id)
        ),
    )
    bytes_left = int(left["bytes"] or 0)
    moved = int(moves["moved"] or 0)
    rate = None
    started = moves["first_building_at"]
    if moves["done"] and started is not None and now > started:
        rate = moved / (now - started).total_seconds()
    eta = None
    if rate:
        eta = math.ceil(bytes_left / rate)
    return {
        "indices_left": left["indices"],
        "indices_to_move": left["to_move"],
        "bytes_left": bytes_left,
        "moves_in_flight": moves["in_flight"],
        "moves_done": moves["done"],
        "moves_parked": moves["parked"],
        "bytes_moved": moved,
        "first_move_started_at": started,
        "observed_rate_bytes_per_second": None if rate is None else round(rate, 3),
        "eta_seconds": eta,
        "moves_done_on_target": (
            moves["on_target"] if record.type == NodeShutdown.Type.REPLACE else None
        ),
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
