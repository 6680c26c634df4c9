"""The rebalance reconciler: start moves towards the desired balance (docs/balance.md).

``planner.balance.desired_balance`` computes where every index should be;
``run_rebalance`` (beat entry ``rebalance-fleet``, every 5 minutes, and once
after a node joins: ``zoekt.hooks.rebalance_fleet_on_commit``) starts the
first of its moves with the move machinery, trigger ``rebalance``. Each move
builds the index's replacement on the node the desired balance named
(``details.planned_target_node_id``, asked again by every target rule when it
starts, ``eviction.moves.planned_target``) while the index serves, and swaps
it in once ready: no namespace goes dark.

* **Off** while ``zoekt_rebalance_enabled`` is off (``rebalance_disabled``).
* **Stands aside**, starting nothing and saying why (a ``Reason`` code and the
  nodes or moves behind it), while indexing is disabled or paused (no
  replacement could be built: ``indexing_disabled``, ``indexing_paused``),
  while an online node is over the high disk
  watermark (``rebalance_node_over_high_watermark``), or, with memory planning
  on, over the high memory watermark
  (``rebalance_node_over_high_memory_watermark``); while a node has a live
  shutdown record, a restart, a remove or a replace
  (``rebalance_node_shutting_down``); and while a move of eviction (node-level,
  index watermark, negative unclaimed, memory pressure, re-split:
  ``rebalance_eviction_moving``) or of a drain (``rebalance_drain_moving``) is
  live. Eviction and maintenance come first, and the fleet they leave is the
  one worth balancing. A move by hand does not hold it back (its namespace has
  a live move, so it stays where it is; its bytes count on its target).
* **Its own throttle**: at most ``zoekt_rebalance_max_moves`` rebalance moves
  live (planned or building) at once; a run starts at most that many less the
  live ones, in the desired balance's order, and the move throttles of every
  move (``eviction.moves.try_start``) decide when each builds: one that must
  wait stays planned, holding its slot, and the run stops there.
* **No index moves twice in 24 hours**: the indices a rebalance move took or
  built in the window hold their place in the desired balance's input
  (``eviction.balance_data.rebalanced_recently``).
* **Safe to run twice**: one run at a time (``LockKey.REBALANCE_FLEET``), and
  the move lease (one live move per index and per namespace, a unique index)
  makes a second start of the same move an ``IntegrityError``, caught in the
  move's own savepoint.

``balance_report`` is the convergence as data, the one function behind
``GET /api/v1/balance``, ``manage.py zoekt_balance --json`` and the metrics;
``index_balance_report`` the explain of one index in it, behind
``GET /api/v1/indices/<id>/balance`` and ``manage.py zoekt_balance --explain``, and
``index_explains`` that of several, for the namespace page.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from eviction import moves
from eviction.balance_data import (
    REBALANCE_WINDOW_SECONDS,
    BalanceInput,
    current_balance,
    rebalance_moves_since,
    rebalanced_recently,
    settling_nodes,
)
from planner.balance import Balance, IndexExplain, PlannedMove, explain_indices
from zoekt import app_settings, capacity, clock, drains, memory
from zoekt.logging import get_logger
from zoekt.models import Index, Move, Node, NodeShutdown
from zoekt.operator_errors import ObjectNotFound
from zoekt.reasons import Reason

log = get_logger(__name__)

REBALANCE = moves.REBALANCE
#: Triggers whose live moves do not hold the reconciler back: its own, and an operator's.
_NOT_IN_THE_WAY = (REBALANCE, moves.MANUAL)


@dataclasses.dataclass(frozen=True)
class StandAside:
    """Why the reconciler starts nothing now, and the nodes or moves behind it."""

    reason: Reason
    node_ids: tuple[int, ...] = ()
    move_ids: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "reason": str(self.reason),
            "node_ids": list(self.node_ids),
            "move_ids": list(self.move_ids),
        }


def standing_aside(settings: app_settings.ZoektSettings, now: datetime) -> StandAside | None:
    """The first cause for the reconciler to stand aside, or None. Every cause is read
    (three queries, whatever the fleet), then the first one found is taken. Indexing
    disabled or paused comes first (``indexing_disabled``, ``indexing_paused``): a move's
    replacement could not be built."""
    high = capacity.watermark_limits(app_settings.development_watermarks())[1]
    configured = settings.node_memory_budget_bytes
    over_disk, over_memory = [], []
    rows = (
        Node.objects.online(now)
        .order_by("id")
        .values_list("id", "used_bytes", "total_bytes", "metadata")
    )
    for node_id, used, total, metadata in rows:
        if total > 0 and capacity.storage_percent_used(used, total) >= high:
            over_disk.append(node_id)
        if configured is not None and memory.high_memory_watermark_exceeded(metadata, configured):
            over_memory.append(node_id)
    shutting_down = tuple(
        NodeShutdown.objects.live()
        .filter(node__isnull=False)
        .order_by("node_id")
        .values_list("node_id", flat=True)
    )
    others = list(
        Move.objects.live()
        .exclude(trigger__in=_NOT_IN_THE_WAY)
        .order_by("id")
        .values_list("id", "trigger")
    )
    evicting = tuple(move_id for move_id, trigger in others if trigger != drains.DRAIN)
    draining = tuple(move_id for move_id, trigger in others if trigger == drains.DRAIN)
    gate = settings.indexing_gate
    causes = (
        (gate is not None, StandAside(gate or Reason.INDEXING_DISABLED)),
        (over_disk, StandAside(Reason.REBALANCE_NODE_OVER_HIGH_WATERMARK, tuple(over_disk))),
        (
            over_memory,
            StandAside(Reason.REBALANCE_NODE_OVER_HIGH_MEMORY_WATERMARK, tuple(over_memory)),
        ),
        (shutting_down, StandAside(Reason.REBALANCE_NODE_SHUTTING_DOWN, shutting_down)),
        (evicting, StandAside(Reason.REBALANCE_EVICTION_MOVING, move_ids=evicting)),
        (draining, StandAside(Reason.REBALANCE_DRAIN_MOVING, move_ids=draining)),
    )
    return next((cause for present, cause in causes if present), None)


@dataclasses.dataclass
class Pass:
    """What one run of the reconciler found and did."""

    #: Rebalance moves live before the run, and the slots its throttle left.
    live: int = 0
    slots: int = 0
    #: The desired balance's moves when the run computed it (None: it did not).
    planned: int | None = None
    #: Converged: the desired balance asks for no move and no node is settling.
    converged: bool | None = None
    #: Nodes that shed nothing this run (``balance_data.settling_nodes``).
    settling: list[int] = dataclasses.field(default_factory=list)
    started: list[int] = dataclasses.field(default_factory=list)
    #: A move created planned, waiting for a slot of the move throttles.
    waiting: int | None = None
    no_target: list[int] = dataclasses.field(default_factory=list)
    already_moving: list[int] = dataclasses.field(default_factory=list)
    #: Indices of planned moves no longer ready where the balance saw them.
    gone: list[int] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_rebalance(*, now: datetime | None = None) -> dict[str, Any]:
    """One run of the reconciler: nothing while off or standing aside, else the first of the
    desired balance's moves its throttle allows, started (see the module)."""
    now = now or clock.now()
    settings = app_settings.current()
    if not settings.rebalance_enabled:
        return {"skipped": str(Reason.REBALANCE_DISABLED)}
    aside = standing_aside(settings, now)
    if aside is not None:
        return {"standing_aside": aside.as_dict()}
    done = Pass(live=Move.objects.live().filter(trigger=REBALANCE).count())
    done.slots = max(settings.rebalance_max_moves - done.live, 0)
    if done.slots:
        fleet, balance = current_balance(settings=settings, now=now)
        done.settling = sorted(settling_nodes(now))
        done.planned = len(balance.moves)
        done.converged = balance.converged and not done.settling
        _start_moves(balance, fleet.options.disk_ceiling, done, settings, now)
    log.info("rebalance_pass", **{key: value for key, value in done.as_dict().items() if value})
    return done.as_dict()


def _start_moves(
    balance: Balance,
    ceiling: float,
    done: Pass,
    settings: app_settings.ZoektSettings,
    now: datetime,
) -> None:
    """The balance's moves in order, each created in its own savepoint, until the run's
    slots are used or one must wait for the move throttles (it stays planned)."""
    for planned in balance.moves:
        if len(done.started) >= done.slots:
            return
        index = (
            Index.objects.filter(
                id=planned.index_id,
                zoekt_node_id=planned.from_node_id,
                state=Index.State.READY,
                zoekt_replica__isnull=False,
            )
            .select_related("zoekt_replica")
            .first()
        )
        if index is None:
            done.gone.append(planned.index_id)
            continue
        details = _details(planned, ceiling, balance)
        if moves.start_and_tally(index, REBALANCE, details, done, settings=settings, now=now):
            return


def _details(planned: PlannedMove, ceiling: float, balance: Balance) -> dict[str, Any]:
    """A rebalance move's record: its named target, and the desired balance's reason and
    dominant shares before and after, with the margin it cleared."""
    return {
        "critical": False,
        "target_ceiling": ceiling,
        "planned_target_node_id": planned.to_node_id,
        "balance": {**planned.as_dict(), "margin": balance.options.margin},
    }


# --------------------------------------------------------------------------- #
# Convergence as data
# --------------------------------------------------------------------------- #


def reconciler_state(settings: app_settings.ZoektSettings, now: datetime) -> dict[str, Any]:
    """Whether the reconciler is on, standing aside and why, and its live moves."""
    aside = standing_aside(settings, now) if settings.rebalance_enabled else None
    live = list(
        Move.objects.live().filter(trigger=REBALANCE).order_by("id").values_list("id", "state")
    )
    return {
        "enabled": settings.rebalance_enabled,
        "margin": settings.rebalance_margin,
        "max_moves": settings.rebalance_max_moves,
        "standing_aside": aside is not None,
        "standing_aside_reason": None if aside is None else str(aside.reason),
        "standing_aside_for": None if aside is None else aside.as_dict(),
        "moves_in_flight": len(live),
        "moves_building": sum(1 for _, state in live if state in moves.BUILDING_STATES),
        "move_ids_in_flight": [move_id for move_id, _ in live],
        "settling_node_ids": sorted(settling_nodes(now)),
    }


def last_24_hours(now: datetime) -> dict[str, Any]:
    """The rebalance moves of the window: made (by state), bytes moved, the indices pinned
    by them, and the redundant ones: a move of an index (by lineage) that a rebalance move
    of the window had moved already. The reconciler makes none; a count above 0 says an
    index moved back and forth."""
    since = now - timedelta(seconds=REBALANCE_WINDOW_SECONDS)
    rows = list(
        rebalance_moves_since(since)
        .order_by("id")
        .values_list("id", "state", "source_index_ref", "replacement_index_id", "bytes")
    )
    by_state: dict[str, int] = {}
    for _, state, *_rest in rows:
        by_state[state] = by_state.get(state, 0) + 1
    built = {replacement: move_id for move_id, _, _, replacement, _ in rows if replacement}
    redundant = [
        move_id
        for move_id, state, source, _, _ in rows
        if source in built and built[source] != move_id and state != Move.State.CANCELLED
    ]
    return {
        "window_seconds": REBALANCE_WINDOW_SECONDS,
        "moves": len(rows),
        "moves_by_state": dict(sorted(by_state.items())),
        "moves_done": by_state.get(Move.State.DONE, 0),
        "bytes_moved": sum(size for _, state, _, _, size in rows if state == Move.State.DONE),
        "redundant_moves": len(redundant),
        "redundant_move_ids": redundant,
        "pinned_index_ids": sorted(rebalanced_recently(now)),
    }


def balance_report(
    *,
    margin: float | None = None,
    max_moves: int | None = None,
    progress: Callable[[int], None] | None = None,
    now: datetime | None = None,
) -> tuple[BalanceInput, Balance, dict[str, Any]]:
    """The fleet, its desired balance, and the report of both: the balance's figures
    (``Balance.as_dict``), the reconciler's state and the window's moves. The one source
    of the API, the command's JSON and the metrics (a fixed number of queries)."""
    now = now or clock.now()
    settings = app_settings.current()
    fleet, balance = current_balance(
        margin=margin, max_moves=max_moves, progress=progress, settings=settings, now=now
    )
    report = {
        **balance.as_dict(),
        "reconciler": reconciler_state(settings, now),
        "last_24_hours": last_24_hours(now),
    }
    return fleet, balance, report


def index_explains(
    index_ids: list[int],
    *,
    margin: float | None = None,
    max_moves: int | None = None,
    progress: Callable[[int], None] | None = None,
    now: datetime | None = None,
) -> tuple[BalanceInput, Balance, list[IndexExplain]]:
    """The fleet, its desired balance (the reconciler's: the report's), and the explain of
    each of ``index_ids`` in it (``planner.balance.explain_indices``); an id the fleet does
    not hold is ``ObjectNotFound`` naming ``index_id``. Read-only, in the queries of the
    desired balance's input, whatever the number of ids."""
    settings = app_settings.current()
    fleet, balance = current_balance(
        margin=margin,
        max_moves=max_moves,
        progress=progress,
        settings=settings,
        now=now or clock.now(),
    )
    held = {index.id for index in fleet.indices}
    for index_id in index_ids:
        if index_id not in held:
            raise ObjectNotFound("index_id", f"Zoekt index {index_id} not found.")
    return (
        fleet,
        balance,
        explain_indices(fleet.nodes, fleet.indices, index_ids, fleet.options, balance=balance),
    )


def index_balance_report(
    index_id: int,
    *,
    margin: float | None = None,
    max_moves: int | None = None,
    progress: Callable[[int], None] | None = None,
    now: datetime | None = None,
) -> tuple[BalanceInput, IndexExplain, dict[str, Any]]:
    """The explain of one index (``IndexExplain.as_dict``), with its root namespace and the
    reconciler's state: whether anything moves now at all. The one source of the API and
    the command's JSON."""
    now = now or clock.now()
    fleet, _balance, (explain,) = index_explains(
        [index_id], margin=margin, max_moves=max_moves, progress=progress, now=now
    )
    report = {
        **explain.as_dict(),
        "namespace_id": fleet.namespace_ids.get(index_id),
        "reconciler": reconciler_state(app_settings.current(), now),
    }
    return fleet, explain, report
