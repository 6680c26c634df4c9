"""A restart settles: the node comes back with its data, or its allowed delay passes.

The rules of a live ``restart`` record (docs/operations.md, ``zoekt.shutdowns``
holds the records and the requests): the heartbeat handler
(``zoekt.actions.do_heartbeat``) reads ``live_restart_before_heartbeat`` before
writing the new heartbeat and then settles the record at once
(``do_observe_node_heartbeat``); the settle job
(``zoekt.shutdowns.do_settle_node_shutdowns``) applies ``settle`` to every live
restart record once a minute. Both lock the record and decide on the fresh rows.
Apart from the records' module so that the heartbeat path imports only this.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import datetime

from django.db import transaction
from django.db.models import Sum
from django.db.models.signals import post_save
from django.dispatch import receiver

from zoekt import capacity, clock
from zoekt.logging import get_logger
from zoekt.models import Index, Node, NodeShutdown
from zoekt.reasons import Reason
from zoekt.scheduling.lost_index_data import is_shortfall

log = get_logger(__name__)

Status = NodeShutdown.Status


def expected_bytes(node_id: int) -> int:
    """What the node's ready indices hold by their ``used_storage_bytes``."""
    total = Index.objects.filter(zoekt_node_id=node_id, state=Index.State.READY).aggregate(
        total=Sum("used_storage_bytes")
    )["total"]
    return int(total or 0)


def bytes_agree(reported_bytes: int, expected: int) -> bool:
    """The node reports its data: not a shortfall by the lost-index-data check's rule."""
    return not is_shortfall(reported_bytes, expected)


@dataclasses.dataclass(frozen=True)
class Settled:
    """What one look at a live restart record did (``outcome`` is a stable code)."""

    shutdown_id: int
    outcome: str


def settle(
    record: NodeShutdown,
    node: Node | None,
    now: datetime,
    previous_seen_at: datetime | None = None,
) -> str:
    """Decide on a locked live restart record and its node; returns what it did."""
    if node is None:
        record.transition(Status.COMPLETE, now, status_reason=Reason.SHUTDOWN_NODE_DELETED)
        return str(Reason.SHUTDOWN_NODE_DELETED)
    changed: list[str] = []
    if record.node_left_at is None:
        gap = (
            previous_seen_at is not None
            and (now - previous_seen_at).total_seconds()
            >= capacity.ONLINE_DURATION_THRESHOLD_SECONDS
        )
        if gap:
            record.node_left_at = previous_seen_at
        elif not node.is_online(now):
            record.node_left_at = node.last_seen_at
        if record.node_left_at is not None:
            changed.append("node_left_at")
    back = (
        record.node_left_at is not None
        and node.is_online(now)
        and node.last_seen_at > record.node_left_at
    )
    if back and record.node_returned_at is None:
        record.node_returned_at = node.last_seen_at
        changed.append("node_returned_at")
    expected = expected_bytes(node.id) if back or now >= record.delay_expires_at else 0
    seen = {"reported_bytes": node.indexed_bytes, "expected_bytes": expected}
    if back and bytes_agree(node.indexed_bytes, expected):
        record.transition(
            Status.COMPLETE,
            now,
            status_reason=Reason.NODE_RETURNED,
            details={**record.details, **seen},
            **{field: getattr(record, field) for field in changed},
        )
        return str(Reason.NODE_RETURNED)
    if now >= record.delay_expires_at:
        reason = (
            Reason.RESTART_DELAY_EXPIRED
            if record.node_left_at is not None
            else Reason.NODE_NEVER_LEFT
        )
        record.transition(
            Status.COMPLETE,
            now,
            status_reason=reason,
            details={**record.details, **seen, "node_online": node.is_online(now)},
            **{field: getattr(record, field) for field in changed},
        )
        return str(reason)
    if changed:
        record.save(update_fields=[*changed, "updated_at"])
        return "node_left" if "node_left_at" in changed and not back else "node_back"
    return "waiting"


#: How long a process trusts that no restart record is live before it asks again. A record
#: created in this process drops the memo at once (``_forget_live_restarts``); one created
#: in another is seen within this time, long before its node has gone away and come back.
LIVE_RESTARTS_MEMO_SECONDS = 1.0
_live_restarts = {"until": 0.0, "any": True}


def _any_live_restart() -> bool:
    """Is any restart record live? One ``EXISTS`` a second per process."""
    if _live_restarts["until"] > time.monotonic():
        return bool(_live_restarts["any"])
    found = NodeShutdown.objects.live().filter(type=NodeShutdown.Type.RESTART).exists()
    _live_restarts.update(until=time.monotonic() + LIVE_RESTARTS_MEMO_SECONDS, any=found)
    return found


@receiver(post_save, sender="zoekt.NodeShutdown")
def _forget_live_restarts(**_kwargs) -> None:
    _live_restarts["until"] = 0.0


def live_restart_before_heartbeat(node_uuid: uuid.UUID) -> tuple[int, datetime] | None:
    """``(record id, the node's previous heartbeat)`` when the node has a live restart
    record, read before the heartbeat is written; None for most nodes, which while no
    restart is live costs no query (``_any_live_restart``)."""
    if not _any_live_restart():
        return None
    return (
        NodeShutdown.objects.live()
        .filter(node__uuid=node_uuid, type=NodeShutdown.Type.RESTART)
        .values_list("id", "node__last_seen_at")
        .first()
    )


def do_observe_node_heartbeat(
    shutdown_id: int, previous_seen_at: datetime, now: datetime | None = None
) -> Settled:
    """A heartbeat of a node with a live restart record: away and back, with its data?"""
    now = now or clock.now()
    with transaction.atomic():
        record = NodeShutdown.objects.live().select_for_update().filter(pk=shutdown_id).first()
        if record is None:
            return Settled(shutdown_id, "not_live")
        node = Node.objects.filter(pk=record.node_id).first() if record.node_id else None
        outcome = settle(record, node, now, previous_seen_at)
    if outcome != "waiting":
        log.info("node_restart_observed", shutdown_id=shutdown_id, outcome=outcome)
    return Settled(shutdown_id, outcome)
