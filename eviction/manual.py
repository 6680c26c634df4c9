"""Moving one index by hand: ``manage.py zoekt_move --index ID --to NODE`` and
``POST /api/v1/indices/<id>/move``.

Elasticsearch's ``_cluster/reroute`` for one shard, with the allocator's own
deciders: an operator names the index and the node, and the move is an
ordinary move (``eviction.moves``, trigger ``manual``) with its target fixed
in ``details.planned_target_node_id`` as a memory-pressure move's is: the
same throttles, lease, deadline, retries and crash safety, the replacement
built on the named node while the index serves, the swap only once the
replacement is ready on a searchable node. The move's details record who
asked (``requested_by``), why (``requested_reason``) and when.

The request is refused, with a stable code (``zoekt.reasons``) and a
sentence, and nothing written, when the index is unknown or the node is
(``ObjectNotFound``), when the index is not ready or its namespace has a
live move, and when ``eviction.moves.target_refusal`` refuses the node: the
rules ``choose_target`` applies to every move, written once. Two refusals
can never clear as asked (the index's own node, a node that is not a search
node); the others may clear later (``MoveRefused.never``). When the node
fits but the throttles are full, the move is created ``planned``
(``move_throttled``) and ``advance_moves`` starts it when a slot frees,
asking the node again by the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from eviction import moves
from zoekt import app_settings, capacity, clock, memory
from zoekt.audit import Action, Actor, Target, audited
from zoekt.logging import get_logger
from zoekt.models import Index, Move, Node, NodeShutdown
from zoekt.operator_actions import ObjectNotFound, OperatorError, Rejected
from zoekt.reasons import Reason
from zoekt.units import binary_size

log = get_logger(__name__)

MANUAL = moves.MANUAL
#: The longest reason an operator may give, as for a node shutdown request.
MAX_REASON_LENGTH = 2000
#: Refusals that no wait clears: the request itself cannot be carried out as asked.
NEVER = frozenset({Reason.MOVE_TARGET_IS_SOURCE, Reason.MOVE_TARGET_NOT_SEARCH_NODE})


class MoveRefused(OperatorError):
    """The index cannot be moved where asked; nothing was written. ``field`` is the one at
    fault (``index_id`` or ``to_node_id``), ``reason`` the stable code, ``never`` whether
    it can clear by itself (False: try again later; the API's 409) or not (a 400)."""

    def __init__(self, field: str, reason: Reason, sentence: str):
        self.field = field
        self.reason = reason
        self.sentence = sentence
        self.never = reason in NEVER
        self.message = f"{reason}: {sentence}"
        super().__init__(self.message)


@dataclass(frozen=True)
class HandMove:
    """A move by hand as created: building on its node, or waiting for a slot."""

    move: Move
    target: Node

    @property
    def started(self) -> bool:
        return self.move.state == Move.State.BUILDING

    def as_dict(self) -> dict[str, Any]:
        move = self.move
        return {
            "move_id": move.id,
            "state": move.state,
            "reason": move.reason or None,
            "trigger": move.trigger,
            "index_id": move.source_index_ref,
            "namespace_id": move.namespace_id,
            "source_node_id": move.source_node_id,
            "target_node_id": self.target.id,
            "target_node_name": self.target.name,
            "replacement_index_id": move.replacement_index_id,
            "bytes": move.bytes,
            "deadline_at": move.deadline_at,
            "requested_by": move.details.get("requested_by"),
            "requested_reason": move.details.get("requested_reason"),
            "message": self.message(),
        }

    def message(self) -> str:
        where = f"node {self.target.id} ({self.target.name})"
        if self.started:
            return (
                f"Move {self.move.id} started: the replacement builds on {where} while "
                f"index {self.move.source_index_ref} serves; it is swapped in once ready."
            )
        return (
            f"Move {self.move.id} is planned ({self.move.reason or Reason.MOVE_THROTTLED}): "
            f"the move throttles are full; it starts on {where} when a slot frees."
        )


def check_request(reason: Any, requested_by: Any) -> dict[str, list[str]]:
    """Every field error of a move request, by field (empty when it may proceed)."""
    errors: dict[str, list[str]] = {}
    if not isinstance(reason, str) or len(reason) > MAX_REASON_LENGTH:
        errors["reason"] = [f"must be a string of at most {MAX_REASON_LENGTH} characters"]
    if not isinstance(requested_by, str) or not requested_by.strip():
        errors["requested_by"] = ["the operator's name is required"]
    return errors


def do_move_index(
    index_id: int,
    to_node_id: int,
    *,
    requested_by: str,
    reason: str = "",
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
    actor: Actor | None = None,
) -> HandMove:
    """``_move_index``, recorded in the audit trail (ok, or refused with the stable code)."""
    with audited(
        actor or Actor.internal(str(requested_by)),
        Action.INDEX_MOVE_REQUESTED,
        Target("index", index_id),
        to_node_id=to_node_id,
        request_reason=reason,
    ) as entry:
        done = _move_index(
            index_id,
            to_node_id,
            requested_by=requested_by,
            reason=reason,
            settings=settings,
            now=now,
        )
        entry.target = Target("index", index_id, f"namespace {done.move.namespace_id}")
        entry.details.update(
            move_id=done.move.id,
            move_state=done.move.state,
            source_node_id=done.move.source_node_id,
            to_node_name=done.target.name,
        )
    return done


def _move_index(
    index_id: int,
    to_node_id: int,
    *,
    requested_by: str,
    reason: str = "",
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
) -> HandMove:
    """Move the index to the node by hand, in one transaction (the index and the node rows
    locked): ``ObjectNotFound``, ``Rejected`` or ``MoveRefused`` write nothing."""
    errors = check_request(reason, requested_by)
    if errors:
        raise Rejected(errors)
    settings = settings or app_settings.current()
    now = now or clock.now()
    with transaction.atomic():
        index = Index.objects.select_for_update().filter(pk=index_id).first()
        if index is None:
            raise ObjectNotFound("index_id", f"Zoekt index {index_id} not found.")
        node = Node.objects.select_for_update().filter(pk=to_node_id).first()
        if node is None:
            raise ObjectNotFound("to_node_id", f"Zoekt node {to_node_id} not found.")
        _check_index(index)
        facts = moves.target_facts(
            index, index.used_storage_bytes, [node], ceiling=ceiling(), settings=settings, now=now
        )
        refusal = moves.target_refusal(node, facts)
        if refusal is not None:
            raise MoveRefused("to_node_id", refusal, _sentence(refusal, node, facts))
        move = _create(index, node, requested_by.strip(), reason.strip(), facts.ceiling, now)
        outcome = moves.try_start(move, index, settings=settings, now=now)
        if outcome == Reason.MOVE_NO_TARGET:  # the node changed under us: refuse it whole
            refusal = Reason(move.details.get("refused_at_start", Reason.MOVE_NO_TARGET))
            raise MoveRefused("to_node_id", refusal, _sentence(refusal, node, facts))
    log.info(
        "move_requested",
        move_id=move.id,
        index_id=index.id,
        target_node_id=node.id,
        state=move.state,
        requested_by=move.details["requested_by"],
    )
    return HandMove(move, node)


def ceiling() -> float:
    """The disk share a target must stay under: the high watermark less the hysteresis
    band, as for the moves eviction starts (a target never starts its own sustain clock)."""
    _low, high, _critical = capacity.watermark_limits(app_settings.development_watermarks())
    return capacity.hysteresis_floor(high)


def _check_index(index: Index) -> None:
    """Only a ready index in a replica moves, and only while its namespace has no live move."""
    if index.state != Index.State.READY or index.zoekt_replica_id is None:
        state = Index.State(index.state).label
        if index.zoekt_replica_id is None:
            state += ", in no replica"
        raise MoveRefused(
            "index_id",
            Reason.MOVE_INDEX_NOT_READY,
            f"index {index.id} is {state}: only a ready index in a replica is moved (it "
            "serves while its replacement builds).",
        )
    live = Move.objects.live().filter(zoekt_enabled_namespace_id=index.zoekt_enabled_namespace_id)
    if (move := live.order_by("id").first()) is not None:
        raise MoveRefused("index_id", Reason.MOVE_ALREADY_MOVING, _moving(index, move))


def _moving(index: Index, move: Move) -> str:
    what = (
        f"index {index.id} is moving already"
        if move.source_index_ref == index.id
        else f"namespace {index.namespace_id} of index {index.id} has a live move already"
    )
    return (
        f"{what} (move {move.id}, {move.state}, trigger {move.trigger}): one move per "
        "namespace at a time; try again when it ends."
    )


def _create(
    index: Index, node: Node, requested_by: str, reason: str, target_ceiling: float, now: datetime
) -> Move:
    """The move's record, planned, with who asked and why; the database refuses a second
    live move of the namespace (a request racing this one)."""
    try:
        with transaction.atomic():
            return Move.objects.create(
                **Move.fields_from_source(index, MANUAL, now),
                state=Move.State.PLANNED,
                details={
                    "critical": False,
                    "target_ceiling": target_ceiling,
                    "planned_target_node_id": node.id,
                    "requested_by": requested_by,
                    "requested_reason": reason,
                    "requested_at": now.isoformat(),
                },
            )
    except IntegrityError:
        live = Move.objects.live().filter(
            zoekt_enabled_namespace_id=index.zoekt_enabled_namespace_id
        )
        move = live.order_by("id").first()
        sentence = (
            _moving(index, move)
            if move is not None
            else f"index {index.id} has a live move already; try again when it ends."
        )
        raise MoveRefused("index_id", Reason.MOVE_ALREADY_MOVING, sentence) from None


def _sentence(reason: Reason, node: Node, facts: moves.TargetFacts) -> str:
    """The refusal in words, with the figures the rule compared."""
    where = f"node {node.id} ({node.name})"
    index = facts.index
    if reason == Reason.MOVE_TARGET_IS_SOURCE:
        return f"index {index.id} is on {where} already; name another node."
    if reason == Reason.MOVE_TARGET_NOT_SEARCH_NODE:
        return f"{where} does not run the Zoekt search service; it takes no index."
    if reason == Reason.MOVE_TARGET_OFFLINE:
        return f"{where} is offline: its last heartbeat was at {node.last_seen_at.isoformat()}."
    if reason in (Reason.MOVE_TARGET_RESTARTING, Reason.MOVE_TARGET_SHUTTING_DOWN):
        return _maintenance(node, where)
    if reason == Reason.MOVE_TARGET_COOLING_DOWN:
        until = node.eviction_cooldown_until.isoformat()
        return f"{where} is cooling down after an eviction until {until}; it takes nothing."
    if reason == Reason.MOVE_TARGET_HOLDS_NAMESPACE:
        return (
            f"{where} holds an index of namespace {index.namespace_id} already: a namespace "
            "has at most one index per node, so the replacement cannot go there."
        )
    if reason == Reason.MOVE_TARGET_OVER_MEMORY_WATERMARK:
        return f"{where} is over its high memory watermark: it takes no new index."
    if reason == Reason.MOVE_TARGET_NO_MEMORY_ROOM:
        return _memory(node, where, facts)
    if reason == Reason.MOVE_TARGET_NO_DISK_ROOM:
        return _disk(node, where, facts)
    return f"{where} cannot take index {index.id} now."


def _maintenance(node: Node, where: str) -> str:
    record = NodeShutdown.objects.live().filter(node_id=node.id).order_by("-id").first()
    if record is None:  # ended since the check: say what the check saw
        return f"{where} is in maintenance."
    if record.type == NodeShutdown.Type.RESTART:
        return (
            f"{where} is being restarted (shutdown record {record.id}, by "
            f"{record.requested_by}; its allowed delay ends at "
            f"{record.delay_expires_at.isoformat()}): it takes nothing new until then."
        )
    return (
        f"{where} is being shut down ({record.type}, shutdown record {record.id}, by "
        f"{record.requested_by}): it takes nothing new."
    )


def _disk(node: Node, where: str, facts: moves.TargetFacts) -> str:
    if node.total_bytes <= 0:
        return f"{where} has reported no disk size yet."
    inbound = facts.inbound.get(node.id, 0)
    after = node.used_bytes + inbound + facts.size_bytes
    heading = f"{binary_size(inbound)} of live moves heading to it + " if inbound else ""
    return (
        f"{where} lacks disk room: {binary_size(node.used_bytes)} used + {heading}"
        f"{binary_size(facts.size_bytes)} of index {facts.index.id} is "
        f"{after / node.total_bytes:.0%} of its {binary_size(node.total_bytes)}, at or over "
        f"the {facts.ceiling:.0%} a move's target must stay under."
    )


def _memory(node: Node, where: str, facts: moves.TargetFacts) -> str:
    ratio = app_settings.current().memory_ratio
    size = memory.repository_bytes_by_index([facts.index.id]).get(facts.index.id, 0)
    estimate = memory.estimate_memory_bytes(size, ratio)
    return (
        f"{where} lacks memory room: its estimated memory plus the index's "
        f"{binary_size(estimate)} would reach the high memory watermark of its budget."
    )
