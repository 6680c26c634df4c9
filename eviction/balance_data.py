"""The desired balance of the fleet as it is now: the database edge of
``planner.balance`` (docs/balance.md). Read-only: it writes nothing and starts nothing.

``balance_input`` reads the fleet in a fixed number of queries, whatever its size,
and builds the pure function's input:

* every node, with its disk size and its used bytes plus the bytes of the live moves
  heading to it (a move's target is judged that way, ``eviction.moves.choose_target``),
  its memory budget while memory planning is on (``zoekt.memory.planning_budget``),
  and whether it may receive: not when the node-level rules of
  ``eviction.moves.target_refusal`` refuse it (not a search node, offline, being
  restarted, being shut down, cooling down after an eviction, over its high memory
  watermark), with that rule's code;
* every index of those nodes, in any state (an evicted or orphaned row keeps its
  node's slot for the namespace, as for a move), with its used bytes and its memory
  estimate (``zoekt.memory``, the estimate moves and the planner use; only ready and
  pre-ready indices have one). Only a ready index in a replica moves, and not while
  its namespace has a live move or while its node is offline or has a live shutdown
  record (restart, drain and replace own those); an index that may not move says why
  (``pinned_by``, the codes of the explain: docs/balance.md#explain);
* a node a move took an index off in the last 10 minutes (``settling_nodes``) sheds
  nothing: the disk it reports may still count the deleted copy until the space is
  freed, and a node that looks fuller than it is sheds too much;
* the indices the reconciler moved in the last 24 hours (``rebalanced_recently``: the
  source and the replacement of every rebalance move planned, started or done in the
  window) hold their place: no index moves twice in 24 hours (docs/balance.md);
* the options: the margin (the setting ``zoekt_rebalance_margin`` unless given), the
  disk ceiling of every move (``eviction.manual.ceiling``: the high watermark less
  the hysteresis band), memory on while memory planning is, and the high memory
  watermark.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q

from eviction import manual, moves
from eviction.moves import node_refusal, out_of_service
from planner.balance import (
    Balance,
    BalanceIndex,
    BalanceNode,
    BalanceOptions,
    desired_balance,
)
from zoekt import app_settings, clock, memory
from zoekt.models import Index, Move, Node, NodeShutdown
from zoekt.reasons import Reason

#: An index the reconciler moved holds its place this long (docs/balance.md).
REBALANCE_WINDOW_SECONDS = 24 * 3600
#: A node that gave up an index by a move this recently sheds nothing more: the disk it
#: reports still counts the copy it deleted until it frees the space (docs/balance.md).
SETTLE_SECONDS = 600


def rebalance_moves_since(since: datetime):
    """The rebalance moves planned, started or done since ``since`` (any state)."""
    return Move.objects.filter(trigger=moves.REBALANCE).filter(
        Q(created_at__gte=since) | Q(building_at__gte=since) | Q(done_at__gte=since)
    )


def rebalanced_recently(now: datetime) -> frozenset[int]:
    """The indices the reconciler moved in the window, by lineage: each such move's source
    and its replacement (the copy now serving in the source's place), so neither moves
    again by rebalance until 24 hours after the move was planned, started or done."""
    since = now - timedelta(seconds=REBALANCE_WINDOW_SECONDS)
    rows = rebalance_moves_since(since).values_list("source_index_ref", "replacement_index_id")
    return frozenset(ref for row in rows for ref in row if ref is not None)


def settling_nodes(now: datetime) -> frozenset[int]:
    """The nodes a move (of any trigger) took an index off in the last ``SETTLE_SECONDS``:
    their reported use may still count it, so they shed nothing until it is gone."""
    since = now - timedelta(seconds=SETTLE_SECONDS)
    done = Move.objects.filter(state=Move.State.DONE, done_at__gte=since)
    return frozenset(done.exclude(source_node_id=None).values_list("source_node_id", flat=True))


@dataclass(frozen=True)
class BalanceInput:
    """The fleet as ``planner.balance.desired_balance`` takes it, and what a report adds."""

    nodes: tuple[BalanceNode, ...]
    indices: tuple[BalanceIndex, ...]
    options: BalanceOptions
    #: ``{index id: root namespace id}``, to name a move's namespace.
    namespace_ids: dict[int, int]


@dataclass(frozen=True)
class _Facts:
    """What the receiving rules read besides the node row, read once for every node."""

    now: datetime
    restarting: frozenset[int]
    shutting_down: frozenset[int]
    in_maintenance: frozenset[int]
    memory_budget: int | None


def _facts(now: datetime, settings: app_settings.ZoektSettings) -> _Facts:
    live = NodeShutdown.objects.live().filter(node__isnull=False)
    restarting, shutting_down = out_of_service(now)
    return _Facts(
        now=now,
        restarting=restarting,
        shutting_down=shutting_down,
        in_maintenance=frozenset(live.values_list("node_id", flat=True)),
        memory_budget=settings.node_memory_budget_bytes,
    )


def not_receiving(node: Node, facts: _Facts) -> Reason | None:
    """Why the node may take no index now (the move target rules about the node alone,
    ``eviction.moves.node_refusal``, and its memory watermark, with their codes), or
    None. The rules about the index (its namespace, its disk and memory room) are the
    pure function's."""
    refusal = node_refusal(node, facts)
    if refusal is not None:
        return refusal
    if memory.excluded_from_placement(node.metadata or {}, facts.memory_budget):
        return Reason.MOVE_TARGET_OVER_MEMORY_WATERMARK
    return None


def balance_input(
    *,
    margin: float | None = None,
    max_moves: int | None = None,
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
) -> BalanceInput:
    """The fleet as it is now, as the desired balance's input (read-only)."""
    settings = settings or app_settings.current()
    now = now or clock.now()
    facts = _facts(now, settings)
    inbound = moves.live_bytes_by_node("target_node_id")
    nodes = []
    for node in Node.objects.order_by("id"):
        refusal = not_receiving(node, facts)
        nodes.append(
            BalanceNode(
                id=node.id,
                name=node.name,
                total_bytes=max(node.total_bytes, 0),
                used_bytes=max(node.used_bytes, 0) + inbound.get(node.id, 0),
                memory_budget_bytes=_budget(node, settings),
                receiving=refusal is None,
                not_receiving_reason=None if refusal is None else str(refusal),
                zone=node.zone,
            )
        )
    offline = {n.id for n in nodes if n.not_receiving_reason == Reason.MOVE_TARGET_OFFLINE}
    pinned_nodes: dict[int, list[str]] = {}
    for node_ids, code in (
        (offline, Reason.BALANCE_SOURCE_OFFLINE),
        (facts.in_maintenance, Reason.BALANCE_SOURCE_IN_MAINTENANCE),
        (settling_nodes(now), Reason.BALANCE_SOURCE_SETTLING),
    ):
        for node_id in node_ids:
            pinned_nodes.setdefault(node_id, []).append(str(code))
    pinned = rebalanced_recently(now)
    indices, namespace_ids = _indices(settings, pinned_nodes, pinned)
    options = BalanceOptions(
        margin=settings.rebalance_margin if margin is None else margin,
        disk_ceiling=manual.ceiling(),
        memory=settings.node_memory_budget_bytes is not None,
        high_memory_watermark=memory.memory_watermark_limits()[1],
        max_moves=max_moves,
    )
    return BalanceInput(tuple(nodes), tuple(indices), options, namespace_ids)


def _budget(node: Node, settings: app_settings.ZoektSettings) -> int | None:
    budget = memory.planning_budget(node.metadata or {}, settings.node_memory_budget_bytes)
    return budget if budget is not None and budget > 0 else None


def _indices(
    settings: app_settings.ZoektSettings,
    pinned_nodes: dict[int, list[str]],
    pinned: frozenset[int],
) -> tuple[list[BalanceIndex], dict[int, int]]:
    """Every index, with its memory estimate and whether it may move (two queries, and
    one for the namespaces with a live move), and when not, why (the codes of the
    explain): not ready or in no replica, its namespace moving, its node's codes
    (``pinned_nodes``), moved by the reconciler in the window (``pinned``)."""
    moving = set(Move.objects.live().values_list("zoekt_enabled_namespace_id", flat=True))
    rows = list(
        Index.objects.order_by("id").values_list(
            "id",
            "zoekt_node_id",
            "zoekt_enabled_namespace_id",
            "zoekt_replica_id",
            "used_storage_bytes",
            "state",
            "namespace_id",
        )
    )
    repository = memory.repository_bytes_by_index(row[0] for row in rows)
    ratio = settings.memory_ratio
    out = []
    for index_id, node_id, enabled_id, replica_id, used, state, _ns in rows:
        pinned_by = [
            str(code)
            for code, holds in (
                (Reason.MOVE_INDEX_NOT_READY, state != Index.State.READY or replica_id is None),
                (Reason.MOVE_ALREADY_MOVING, enabled_id in moving),
            )
            if holds
        ]
        pinned_by += pinned_nodes.get(node_id, ())
        if index_id in pinned:
            pinned_by.append(str(Reason.BALANCE_MOVED_RECENTLY))
        out.append(
            BalanceIndex(
                id=index_id,
                node_id=node_id,
                enabled_namespace_id=enabled_id,
                replica_id=replica_id,
                used_bytes=max(used or 0, 0),
                estimated_memory_bytes=memory.estimate_memory_bytes(
                    repository.get(index_id, 0), ratio
                ),
                movable=not pinned_by,
                pinned_by=tuple(pinned_by),
            )
        )
    return out, {row[0]: row[6] for row in rows}


def current_balance(
    *,
    margin: float | None = None,
    max_moves: int | None = None,
    progress: Callable[[int], None] | None = None,
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
) -> tuple[BalanceInput, Balance]:
    """The fleet now and its desired balance (read-only: nothing is started)."""
    fleet = balance_input(margin=margin, max_moves=max_moves, settings=settings, now=now)
    return fleet, desired_balance(fleet.nodes, fleet.indices, fleet.options, progress=progress)
