"""Moves: build the replacement of an index on another node while it serves, then swap.

A move replaces the "delete" step of a node-level eviction decision
(``eviction.actions.do_apply_decision`` with ``zoekt_eviction_moves`` on):
the policy chooses the indices to take off the node exactly as before, and
for each chosen index ``start_moves`` places its replacement on another
node that holds no index of the namespace, in the decision's transaction,
with its reservation counted on the target at once. The replacement index
covers the same project range and sits in a replica of its own while it is
built (so the serving replica's state never changes, and search, which
leaves a live move's replacement replica out, never sees a partial copy).
The old index stays ready in its replica and keeps answering searches.

``advance_moves`` (beat, every minute) walks the live moves, one
transaction each, the move row locked (``skip_locked``: a second worker
passes over it):

* ``building``: the replacement index turned ready → ``ready_to_swap``
  and the swap is tried at once; the deadline passed, the target node or
  the replacement is gone → ``parked`` (the replacement is retired, the old
  copy still serves; an operator reads why);
* ``ready_to_swap`` → ``swapping`` → ``done``: with the enabled namespace
  row locked (two swaps of one namespace run one after the other), re-check
  that the replacement index is ready on a searchable node and that the
  source index is still in its replica; only then, in that transaction, the
  replacement joins the source's replica in the source's place and the
  source index, and only it, is evicted through
  ``zoekt.actions.do_evict_index`` (the single-index path); the emptied
  build replica goes. The serving replica is whole at every instant. A
  failed re-check sends the move back to ``building``.

Delete-first is used only when the node is at the critical watermark and no
node has room for a second copy; each such index gets a ``fallen_back``
move with its reason (its replica is deleted, as GitLab's eviction does).

Each step is idempotent: run twice, a step finds the move in its next state
and does nothing more. The database refuses a second live move of one
index or one namespace (``zoekt_moves``' partial unique indexes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import IntegrityError, transaction
from django.db.models import Count

from eviction import resplit
from eviction.resplit import Carve, carved_repositories, create_carve, narrowed
from planner.filters import share_left
from zoekt import actions, app_settings, capacity, clock, memory, transitions
from zoekt.audit import Action, Actor, Target, audited
from zoekt.logging import get_logger
from zoekt.models import (
    EnabledNamespace,
    Index,
    Move,
    Node,
    Replica,
    Repository,
    Task,
)
from zoekt.reasons import Reason
from zoekt.scheduling.task_creation import create_bulk_tasks

log = get_logger(__name__)

NODE_LEVEL = "node_level"
#: The trigger of a move an operator asks for by hand (``eviction.manual``).
MANUAL = "manual"
#: The trigger of a move towards the desired balance (``eviction.rebalance``).
REBALANCE = "rebalance"


@dataclass
class MoveStart:
    """What ``start_moves`` did with a decision's chosen indices."""

    moves: list[Move] = field(default_factory=list)
    #: ``{"index_id", "reason"}`` of the chosen indices not moved and left serving.
    not_moved: list[dict[str, Any]] = field(default_factory=list)
    #: Replica ids to delete first (critical watermark, no target): recorded fallbacks.
    fallback_replica_ids: list[int] = field(default_factory=list)


def start_moves(
    chosen: Iterable[Any],
    *,
    source: Node,
    trigger: str,
    critical: bool,
    target_ceiling: float,
    decision_id: int | None = None,
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
) -> MoveStart:
    """Start a move for each chosen index (``eviction.policy.Chosen``); in the caller's
    transaction, which holds the source node's row lock."""
    settings = settings or app_settings.current()
    now = now or clock.now()
    out = MoveStart()
    for item in chosen:
        index = (
            Index.objects.select_related("zoekt_replica")
            .filter(id=item.index_id, zoekt_node_id=source.id)
            .first()
        )
        if index is None or index.zoekt_replica_id is None:
            continue
        plan = {"critical": critical, "target_ceiling": target_ceiling}
        move, outcome = start_move(
            index, trigger, plan, settings=settings, now=now, decision_id=decision_id
        )
        if outcome == Reason.MOVE_ALREADY_MOVING:
            out.not_moved.append({"index_id": index.id, "reason": str(outcome)})
        elif outcome == Reason.MOVE_NO_TARGET:
            _not_moved(out, index, outcome, critical, trigger, now)
        else:
            out.moves.append(move)
    return out


class StartTally(Protocol):
    """What a job that starts moves one by one keeps of them (a drain's pass, a rebalance
    run): ``start_and_tally`` notes each outcome."""

    started: list[int]
    waiting: int | None
    already_moving: list[int]
    no_target: list[int]


def start_and_tally(
    index: Index,
    trigger: str,
    details: dict[str, Any],
    done: StartTally,
    *,
    settings: app_settings.ZoektSettings,
    now: datetime,
) -> bool:
    """``start_move``, its outcome noted in ``done``: the move's id when it builds or
    waits, the index's id when the lease refuses it or no node can take it (it stays
    serving). True when the move waits for a throttle slot: the caller stops there (one
    move waits planned, no more)."""
    move, outcome = start_move(index, trigger, details, settings=settings, now=now)
    if outcome is None:
        done.started.append(move.id)
    elif outcome == Reason.MOVE_THROTTLED:
        done.waiting = move.id
        return True
    elif outcome == Reason.MOVE_ALREADY_MOVING:
        done.already_moving.append(index.id)  # another index of the namespace moves
    else:
        done.no_target.append(index.id)
    return False


def start_move(
    index: Index,
    trigger: str,
    details: dict[str, Any],
    *,
    settings: app_settings.ZoektSettings,
    now: datetime,
    **fields: Any,
) -> tuple[Move | None, Reason | None]:
    """A planned move of ``index``, created in its own savepoint, and started if the
    throttles and a target allow (``try_start``): ``(move, None)`` when it builds,
    ``(move, move_throttled)`` when it waits planned, ``(None, move_already_moving)``
    when the lease refuses it (a live move of the index or of its namespace), and
    ``(None, move_no_target)`` when no node can take it: not a move after all, its record
    is deleted (it would hold the lease)."""
    try:
        with transaction.atomic():
            move = Move.objects.create(
                **Move.fields_from_source(index, trigger, now),
                state=Move.State.PLANNED,
                details=details,
                **fields,
            )
    except IntegrityError:
        return None, Reason.MOVE_ALREADY_MOVING
    outcome = try_start(move, index, settings=settings, now=now)
    if outcome == Reason.MOVE_NO_TARGET:
        move.delete()
        return None, outcome
    return move, outcome


#: The states that use a throttle slot (a planned move waits for one).
BUILDING_STATES = (Move.State.BUILDING, Move.State.READY_TO_SWAP, Move.State.SWAPPING)


def try_start(
    move: Move, index: Index, *, settings: app_settings.ZoektSettings, now: datetime
) -> Reason | None:
    """Start building ``move`` (planned) if the throttles and a target allow: None when
    it started, ``move_throttled`` when it waits (planned), ``move_no_target`` when no
    node has room for it."""
    building = Move.objects.filter(state__in=BUILDING_STATES)
    critical = bool(move.details.get("critical"))
    ceiling = float(move.details.get("target_ceiling", 0.70))
    throttled = building.filter(source_node_id=move.source_node_id).count() >= (
        settings.move_max_per_source
    ) or (not critical and building.count() >= settings.move_max_in_cluster)
    busy = set(
        building.exclude(target_node_id=None)
        .values("target_node_id")
        .annotate(n=Count("id"))
        .filter(n__gte=settings.move_max_per_target)
        .values_list("target_node_id", flat=True)
    )
    if move.details.get("replace_target_node_id") is not None:
        _check_replace_target(move, index, ceiling=ceiling, settings=settings, now=now)
    if move.details.get("carve") or move.details.get("planned_target_node_id"):
        target, skipped_busy = planned_target(move, index, now=now, busy=busy)
    else:
        # A retry prefers a node its earlier attempts did not fail on, if there is one.
        avoid = set(move.details.get("failed_targets", []))
        for avoiding in (avoid, set()) if avoid else (avoid,):
            target, skipped_busy = choose_target(
                index,
                move.bytes,
                ceiling=ceiling,
                settings=settings,
                now=now,
                busy=busy,
                avoid=avoiding,
            )
            if target is not None or skipped_busy:
                break
    if target is None and not skipped_busy:
        return Reason.MOVE_NO_TARGET
    if throttled or target is None:
        if move.reason != Reason.MOVE_THROTTLED:
            move.transition(Move.State.PLANNED, now, reason=str(Reason.MOVE_THROTTLED))
        return Reason.MOVE_THROTTLED
    _build(move, index, target, now)
    return None


def _check_replace_target(
    move: Move, index: Index, *, ceiling: float, settings: app_settings.ZoektSettings, now: datetime
) -> None:
    """A replace's move goes to the named node (``planned_target_node_id``) while
    ``target_refusal`` (the target rules every move obeys) does not refuse it, asked
    again each time the move is about to start; when it does, the move falls back to
    the balanced choice for good, and says why (``details.replace_fallback``). Falling
    back rather than waiting: a target that cannot take this index now (it holds
    another index of the namespace, or its disk or memory is short) may never take it,
    and the node being replaced must empty."""
    named = move.details["replace_target_node_id"]
    if move.details.get("planned_target_node_id") != named:
        return  # fell back already
    node = Node.objects.filter(id=named).first()
    if node is None:
        refusal = Reason.MOVE_TARGET_OFFLINE  # its row is gone
    else:
        facts = target_facts(index, move.bytes, [node], ceiling=ceiling, settings=settings, now=now)
        refusal = target_refusal(node, facts)
    if refusal is None:
        return
    details = {key: value for key, value in move.details.items() if key != "planned_target_node_id"}
    details["replace_fallback"] = {
        "target_node_id": named,
        "reason": str(Reason.REPLACE_TARGET_DOES_NOT_FIT),
        "refused_by": str(refusal),
        "at": now.isoformat(),
    }
    move.details = details
    move.save(update_fields=["details", "updated_at"])
    log.info("replace_target_fallback", move_id=move.id, target_node_id=named, refusal=refusal)


def turn_back(move: Move, reason: Reason, now: datetime) -> str:
    """A replacement building on a node that is now being drained: retired (the source
    never stopped serving) and the move planned again at once, for another node (its
    target joins ``failed_targets``). Not a failed attempt: nothing failed. The caller
    holds the move's row lock."""
    actions.do_retire_replacement(move, now=now)
    failed = sorted({*move.details.get("failed_targets", []), move.target_node_id} - {None})
    turned = [
        *move.details.get("turned_back", []),
        {"at": now.isoformat(), "reason": str(reason), "target_node_id": move.target_node_id},
    ]
    log.info("move_turned_back", move_id=move.id, target_node_id=move.target_node_id)
    return move.transition(
        Move.State.PLANNED,
        now,
        reason=str(reason),
        target_node=None,
        replacement_replica=None,
        replacement_index=None,
        deadline_at=None,
        details={**move.details, "failed_targets": failed, "turned_back": turned},
    )


def start_planned_move(
    index_id: int,
    *,
    trigger: str,
    target_node_id: int,
    details: dict[str, Any],
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
) -> Move | None:
    """A move of one ready index to a node a policy chose (memory pressure), in its own
    transaction; None when the index is gone, already moving, or the node cannot take it."""
    settings = settings or app_settings.current()
    now = now or clock.now()
    with transaction.atomic():
        index = (
            Index.objects.select_for_update()
            .filter(id=index_id, state=Index.State.READY, zoekt_replica__isnull=False)
            .first()
        )
        if index is None:
            return None
        plan = {
            "critical": False,
            "target_ceiling": 0.70,
            "planned_target_node_id": target_node_id,
            **details,
        }
        move, _outcome = start_move(index, trigger, plan, settings=settings, now=now)
    return move


def _not_moved(
    out: MoveStart, index: Index, reason: Reason, critical: bool, trigger: str, now: datetime
) -> None:
    """Leave it serving, or (critical, nowhere to go) delete first and record it."""
    if critical and reason == Reason.MOVE_NO_TARGET:
        out.fallback_replica_ids.append(index.zoekt_replica_id)
        Move.fall_back(
            now,
            **Move.fields_from_source(index, trigger, now),
            reason=str(Reason.MOVE_FALLBACK_CRITICAL_NO_TARGET),
            details={"why_not_moved": str(reason)},
        )
        return
    out.not_moved.append({"index_id": index.id, "reason": str(reason)})


def choose_target(
    index: Index,
    size_bytes: int,
    *,
    ceiling: float,
    settings: app_settings.ZoektSettings,
    now: datetime,
    busy: set[int] = frozenset(),
    avoid: set[int] = frozenset(),
) -> tuple[Node | None, bool]:
    """The node a replacement goes to (or None), and whether a node with room was passed
    over only because it builds ``zoekt_move_max_per_target`` replacements already
    (``busy``): then the move waits rather than gives up.

    Candidates: the nodes ``target_refusal`` does not refuse: online search nodes,
    not cooling down, not being restarted or drained (``Node.objects.in_shutdown``,
    docs/operations.md),
    holding no index of the namespace (the source included), and, while memory
    planning is on, not over the high memory watermark and with the memory for it
    (``_memory_room``). Headroom is real disk: the node's used bytes, plus the
    bytes of the live moves already heading to it (this decision's included: they
    were written earlier in this transaction), plus this index, must stay under
    ``ceiling`` (a share of its disk, the high watermark less the hysteresis
    band: a target never starts its own sustain clock). The reservation
    accounting is not the test: on a filled fleet every node's reservations
    claim its usable storage (a ready index settles at used ÷ 0.60 while there
    is room, a pending one holds the planner's buffer), so unclaimed storage
    says "full" long before the disk is. Among the nodes left, the least
    allocated by that projection (``planner.filters.share_left``, the balanced
    placement's score, of the disk it would have free); ties by id. With zones set,
    a node outside every zone that holds another replica of the namespace comes
    before any node inside one (``TargetFacts.zones_taken``): a replica goes into
    such a zone only when no other zone can take it (docs/planner.md, "Zones").
    """
    nodes = list(Node.objects.all())
    facts = target_facts(index, size_bytes, nodes, ceiling=ceiling, settings=settings, now=now)
    best: tuple[bool, float, int, Node] | None = None
    skipped_busy = waits_for_zone = False
    taken = facts.zones_taken
    for node in nodes:
        if node.id in avoid or target_refusal(node, facts) is not None:
            continue
        after = node.used_bytes + facts.inbound.get(node.id, 0) + size_bytes
        score = share_left(node.total_bytes - after, node.total_bytes)
        free_zone = node.zone is None or node.zone not in taken
        if node.id in busy:
            skipped_busy = True
            waits_for_zone = waits_for_zone or free_zone
            continue
        key = (free_zone, score, -node.id)
        if best is None or key > best[:3]:
            best = (*key, node)
    if best is not None and not best[0] and waits_for_zone:
        # A node in a free zone could take it once it has a slot: wait for it.
        return None, True
    return (None if best is None else best[3]), skipped_busy


@dataclass(frozen=True)
class TargetFacts:
    """What the target rules read besides the node row, read once for one index and the
    nodes it may go to (``target_facts``)."""

    index: Index
    size_bytes: int
    ceiling: float
    now: datetime
    #: Nodes holding an index of the namespace (any state: evicted and orphaned rows
    #: keep their slot, as in GitLab), the source included.
    holding: frozenset[int]
    #: Nodes in a restart's allowed delay (``Node.objects.in_restart``).
    restarting: frozenset[int]
    #: Nodes being drained (a live ``remove`` or ``replace``), or drained and not
    #: returned to service (``Node.objects.in_shutdown``, restarts aside).
    shutting_down: frozenset[int]
    #: ``{node id: bytes of the live moves heading to it}``.
    inbound: dict[int, int]
    #: ``zoekt_node_memory_budget_bytes``: memory planning is on when it is set.
    memory_budget: int | None
    #: Whether a node's memory takes the index (``_memory_room``), with memory planning on.
    room: Callable[[Node], bool] | None
    #: The zones of the nodes holding an index of another replica of the namespace: a
    #: target outside them is preferred (``choose_target``), not required.
    zones_taken: frozenset[str] = frozenset()


def target_facts(
    index: Index,
    size_bytes: int,
    nodes: list[Node],
    *,
    ceiling: float,
    settings: app_settings.ZoektSettings,
    now: datetime,
) -> TargetFacts:
    """The facts ``target_refusal`` needs for ``index`` going to any of ``nodes``."""
    configured = settings.node_memory_budget_bytes
    restarting, shutting_down = out_of_service(now)
    held = Index.objects.filter(
        zoekt_enabled_namespace_id=index.zoekt_enabled_namespace_id
    ).values_list("zoekt_node_id", "zoekt_replica_id", "zoekt_node__zone")
    holding = []
    zones_taken = set()
    for node_id, replica_id, zone in held:
        holding.append(node_id)
        if zone is not None and replica_id is not None and replica_id != index.zoekt_replica_id:
            zones_taken.add(zone)
    return TargetFacts(
        index=index,
        size_bytes=size_bytes,
        ceiling=ceiling,
        now=now,
        holding=frozenset(holding),
        zones_taken=frozenset(zones_taken),
        restarting=restarting,
        shutting_down=shutting_down,
        inbound=live_bytes_by_node("target_node_id"),
        memory_budget=configured,
        room=_memory_room(index, nodes, settings) if configured is not None else None,
    )


def out_of_service(now: datetime) -> tuple[frozenset[int], frozenset[int]]:
    """The ids of the nodes an operator is taking out of service: those in a restart's
    allowed delay, and those being drained or drained and not returned (the rest of
    ``Node.objects.in_shutdown``)."""
    restarting = frozenset(Node.objects.in_restart(now).values_list("id", flat=True))
    held = frozenset(Node.objects.in_shutdown(now).values_list("id", flat=True))
    return restarting, held - restarting


class NodeFacts(Protocol):
    """What ``node_refusal`` reads besides the node row (``TargetFacts`` has it)."""

    now: datetime
    restarting: frozenset[int]
    shutting_down: frozenset[int]


def node_refusal(node: Node, facts: NodeFacts) -> Reason | None:
    """The target rules about the node alone, whatever the index: the first it fails.
    ``target_refusal`` asks them first; the desired balance's receiving nodes are those
    they do not refuse (``eviction.balance_data``)."""
    if Node.Service.ZOEKT not in (node.services or []):
        return Reason.MOVE_TARGET_NOT_SEARCH_NODE
    if not node.is_online(facts.now):
        return Reason.MOVE_TARGET_OFFLINE
    if node.id in facts.restarting:
        return Reason.MOVE_TARGET_RESTARTING
    if node.id in facts.shutting_down:
        return Reason.MOVE_TARGET_SHUTTING_DOWN
    if node.eviction_cooldown_until is not None and node.eviction_cooldown_until > facts.now:
        return Reason.MOVE_TARGET_COOLING_DOWN
    return None


def target_refusal(node: Node, facts: TargetFacts) -> Reason | None:
    """Why ``node`` cannot take the replacement of ``facts.index`` (the first rule it
    fails, a stable code), or None when it fits. The one statement of the target rules:
    ``choose_target`` keeps the nodes it does not refuse, and a move by hand
    (``eviction.manual``) is refused with its answer. The move throttles are not a
    rule here: a busy node fits, and the move waits for a slot."""
    if node.id == facts.index.zoekt_node_id:
        return Reason.MOVE_TARGET_IS_SOURCE
    refusal = node_refusal(node, facts)
    if refusal is not None:
        return refusal
    if node.id in facts.holding:
        return Reason.MOVE_TARGET_HOLDS_NAMESPACE
    if node.total_bytes <= 0:
        return Reason.MOVE_TARGET_NO_DISK_ROOM
    if memory.excluded_from_placement(node.metadata or {}, facts.memory_budget):
        return Reason.MOVE_TARGET_OVER_MEMORY_WATERMARK
    if facts.room is not None and not facts.room(node):
        return Reason.MOVE_TARGET_NO_MEMORY_ROOM
    after = node.used_bytes + facts.inbound.get(node.id, 0) + facts.size_bytes
    if after / node.total_bytes >= facts.ceiling:
        return Reason.MOVE_TARGET_NO_DISK_ROOM
    return None


def _memory_room(index: Index, candidates: list[Node], settings: app_settings.ZoektSettings):
    """With memory planning on: whether a node's memory takes the index, by the planner's
    figures: the estimate of what it holds and builds (replacements already placed on it
    included) plus the index's, under the high memory watermark of its budget."""
    ratio = settings.memory_ratio
    held = memory.estimated_memory_by_node([node.id for node in candidates], ratio)
    size = memory.repository_bytes_by_index([index.id]).get(index.id, 0)
    estimate = memory.estimate_memory_bytes(size, ratio)
    _low, high, _critical = memory.memory_watermark_limits()

    def fits(node: Node) -> bool:
        budget = memory.planning_budget(node.metadata or {}, settings.node_memory_budget_bytes)
        return budget is None or held.get(node.id, 0) + estimate < high * budget

    return fits


def planned_target(
    move: Move, index: Index, *, now: datetime, busy: set[int] = frozenset()
) -> tuple[Node | None, bool]:
    """A re-split's carve (or a memory-pressure move, or a replace's move) goes to the node
    its plan chose, while that node is online for search, is not being restarted or
    drained and holds no index of the namespace (the plan checked its disk and memory;
    a replace's move asks ``target_refusal`` first, ``_check_replace_target``). A move
    by hand, or a rebalance move (the desired balance named its node, and it may have
    waited for a slot), goes to its node while ``target_refusal`` still does not refuse
    it."""
    carve = move.details.get("carve")
    node_id = carve["node_id"] if carve else move.details["planned_target_node_id"]
    holding = Index.objects.filter(
        zoekt_enabled_namespace_id=index.zoekt_enabled_namespace_id
    ).values("zoekt_node_id")
    node = (
        Node.objects.for_search()
        .online(now)
        .not_in_shutdown(now)
        .exclude(id__in=holding)
        .filter(id=node_id)
        .first()
    )
    if node is not None and node.id in busy:
        return None, True
    if node is not None and move.trigger in (MANUAL, REBALANCE):
        node = _still_fits(move, index, node, now)
    return node, False


def _still_fits(move: Move, index: Index, node: Node, now: datetime) -> Node | None:
    """A move by hand (or a rebalance move) that waited for a slot: its node is asked
    again, by every target rule, when it starts (the node may have filled, or gone into
    maintenance, since the request). A refusal is recorded in the move's details; the move
    is then cancelled (``move_no_target``) with nothing built."""
    facts = target_facts(
        index,
        move.bytes,
        [node],
        ceiling=float(move.details.get("target_ceiling", 0.70)),
        settings=app_settings.current(),
        now=now,
    )
    refusal = target_refusal(node, facts)
    if refusal is None:
        return node
    move.details = {**move.details, "refused_at_start": str(refusal)}
    Move.objects.filter(id=move.id).update(details=move.details)
    return None


def _build(move: Move, index: Index, target: Node, now: datetime) -> None:
    """Create the replacement on ``target`` and mark the move ``building``."""
    Node.objects.select_for_update().filter(id=target.id).first()
    replica = Replica.objects.create(
        zoekt_enabled_namespace_id=index.zoekt_enabled_namespace_id,
        namespace_id=index.namespace_id,
        state=Replica.State.PENDING,
        created_at=now,
        updated_at=now,
    )
    carve = move.details.get("carve")
    metadata = {
        key: value
        for key in ("project_namespace_id_from", "project_namespace_id_to")
        if (value := (carve or index.metadata).get(key)) is not None
    }
    # The ideal reservation of the index's known size (used ÷ 0.60, what the storage
    # refresh settles a ready index at), counted on the target at once. Reserving only
    # the used bytes would put the ready replacement at its critical index watermark
    # (used ÷ reserved ≥ 0.80), and that trigger would move it again.
    reserved = int(move.bytes / capacity.STORAGE_IDEAL_PERCENT_USED)
    replacement = Index.objects.create(
        zoekt_enabled_namespace_id=index.zoekt_enabled_namespace_id,
        zoekt_replica=replica,
        zoekt_node=target,
        namespace_id=index.namespace_id,
        state=Index.State.PENDING,
        reserved_storage_bytes=reserved,
        metadata=metadata,
        created_at=now,
        updated_at=now,
    )
    move.transition(
        Move.State.BUILDING,
        now,
        reason="",
        project_namespace_id_from=metadata.get("project_namespace_id_from"),
        project_namespace_id_to=metadata.get("project_namespace_id_to"),
        target_node=target,
        replacement_replica=replica,
        replacement_index=replacement,
        deadline_at=now + timedelta(seconds=Move.deadline_seconds(move.bytes)),
        details={**move.details, "reserved_on_target_bytes": reserved},
    )
    log.info(
        "move_started",
        move_id=move.id,
        namespace_id=index.namespace_id,
        source_node_id=index.zoekt_node_id,
        target_node_id=target.id,
        bytes=move.bytes,
    )


def live_bytes_by_node(end: str = "source_node_id") -> dict[int, int]:
    """``{node id: bytes of the live moves leaving it}`` (``end="target_node_id"``: heading
    to it), in one query."""
    out: dict[int, int] = {}
    for node_id, size in Move.objects.live().values_list(end, "bytes"):
        if node_id is not None:
            out[node_id] = out.get(node_id, 0) + size
    return out


# --------------------------------------------------------------------------- #
# Advancing the live moves
# --------------------------------------------------------------------------- #


def advance_moves(*, now: datetime | None = None) -> dict[str, int]:
    """Take every live move one step further (idempotent; safe beside a second run)."""
    now = now or clock.now()
    counts: dict[str, int] = {}
    for move_id in list(Move.objects.live().order_by("id").values_list("id", flat=True)):
        outcome = advance_move(move_id, now=now)
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def advance_move(move_id: int, *, now: datetime | None = None) -> str:
    """One step of one move, in one transaction; returns the state it is left in."""
    now = now or clock.now()
    with transaction.atomic():
        move = Move.objects.select_for_update(skip_locked=True).filter(id=move_id).first()
        if move is None:
            return "locked"
        if not move.live:
            return move.state
        if move.state == Move.State.PLANNED:
            return _planned(move, now)
        if move.state == Move.State.BUILDING:
            return _building(move, now)
        return _swap(move, now)


def _planned(move: Move, now: datetime) -> str:
    """A queued move: start it when a slot and a target free up; give up (cancelled)
    when its source is gone or no node has room any more."""
    index = Index.objects.filter(id=move.source_index_ref, state=Index.State.READY).first()
    if index is None or index.zoekt_replica_id is None:
        return move.transition(Move.State.CANCELLED, now, reason=str(Reason.MOVE_SOURCE_GONE))
    retry_at = move.details.get("retry_at")
    if retry_at and datetime.fromisoformat(retry_at) > now:
        return move.state  # backing off after a failed build
    outcome = try_start(move, index, settings=app_settings.current(), now=now)
    if outcome == Reason.MOVE_NO_TARGET and move.details.get("attempts", 1) > 1:
        # A retry with nowhere to go yet (the failed replacement's row may still hold
        # its node until the node deletes it): one more failed attempt, then parked.
        return _park(move, Reason.MOVE_NO_TARGET, now)
    if outcome == Reason.MOVE_NO_TARGET:
        return move.transition(Move.State.CANCELLED, now, reason=str(Reason.MOVE_NO_TARGET))
    return move.state


def _building(move: Move, now: datetime) -> str:
    replica = (
        Replica.objects.filter(id=move.replacement_replica_id).first()
        if move.replacement_replica_id
        else None
    )
    if replica is None:
        return _park(move, Reason.MOVE_REPLACEMENT_LOST, now)
    if move.target_node_id is None:
        return _park(move, Reason.MOVE_TARGET_LOST, now)
    replacement = Index.objects.filter(id=move.replacement_index_id).first()
    if replacement is None or replacement.zoekt_replica_id != replica.id:
        return _park(move, Reason.MOVE_REPLACEMENT_LOST, now)
    if replacement.state == Index.State.READY:
        move.transition(Move.State.READY_TO_SWAP, now)
        return _swap(move, now)
    if move.deadline_at is not None and now > move.deadline_at:
        return _park(move, Reason.MOVE_DEADLINE_PASSED, now)
    return move.state


#: Attempts at building a replacement before the move is parked, and the wait
#: before the second (doubled before each further one).
MAX_ATTEMPTS = 3
RETRY_BACKOFF_SECONDS = 600


def _park(move: Move, reason: Reason, now: datetime) -> str:
    """The build failed: retire what was built (the source still serves), then try
    again after a backoff (another target, for a move that chose its own), or, out of
    attempts, park: say why, keep the record, wait for an operator."""
    attempts = int(move.details.get("attempts", 1))
    history = [
        *move.details.get("failures", []),
        {"at": now.isoformat(), "reason": str(reason), "target_node_id": move.target_node_id},
    ]
    if attempts < MAX_ATTEMPTS:
        actions.do_retire_replacement(move, now=now)
        wait = RETRY_BACKOFF_SECONDS * 2 ** (attempts - 1)
        failed = sorted({*move.details.get("failed_targets", []), move.target_node_id} - {None})
        log.warning("move_retrying", move_id=move.id, reason=str(reason), wait_seconds=wait)
        return move.transition(
            Move.State.PLANNED,
            now,
            reason=str(Reason.MOVE_RETRYING),
            target_node=None,
            replacement_replica=None,
            replacement_index=None,
            deadline_at=None,
            details={
                **move.details,
                "attempts": attempts + 1,
                "retry_at": (now + timedelta(seconds=wait)).isoformat(),
                "failed_targets": failed,
                "failures": history,
            },
        )
    return actions.do_park_move(
        move, reason, details={**move.details, "failures": history}, now=now
    )


def _catch_up(source: Index, replacement: Index, now: datetime, carve=None) -> int:
    """How many of the source's ready projects (of the carved range, for a re-split's
    carve) the replacement does not hold ready yet; the missing ones get a repository
    row and an index task on the replacement."""
    mine = (
        carved_repositories(source, carve)
        if carve is not None
        else Repository.objects.filter(zoekt_index=source)
    )
    served = set(
        mine.filter(state=Repository.State.READY).values_list("project_identifier", flat=True)
    )
    held = dict(
        Repository.objects.filter(zoekt_index=replacement).values_list(
            "project_identifier", "state"
        )
    )
    missing = sorted(served - set(held))
    if missing:
        projects = dict(
            Repository.objects.filter(
                zoekt_index=source, project_identifier__in=missing
            ).values_list("project_identifier", "project_id")
        )
        Repository.objects.bulk_create(
            [
                Repository(
                    zoekt_index=replacement,
                    project_id=projects.get(pid),
                    project_identifier=pid,
                    retries_left=Repository.MODEL_DEFAULT_RETRIES_LEFT,
                    created_at=now,
                    updated_at=now,
                )
                for pid in missing
            ],
            ignore_conflicts=True,
        )
        create_bulk_tasks(
            Repository.objects.filter(zoekt_index=replacement, project_identifier__in=missing),
            Task.TaskType.INDEX_REPO,
            now,
        )
    not_ready = sum(1 for pid in served if pid in held and held[pid] != Repository.State.READY)
    return len(missing) + not_ready


def _swap(move: Move, now: datetime) -> str:
    """Put the replacement in the source's place once it serves, re-checked under locks."""
    EnabledNamespace.objects.select_for_update().filter(id=move.zoekt_enabled_namespace_id).first()
    replacement = (
        Index.objects.select_for_update().filter(id=move.replacement_index_id).first()
        if move.replacement_index_id
        else None
    )
    source = Index.objects.select_for_update().filter(id=move.source_index_ref).first()
    searchable = set(Node.objects.searchable(now).values_list("id", flat=True))
    ready = (
        replacement is not None
        and replacement.state == Index.State.READY
        and replacement.zoekt_node_id in searchable
    )
    if not ready:
        return move.transition(
            Move.State.BUILDING,
            now,
            reason=str(Reason.MOVE_NOT_COVERED),
            details={**move.details, "last_swap_refused": now.isoformat()},
        )
    carve = Carve.of(move.details["carve"]) if move.details.get("carve") else None
    if source is not None:
        behind = _catch_up(source, replacement, now, carve)
        if behind:
            # Projects the source took (or re-indexed) during the move: the replacement
            # indexes them first, so the swap loses none.
            return move.transition(
                Move.State.BUILDING,
                now,
                reason=str(Reason.MOVE_CATCHING_UP),
                details={**move.details, "catching_up_projects": behind},
            )
    move.transition(Move.State.SWAPPING, now)
    build_replica_id = replacement.zoekt_replica_id
    details = dict(move.details)
    serving = (
        source.zoekt_replica_id
        if source is not None and source.zoekt_replica_id is not None
        else Replica.objects.filter(id=move.source_replica_ref).values_list("id", flat=True).first()
    )
    if serving is not None:
        # In the source's replica, in its place: the serving replica stays whole. (If the
        # source index went meanwhile, with its node, the replacement fills its hole.)
        Index.objects.filter(id=replacement.id).update(zoekt_replica_id=serving, updated_at=now)
        if carve is not None and source is not None and source.zoekt_replica_id == serving:
            details.update(_narrow(source, carve, now))
        elif source is not None and source.zoekt_replica_id == serving:
            actions.do_evict_index(source.id, now=now)
            details["source_index_evicted"] = source.id
        else:
            details["source_gone_before_swap"] = True
        Replica.objects.filter(id=build_replica_id).delete()
    else:
        # The source's replica went meanwhile: the replacement's own replica is now the
        # namespace's copy of that range.
        details["source_gone_before_swap"] = True
    log.info("move_done", move_id=move.id, namespace_id=move.namespace_id)
    move.transition(Move.State.DONE, now, details=details, reason="")
    remaining = [Carve.of(c) for c in move.details.get("resplit", {}).get("remaining", [])]
    if remaining and source is not None and "source_narrowed_to" in details:
        # The re-split's next carve, in this transaction: the namespace is never
        # without its lease between two carves.
        following = create_carve(source, remaining, now=now)
        try_start(following, source, settings=app_settings.current(), now=now)
        details["next_move_id"] = following.id
        move.transition(Move.State.DONE, now, details=details)
    return Move.State.DONE


def _narrow(source: Index, carve: Carve, now: datetime) -> dict[str, Any]:
    """A carve's swap on the source: its range narrowed to what it keeps, and its
    repositories of the carved range marked for deletion (GitLab's pipeline then
    deletes them on the node). The source stays ready and keeps serving the rest."""
    low = source.metadata.get("project_namespace_id_from")
    high = source.metadata.get("project_namespace_id_to")
    low, high = narrowed(low, high, carve)
    metadata = dict(source.metadata)
    for key, value in (("project_namespace_id_from", low), ("project_namespace_id_to", high)):
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    Index.objects.filter(id=source.id).update(metadata=metadata, updated_at=now)
    leaving = transitions.mark_repositories_pending_deletion(
        carved_repositories(source, carve), now=now
    )
    return {"source_narrowed_to": [low, high], "repositories_leaving_source": leaving}


def start_resplit(
    root_namespace_id: int,
    *,
    index_id: int | None = None,
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
    actor: Actor | None = None,
) -> resplit.ResplitPlan:
    """``_start_resplit``, recorded in the audit trail (ok, or refused: ``resplit_refused``
    with the reason in words)."""
    with audited(
        actor,
        Action.NAMESPACE_RESPLIT_STARTED,
        Target("namespace", root_namespace_id),
        refusals=(resplit.ResplitError,),
        index_id=index_id,
    ) as entry:
        out = _start_resplit(root_namespace_id, index_id=index_id, settings=settings, now=now)
        entry.details.update(
            source_index_id=out.source_index_id,
            move_id=out.move_id,
            carves=len(out.carves),
        )
    return out


def _start_resplit(
    root_namespace_id: int,
    *,
    index_id: int | None = None,
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
) -> resplit.ResplitPlan:
    """Plan the re-split and queue its first carve as a planned move (started at once
    when the throttles allow). Nothing to carve (the plan keeps one index): no move."""
    settings = settings or app_settings.current()
    now = now or clock.now()
    out = resplit.plan_resplit(root_namespace_id, index_id=index_id, settings=settings, now=now)
    if not out.carves:
        return out
    with transaction.atomic():
        source = Index.objects.select_for_update().filter(id=out.source_index_id).first()
        if source is None or source.state != Index.State.READY:
            raise resplit.ResplitError("the index is no longer ready")
        try:
            with transaction.atomic():
                move = create_carve(source, out.carves, now=now)
        except IntegrityError as error:
            raise resplit.ResplitError(
                "the namespace has a live move already; try again when it ends"
            ) from error
        try_start(move, source, settings=settings, now=now)
        out.move_id = move.id
    return out
