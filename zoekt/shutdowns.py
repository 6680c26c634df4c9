"""Node shutdown records: an operator takes a node out of service, and says so first.

Elasticsearch's node-shutdown shape (``PUT _nodes/<id>/shutdown``): a record
per request, with a type, a reason, who asked and when, and a status the
operator polls (``NodeShutdown``, ``zoekt_node_shutdowns``). One record per
node is live (in progress or stalled) at a time, which the database enforces
with a partial unique index; records stay after they complete or are
cancelled, as the node's history. Three types (docs/operations.md):

* **restart**: the node keeps its indices through its allowed delay
  (``zoekt_node_restart_delay_seconds``, 30 minutes unless the request gives
  its own): while ``now < delay_expires_at``, lost-node handling and the
  lost-index-data check leave the node alone, the planner and eviction choose
  nothing on it or from it, and search prefers other copies of each range
  (``Node.objects.in_restart``). The record settles by itself when the node
  is back with its data, or when the delay passes (``zoekt.restarts``, and the
  settle job ``do_settle_node_shutdowns`` here).
* **remove**: a drain. Every index is moved off the node by the move
  machinery (trigger ``drain``, ``eviction.drain``); the record is ``stalled``
  while some index has nowhere to go, and ``complete`` (``node_drained``)
  when the node holds no index row. Progress: ``zoekt.drains``.
* **replace**: a drain whose moves go to the named ``target_node`` wherever it
  fits by the move filters, and elsewhere (recorded) where it does not.

While a drain is live, and after it completes until an operator returns the
node to service, the node takes nothing new (``Node.objects.in_shutdown``).
``do_cancel_node_shutdown`` (the API's ``DELETE``) cancels the live record,
winding a drain's moves down in the same transaction; on a node whose drain
is complete it returns the node to service instead (``returned_to_service_at``
and ``_by``). Every request, cancel and return records the operator's name.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from zoekt import app_settings, clock, drains, restarts
from zoekt.audit import Action, Actor, Target, audited
from zoekt.logging import get_logger
from zoekt.models import ZONE_PATTERN, Node, NodeShutdown
from zoekt.operator_actions import ObjectNotFound, OperatorError, Rejected
from zoekt.reasons import Reason

log = get_logger(__name__)

#: The longest delay a restart may ask for: a week.
MAX_ALLOWED_DELAY_SECONDS = 7 * 24 * 3600
ONE_LIVE_CONSTRAINT = "zoekt_node_shutdowns_one_live_per_node"
_ZONE_RE = re.compile(ZONE_PATTERN)

Status = NodeShutdown.Status
Type = NodeShutdown.Type


class Conflict(OperatorError):
    """A 409: the request collides with the node's live record; nothing was written."""

    code = "conflict"

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


# ----------------------------------------------------------------------------
# Requests: restart, remove, replace; cancel (or return to service), status
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


def _is_whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_request(
    type_: Any, reason: Any, allowed_delay: Any, target_node_id: Any = None
) -> dict[str, list[str]]:
    """Every field error of a shutdown request that needs no database, by field (empty
    when it may proceed; the target node's own checks are ``_check_target``'s)."""
    errors: dict[str, list[str]] = {}
    values = [str(choice) for choice in Type]
    if type_ not in values:
        errors["type"] = [f"must be one of {', '.join(values)}"]
    if not isinstance(reason, str) or not reason.strip():
        errors["reason"] = ["must be a non-empty string saying why"]
    if allowed_delay is not None and type_ in (Type.REMOVE, Type.REPLACE):
        errors["allowed_delay"] = ["only a restart has an allowed delay"]
    elif allowed_delay is not None and (
        not _is_whole_number(allowed_delay) or not 0 < allowed_delay <= MAX_ALLOWED_DELAY_SECONDS
    ):
        errors["allowed_delay"] = [
            f"must be a whole number of seconds between 1 and {MAX_ALLOWED_DELAY_SECONDS}"
        ]
    if type_ == Type.REPLACE and target_node_id is None:
        errors["target_node_id"] = ["a replace names the node that receives the data"]
    elif type_ == Type.REPLACE and not (_is_whole_number(target_node_id) and target_node_id > 0):
        errors["target_node_id"] = ["must be a node id"]
    elif target_node_id is not None and type_ in (Type.RESTART, Type.REMOVE):
        errors["target_node_id"] = ["only a replace names a target node"]
    return errors


def _check_target(node: Node, target: Node | None, target_node_id: int) -> list[str]:
    """Why the named node cannot receive a replace's data (empty when it can); a node that
    does not exist is ``ObjectNotFound`` naming ``target_node_id`` (a 404, as an unknown
    node anywhere in the operator API)."""
    if target is None:
        raise ObjectNotFound("target_node_id", f"Zoekt node {target_node_id} not found.")
    if target.id == node.id:
        return ["the target must be another node than the one replaced"]
    if Node.Service.ZOEKT not in target.services:
        return [f"node {target.id} is not a search node"]
    live = NodeShutdown.objects.live().filter(node=target).first()
    if live is not None:
        return [f"node {target.id} has a live shutdown record of its own ({live.id}, {live.type})"]
    drained = _held_out(target.id)
    if drained is not None:
        return [
            f"node {target.id} was drained (record {drained.id}) and is out of service; "
            "return it to service first (DELETE its shutdown, or zoekt_node cancel)"
        ]
    return []


def _held_out(node_id: int) -> NodeShutdown | None:
    """The node's complete drain that keeps it out of service, if any."""
    return (
        NodeShutdown.objects.filter(
            node_id=node_id,
            type__in=NodeShutdown.DRAINS,
            status=Status.COMPLETE,
            returned_to_service_at__isnull=True,
        )
        .order_by("-id")
        .first()
    )


def _lock_nodes(*ids: int | None) -> dict[int, Node]:
    """The nodes' rows, locked in id order (two requests naming the same two nodes
    lock them in the same order)."""
    wanted = sorted({node_id for node_id in ids if node_id is not None})
    return {node.id: node for node in Node.objects.select_for_update().filter(pk__in=wanted)}


def node_target(node_id: int, node: Node | None = None) -> Target:
    """A node as the audit trail names it."""
    return Target("node", node_id, node.name if node is not None else "")


def do_request_node_shutdown(
    node_id: int,
    *,
    type: str,
    reason: str,
    requested_by: str,
    allowed_delay: int | None = None,
    target_node_id: int | None = None,
    now: datetime | None = None,
    actor: Actor | None = None,
) -> NodeShutdown:
    """``_request_node_shutdown``, recorded in the audit trail (ok or refused)."""
    with audited(
        actor or Actor.internal(requested_by),
        Action.NODE_SHUTDOWN_REQUESTED,
        node_target(node_id),
        type=type,
        request_reason=reason,
        allowed_delay=allowed_delay,
        target_node_id=target_node_id,
    ) as entry:
        record = _request_node_shutdown(
            node_id,
            type=type,
            reason=reason,
            requested_by=requested_by,
            allowed_delay=allowed_delay,
            target_node_id=target_node_id,
            now=now,
        )
        entry.target = node_target(node_id, record.node)
        entry.details["shutdown_id"] = record.id
    return record


def _request_node_shutdown(
    node_id: int,
    *,
    type: str,
    reason: str,
    requested_by: str,
    allowed_delay: int | None = None,
    target_node_id: int | None = None,
    now: datetime | None = None,
) -> NodeShutdown:
    """Record an operator's shutdown request for the node: ``restart``, ``remove`` or
    ``replace`` (with ``target_node_id``).

    ``Rejected`` names the field at fault (a replace's target: the node itself,
    not a search node, with a live record of its own, or drained and not
    returned), ``ObjectNotFound`` the node or a replace's target that does not
    exist, and ``Conflict`` the node's live
    record (or a live replace that names the node as its target); none writes
    anything. The node's row (and the target's) is locked while the record is
    written, so lost-node handling, which locks it too, sees either no record
    or the whole of it.
    """
    errors = check_request(type, reason, allowed_delay, target_node_id)
    if not requested_by:
        errors["requested_by"] = ["the operator's name is required"]
    if errors:
        raise Rejected(errors)
    now = now or clock.now()
    restart = type == Type.RESTART
    delay = None
    if restart:
        delay = allowed_delay or app_settings.current().node_restart_delay_seconds
    with transaction.atomic():
        locked = _lock_nodes(node_id, target_node_id)
        node = locked.get(node_id)
        if node is None:
            raise ObjectNotFound("node_id", f"Zoekt node {node_id} not found.")
        if type == Type.REPLACE:
            problems = _check_target(node, locked.get(target_node_id), target_node_id)
            if problems:
                raise Rejected({"target_node_id": problems})
        receiving = NodeShutdown.objects.live().filter(target_node=node).first()
        if receiving is not None:
            raise Conflict(
                "node_id",
                f"node {node.id} receives the data of live replace {receiving.id} "
                f"(node {receiving.node_ref}); cancel that first",
            )
        record = _create(node, type, reason, requested_by, now, delay, target_node_id)
    log.info(
        "node_shutdown_requested",
        shutdown_id=record.id,
        node_id=node.id,
        node_name=node.name,
        type=type,
        requested_by=requested_by,
        allowed_delay_seconds=delay,
        target_node_id=target_node_id,
    )
    return record


# ----------------------------------------------------------------------------
# A whole zone: one record per node (docs/operations.md, "A whole zone")
# ----------------------------------------------------------------------------


def zone_target(zone: str) -> Target:
    """A zone as the audit trail names it."""
    return Target("zone", None, zone)


def do_request_zone_shutdown(
    zone: str,
    *,
    type: str,
    reason: str,
    requested_by: str,
    allowed_delay: int | None = None,
    now: datetime | None = None,
    actor: Actor | None = None,
) -> list[NodeShutdown]:
    """``_request_zone_shutdown``, recorded in the audit trail (ok or refused)."""
    with audited(
        actor or Actor.internal(requested_by),
        Action.NODE_SHUTDOWN_REQUESTED,
        zone_target(str(zone)),
        type=type,
        request_reason=reason,
        allowed_delay=allowed_delay,
        zone=zone,
    ) as entry:
        records = _request_zone_shutdown(
            zone,
            type=type,
            reason=reason,
            requested_by=requested_by,
            allowed_delay=allowed_delay,
            now=now,
        )
        entry.details["shutdown_ids"] = [record.id for record in records]
        entry.details["node_ids"] = [record.node_ref for record in records]
    return records


def _request_zone_shutdown(
    zone: str,
    *,
    type: str,
    reason: str,
    requested_by: str,
    allowed_delay: int | None = None,
    now: datetime | None = None,
) -> list[NodeShutdown]:
    """A ``restart`` or ``remove`` of every node in ``zone``: one record per node, the
    node's own request (the same machinery, the same rules), all written in one
    transaction or none. ``Rejected`` names the field at fault: ``zone`` when it is
    not a zone label, or, for a remove, when no search node outside the zone could
    receive the data (every other one is in the zone's own drain or out of service:
    the drain could move nothing, and a drain never deletes an index before its
    replacement serves); ``type`` for a replace (a zone has no single target).
    ``ObjectNotFound`` when no node is in the zone; ``Conflict`` when a node of the
    zone has a live record already (or receives a live replace), naming it."""
    errors = check_request(type, reason, allowed_delay)
    if type == Type.REPLACE:
        errors["type"] = ["a whole zone is restarted or removed; replace one node at a time"]
    if not isinstance(zone, str) or not _ZONE_RE.fullmatch(zone):
        errors["zone"] = ["must be a zone label (1 to 63 letters, digits, '.', '_' or '-')"]
    if not requested_by:
        errors["requested_by"] = ["the operator's name is required"]
    if errors:
        raise Rejected(errors)
    now = now or clock.now()
    delay = None
    if type == Type.RESTART:
        delay = allowed_delay or app_settings.current().node_restart_delay_seconds
    with transaction.atomic():
        ids = list(Node.objects.filter(zone=zone).order_by("id").values_list("id", flat=True))
        if not ids:
            raise ObjectNotFound("zone", f"No Zoekt node is in zone {zone}.")
        locked = _lock_nodes(*ids)
        if type == Type.REMOVE:
            receivers = (
                Node.objects.for_search()
                .exclude(id__in=ids)
                .not_in_shutdown(now)
                .filter(Q(zone__isnull=True) | ~Q(zone=zone))
            )
            if not receivers.exists():
                raise Rejected(
                    {
                        "zone": [
                            f"every search node outside zone {zone} is out of service (or "
                            "there is none): the drain would have nowhere to move the indices"
                        ]
                    }
                )
        records = []
        for node_id in ids:
            node = locked[node_id]
            receiving = NodeShutdown.objects.live().filter(target_node=node).first()
            if receiving is not None:
                raise Conflict(
                    "zone",
                    f"node {node.id} of zone {zone} receives the data of live replace "
                    f"{receiving.id}; cancel that first",
                )
            try:
                records.append(_create(node, type, reason, requested_by, now, delay, None))
            except Conflict as error:
                raise Conflict("zone", f"zone {zone}: {error.message}") from None
    log.info(
        "zone_shutdown_requested",
        zone=zone,
        type=type,
        node_ids=ids,
        shutdown_ids=[record.id for record in records],
        requested_by=requested_by,
        allowed_delay_seconds=delay,
    )
    return records


def do_cancel_zone_shutdown(
    zone: str, *, cancelled_by: str, now: datetime | None = None, actor: Actor | None = None
) -> list[NodeShutdown]:
    """Cancel the live record of every node in ``zone`` (or return its drained nodes to
    service): ``do_cancel_node_shutdown`` per node that has something to cancel."""
    with audited(
        actor or Actor.internal(cancelled_by), Action.NODE_SHUTDOWN_CANCELLED, zone_target(zone)
    ) as entry:
        if not cancelled_by:
            raise Rejected({"cancelled_by": ["the operator's name is required"]})
        ids = list(Node.objects.filter(zone=zone).order_by("id").values_list("id", flat=True))
        if not ids:
            raise ObjectNotFound("zone", f"No Zoekt node is in zone {zone}.")
        records = []
        with transaction.atomic():
            for node_id in ids:
                if NodeShutdown.objects.live().filter(node_id=node_id).exists() or _held_out(
                    node_id
                ):
                    records.append(
                        _cancel_node_shutdown(node_id, cancelled_by=cancelled_by, now=now)
                    )
        if not records:
            raise ObjectNotFound(
                "zone", f"No node of zone {zone} has a live record or a complete drain to undo."
            )
        entry.details["shutdown_ids"] = [record.id for record in records]
    return records


def zone_records(zone: str) -> list[NodeShutdown]:
    """The current record (live, else latest) of every node in ``zone`` that has one."""
    ids = Node.objects.filter(zone=zone).order_by("id").values_list("id", flat=True)
    return [record for node_id in ids if (record := current_record(node_id)) is not None]


def _create(node, type_, reason, requested_by, now, delay, target_node_id) -> NodeShutdown:
    """The record, or ``Conflict`` when the database refuses a second live one."""
    try:
        with transaction.atomic():
            return NodeShutdown.objects.create(
                node=node,
                node_ref=node.id,
                node_name=node.name,
                type=type_,
                reason=reason.strip(),
                requested_by=requested_by,
                requested_at=now,
                allowed_delay_seconds=delay,
                delay_expires_at=None if delay is None else now + timedelta(seconds=delay),
                target_node_id=target_node_id,
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


def do_cancel_node_shutdown(
    node_id: int, *, cancelled_by: str, now: datetime | None = None, actor: Actor | None = None
) -> NodeShutdown:
    """``_cancel_node_shutdown``, recorded in the audit trail (ok or refused)."""
    with audited(
        actor or Actor.internal(cancelled_by), Action.NODE_SHUTDOWN_CANCELLED, node_target(node_id)
    ) as entry:
        record = _cancel_node_shutdown(node_id, cancelled_by=cancelled_by, now=now)
        entry.target = node_target(node_id, record.node)
        entry.details.update(
            shutdown_id=record.id,
            type=record.type,
            returned_to_service=record.status != Status.CANCELLED,
        )
    return record


def _cancel_node_shutdown(
    node_id: int, *, cancelled_by: str, now: datetime | None = None
) -> NodeShutdown:
    """Cancel the node's live record, recording who did; a drain's moves are wound down
    in the same transaction (``zoekt.drains.wind_down``, what it did in
    ``details.cancel``). A node with no live record whose drain is complete is
    returned to service instead (``returned_to_service_at``/``_by``): it takes
    placements again. ``ObjectNotFound`` when there is neither."""
    if not cancelled_by:
        raise Rejected({"cancelled_by": ["the operator's name is required"]})
    now = now or clock.now()
    with transaction.atomic():
        record = NodeShutdown.objects.live().select_for_update().filter(node_id=node_id).first()
        if record is None:
            return _return_to_service(node_id, cancelled_by, now)
        fields: dict[str, Any] = {"cancelled_by": cancelled_by}
        if record.drain:
            fields["details"] = {**record.details, "cancel": drains.wind_down(record, now)}
        record.transition(Status.CANCELLED, now, **fields)
    log.info(
        "node_shutdown_cancelled",
        shutdown_id=record.id,
        node_id=node_id,
        cancelled_by=cancelled_by,
    )
    return record


def _return_to_service(node_id: int, returned_by: str, now: datetime) -> NodeShutdown:
    """The node's complete drain stops holding it out of placement (not a status change:
    the record stays complete); ``ObjectNotFound`` when there is nothing to undo."""
    held = _held_out(node_id)
    if held is None:
        if not Node.objects.filter(pk=node_id).exists():
            raise ObjectNotFound("node_id", f"Zoekt node {node_id} not found.")
        raise ObjectNotFound(
            "node_id",
            f"node {node_id} has no live shutdown record, and no complete drain holding it "
            "out of service.",
        )
    held = NodeShutdown.objects.select_for_update().get(pk=held.pk)
    held.returned_to_service_at = now
    held.returned_to_service_by = returned_by
    held.save(update_fields=["returned_to_service_at", "returned_to_service_by", "updated_at"])
    log.info("node_returned_to_service", shutdown_id=held.id, node_id=node_id, by=returned_by)
    return held


def current_record(node_id: int) -> NodeShutdown | None:
    """The node's live record, else its latest one, else None."""
    live = NodeShutdown.objects.live().filter(node_ref=node_id).first()
    if live is not None:
        return live
    return NodeShutdown.objects.filter(node_ref=node_id).order_by("-requested_at", "-id").first()


def describe(record: NodeShutdown, now: datetime | None = None) -> dict[str, Any]:
    """The record as the API and the CLI show it, with the computed fields (a drain's
    progress under ``drain``, None for a restart)."""
    now = now or clock.now()
    node = record.node
    target = record.target_node
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
        "target_node_name": None if target is None else target.name,
        "status": record.status,
        "status_reason": record.status_reason or None,
        "node_exists": node is not None,
        "node_online": node is not None and node.is_online(now),
        "node_out_of_service": record.within_delay(now)
        or (record.drain and record.live)
        or record.holds_node_out,
        "node_left_at": record.node_left_at,
        "node_returned_at": record.node_returned_at,
        "completed_at": record.completed_at,
        "cancelled_at": record.cancelled_at,
        "cancelled_by": record.cancelled_by or None,
        "returned_to_service_at": record.returned_to_service_at,
        "returned_to_service_by": record.returned_to_service_by or None,
        "drain": drains.drain_progress(record, now) if record.drain else None,
        "details": record.details,
    }


# ----------------------------------------------------------------------------
# The settle job, and lost-node handling (the restart's rules: ``zoekt.restarts``)
# ----------------------------------------------------------------------------


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
            outcome = restarts.settle(record, node, now)
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
    its records say so. A live restart completes (``restart_delay_expired``), a live
    drain too (``shutdown_node_deleted``: the node went before it was empty); a restart
    the settle job already completed that way is marked too
    (``details.handled_as_lost_at``). Called inside that handling's transaction, with
    the node row locked."""
    marked = []
    for record in NodeShutdown.objects.select_for_update().filter(node=node).order_by("id"):
        details = {**record.details, "handled_as_lost_at": now.isoformat()}
        if record.live:
            reason = Reason.SHUTDOWN_NODE_DELETED if record.drain else Reason.RESTART_DELAY_EXPIRED
            record.transition(Status.COMPLETE, now, status_reason=reason, details=details)
        elif record.status_reason == Reason.RESTART_DELAY_EXPIRED and (
            "handled_as_lost_at" not in record.details
        ):
            record.details = details
            record.save(update_fields=["details", "updated_at"])
        else:
            continue
        marked.append(record.id)
    return marked
