"""Node shutdown records: an operator takes a node out of service, and says so first.

Elasticsearch's node-shutdown shape (``PUT _nodes/<id>/shutdown``): a record
per request, with a type, a reason, who asked and when, and a status the
operator polls (``NodeShutdown``, ``zoekt_node_shutdowns``). One record per
node is live (in progress or stalled) at a time, which the database enforces
with a partial unique index; records stay after they complete or are
cancelled, as the node's history. Only ``restart`` can be requested for now;
``remove`` and ``replace`` are refused with a message saying so.

A **restart** (docs/operations.md) keeps the node's indices through its
allowed delay (``zoekt_node_restart_delay_seconds``, 30 minutes unless the
request gives its own): while ``now < delay_expires_at``, lost-node handling
and the lost-index-data check leave the node alone, the planner and eviction
choose nothing on it or from it, and search prefers other copies of each
range (``Node.objects.in_restart``). The record settles by itself:

* **away**: the node is seen away once, either by a heartbeat that arrives
  ``ONLINE_DURATION_THRESHOLD_SECONDS`` (30 s) or more after the previous one
  (``node_left_at`` is that previous heartbeat), or by the settle job finding
  it offline (``node_left_at`` is its last heartbeat);
* **back**: a heartbeat after ``node_left_at`` (``node_returned_at``, the
  first one seen);
* **its data agrees** when the reported indexed bytes (the heartbeat's
  ``disk.indexed``, ``Node.indexed_bytes``) are not a shortfall against the
  ``used_storage_bytes`` of its ready indices, by the lost-index-data check's
  own rule (``lost_index_data.is_shortfall``: fewer than half of them *and* at
  least 16 MiB missing), so a record that completes is never followed by a
  re-index of the same node;
* back with its data: ``complete`` (``node_returned``), nothing re-indexed;
* the delay passed first: ``complete`` with ``restart_delay_expired`` when the
  node was seen away (from then on today's rules apply: a node still offline
  is handled as lost at the lost-node threshold, one back without its data is
  re-indexed by the lost-index-data check), or ``node_never_left`` when it was
  never seen away (a restart shorter than the online threshold and the job's
  minute, or none at all);
* the node's row deleted (by hand): ``complete`` with ``shutdown_node_deleted``.

The heartbeat settles a record at once (``do_observe_node_heartbeat``); the
settle job (``do_settle_node_shutdowns``, every minute) catches what no
heartbeat will (the delay passing, a node that stays away). Both lock the
record and decide on the fresh rows, so running either twice, or both at
once, changes a record once.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Sum

from zoekt import app_settings, capacity, clock
from zoekt.logging import get_logger
from zoekt.models import Index, Node, NodeShutdown
from zoekt.operator_actions import ObjectNotFound, OperatorError, Rejected
from zoekt.reasons import Reason
from zoekt.scheduling.lost_index_data import is_shortfall

log = get_logger(__name__)

#: The longest delay a restart may ask for: a week.
MAX_ALLOWED_DELAY_SECONDS = 7 * 24 * 3600
#: The types a request may name today.
REQUESTABLE_TYPES = (NodeShutdown.Type.RESTART,)
NOT_AVAILABLE_YET = (
    "{type} is not available yet: only restart can be requested (docs/operations.md, Not yet)"
)
ONE_LIVE_CONSTRAINT = "zoekt_node_shutdowns_one_live_per_node"

Status = NodeShutdown.Status


class Conflict(OperatorError):
    """A 409: the request collides with the node's live record; nothing was written."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


# ----------------------------------------------------------------------------
# Requests: restart, cancel, status
# ----------------------------------------------------------------------------


def find_node(ref: int | str, field: str = "node_id") -> Node:
    """A node by id, or by the name it reports (the CLI's ``<node id or name>``)."""
    text = str(ref).strip()
    node = None
    if text.isdigit():
        node = Node.objects.filter(pk=int(text)).first()
    if node is None and text:
        node = Node.objects.filter(metadata__name=text).order_by("id").first()
    if node is None:
        raise ObjectNotFound(field, f"Zoekt node {text} not found.")
    return node


def check_request(type_: Any, reason: Any, allowed_delay: Any) -> dict[str, list[str]]:
    """Every field error of a shutdown request, by field (empty when it may proceed)."""
    errors: dict[str, list[str]] = {}
    values = [str(choice) for choice in NodeShutdown.Type]
    if type_ not in values:
        errors["type"] = [f"must be one of {', '.join(values)}"]
    elif type_ not in REQUESTABLE_TYPES:
        errors["type"] = [NOT_AVAILABLE_YET.format(type=type_)]
    if not isinstance(reason, str) or not reason.strip():
        errors["reason"] = ["must be a non-empty string saying why"]
    if allowed_delay is not None and (
        isinstance(allowed_delay, bool)
        or not isinstance(allowed_delay, int)
        or not 0 < allowed_delay <= MAX_ALLOWED_DELAY_SECONDS
    ):
        errors["allowed_delay"] = [
            f"must be a whole number of seconds between 1 and {MAX_ALLOWED_DELAY_SECONDS}"
        ]
    return errors


def do_request_node_shutdown(
    node_id: int,
    *,
    type: str,
    reason: str,
    requested_by: str,
    allowed_delay: int | None = None,
    now: datetime | None = None,
) -> NodeShutdown:
    """Record an operator's shutdown request for the node (only ``restart`` today).

    ``Rejected`` names the field at fault, ``ObjectNotFound`` the node, and
    ``Conflict`` the node's live record; none writes anything. The node row is
    locked while the record is written, so lost-node handling, which locks it
    too, sees either no record or the whole of it.
    """
    errors = check_request(type, reason, allowed_delay)
    if not requested_by:
        errors["requested_by"] = ["the operator's name is required"]
    if errors:
        raise Rejected(errors)
    now = now or clock.now()
    delay = allowed_delay or app_settings.current().node_restart_delay_seconds
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(pk=node_id).first()
        if node is None:
            raise ObjectNotFound("node_id", f"Zoekt node {node_id} not found.")
        try:
            with transaction.atomic():
                record = NodeShutdown.objects.create(
                    node=node,
                    node_ref=node.id,
                    node_name=node.name,
                    type=type,
                    reason=reason.strip(),
                    requested_by=requested_by,
                    requested_at=now,
                    allowed_delay_seconds=delay,
                    delay_expires_at=now + timedelta(seconds=delay),
                    created_at=now,
                    updated_at=now,
                )
        except IntegrityError as error:
            if ONE_LIVE_CONSTRAINT not in str(error):
                raise
            live = NodeShutdown.objects.live().filter(node=node).first()
            raise Conflict(
                "node_id",
                f"node {node.id} already has a live shutdown record"
                + (f" ({live.id}, {live.type}, {live.status})" if live else "")
                + "; cancel it first",
            ) from None
    log.info(
        "node_shutdown_requested",
        shutdown_id=record.id,
        node_id=node.id,
        node_name=node.name,
        type=type,
        requested_by=requested_by,
        allowed_delay_seconds=delay,
    )
    return record


def do_cancel_node_shutdown(
    node_id: int, *, cancelled_by: str, now: datetime | None = None
) -> NodeShutdown:
    """Cancel the node's live record, recording who did; ``ObjectNotFound`` when none is live."""
    if not cancelled_by:
        raise Rejected({"cancelled_by": ["the operator's name is required"]})
    now = now or clock.now()
    with transaction.atomic():
        record = NodeShutdown.objects.live().select_for_update().filter(node_id=node_id).first()
        if record is None:
            if not Node.objects.filter(pk=node_id).exists():
                raise ObjectNotFound("node_id", f"Zoekt node {node_id} not found.")
            raise ObjectNotFound("node_id", f"node {node_id} has no live shutdown record.")
        record.transition(Status.CANCELLED, now, cancelled_by=cancelled_by)
    log.info(
        "node_shutdown_cancelled",
        shutdown_id=record.id,
        node_id=node_id,
        cancelled_by=cancelled_by,
    )
    return record


def current_record(node_id: int) -> NodeShutdown | None:
    """The node's live record, else its latest one, else None."""
    live = NodeShutdown.objects.live().filter(node_ref=node_id).first()
    if live is not None:
        return live
    return NodeShutdown.objects.filter(node_ref=node_id).order_by("-requested_at", "-id").first()


def describe(record: NodeShutdown, now: datetime | None = None) -> dict[str, Any]:
    """The record as the API and the CLI show it, with the computed fields."""
    now = now or clock.now()
    node = record.node
    return {
        "id": record.id,
        "node_id": record.node_ref,
        "node_name": record.node_name,
        "type": record.type,
        "reason": record.reason,
        "requested_by": record.requested_by,
        "requested_at": record.requested_at,
        "allowed_delay_seconds": record.allowed_delay_seconds,
        "delay_expires_at": record.delay_expires_at,
        "delay_seconds_left": record.delay_seconds_left(now),
        "target_node_id": record.target_node_id,
        "status": record.status,
        "status_reason": record.status_reason or None,
        "node_exists": node is not None,
        "node_online": node is not None and node.is_online(now),
        "node_left_at": record.node_left_at,
        "node_returned_at": record.node_returned_at,
        "completed_at": record.completed_at,
        "cancelled_at": record.cancelled_at,
        "cancelled_by": record.cancelled_by or None,
        "details": record.details,
    }


# ----------------------------------------------------------------------------
# A restart settles: back with its data, or its delay passed
# ----------------------------------------------------------------------------


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


def _settle(
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


def live_restart_before_heartbeat(node_uuid: uuid.UUID) -> tuple[int, datetime] | None:
    """``(record id, the node's previous heartbeat)`` when the node has a live restart
    record, read before the heartbeat is written; one query, None for most nodes."""
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
        outcome = _settle(record, node, now, previous_seen_at)
    if outcome != "waiting":
        log.info("node_restart_observed", shutdown_id=shutdown_id, outcome=outcome)
    return Settled(shutdown_id, outcome)


def do_settle_node_shutdowns(now: datetime | None = None) -> dict[str, Any]:
    """The settle job: look at every live restart record once (locked, skipping a record
    another run holds); returns the outcomes by code."""
    now = now or clock.now()
    ids = list(
        NodeShutdown.objects.live()
        .filter(type=NodeShutdown.Type.RESTART)
        .order_by("id")
        .values_list("id", flat=True)
    )
    outcomes: Counter = Counter()
    completed: list[dict[str, Any]] = []
    for shutdown_id in ids:
        with transaction.atomic():
            record = (
                NodeShutdown.objects.live()
                .select_for_update(skip_locked=True)
                .filter(pk=shutdown_id)
                .first()
            )
            if record is None:
                outcomes["claimed_or_settled"] += 1
                continue
            node = Node.objects.filter(pk=record.node_id).first() if record.node_id else None
            outcome = _settle(record, node, now)
        outcomes[outcome] += 1
        if record.status == Status.COMPLETE:
            completed.append(
                {"shutdown_id": record.id, "node_id": record.node_ref, "reason": outcome}
            )
    return {
        "live_restarts": len(ids),
        "outcomes": dict(sorted(outcomes.items())),
        "completed": completed,
    }


def close_for_lost_node(node: Node, now: datetime) -> list[int]:
    """Lost-node handling is deleting the node (its restart's delay, if any, has passed):
    its records say so. A live one completes (``restart_delay_expired``); one the settle
    job already completed that way is marked too (``details.handled_as_lost_at``).
    Called inside that handling's transaction, with the node row locked."""
    marked = []
    for record in NodeShutdown.objects.select_for_update().filter(node=node).order_by("id"):
        details = {**record.details, "handled_as_lost_at": now.isoformat()}
        if record.live:
            record.transition(
                Status.COMPLETE, now, status_reason=Reason.RESTART_DELAY_EXPIRED, details=details
            )
        elif record.status_reason == Reason.RESTART_DELAY_EXPIRED and (
            "handled_as_lost_at" not in record.details
        ):
            record.details = details
            record.save(update_fields=["details", "updated_at"])
        else:
            continue
        marked.append(record.id)
    return marked
