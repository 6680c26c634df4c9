"""The eviction jobs: thin Celery tasks over ``eviction.actions``, one per trigger, and
GitLab's tail that evicts the replicas of pending-eviction indices.

The scheduling service (``zoekt.scheduling.service``) keeps GitLab's checks
and throttles and dispatches these by event name: ``EVICTION_EVENTS`` below,
registered with it when the app is ready (``EvictionConfig.ready``), since
zoekt imports nothing of eviction. Each job takes its advisory lock
(skipping while it is held, so two never decide at once), skips while
indexing is paused, runs one step and logs one line.
"""

from __future__ import annotations

from celery import shared_task

from eviction import actions, drain, memory_pressure, moves, rebalance
from zoekt.locks import LockKey
from zoekt.scheduling.events import run_event


@shared_task(name="eviction.evict_from_nodes")
def evict_from_nodes_task() -> dict:
    """Node-level eviction (trigger a): nodes over the high disk watermark."""
    return run_event("evict_from_nodes", actions.run_node_level, lock=LockKey.EVICTION_NODE_LEVEL)


@shared_task(name="eviction.mark_indices_pending_eviction")
def mark_indices_pending_eviction_task() -> dict:
    """IndexMarkAsPendingEvictionEventWorker (trigger b): indices over their critical watermark."""
    return run_event(
        "mark_indices_pending_eviction",
        actions.run_index_watermark,
        lock=LockKey.EVENT_MARK_INDICES_PENDING_EVICTION,
    )


@shared_task(name="eviction.evict_overcommitted_nodes")
def evict_overcommitted_nodes_task(node_ids: list[int]) -> dict:
    """NodeWithNegativeUnclaimedStorageEventWorker (trigger c): the listed nodes."""
    return run_event(
        "evict_overcommitted_nodes",
        lambda: actions.run_negative_unclaimed(node_ids),
        lock=LockKey.EVENT_EVICT_OVERCOMMITTED_NODES,
    )


@shared_task(name="zoekt.evict_indices")
def evict_indices_task() -> dict:
    """IndexToEvictEventWorker: evict the replicas of 1,000 pending-eviction indices."""
    return run_event("evict_indices", actions.evict_indices, lock=LockKey.EVENT_EVICT_INDICES)


#: The scheduling events whose jobs are eviction's: event name → Celery task name
#: (GitLab's event names; ``evict_indices`` keeps its ``zoekt.`` task name).
EVICTION_EVENTS = {
    "evict_from_nodes": "eviction.evict_from_nodes",
    "mark_indices_pending_eviction": "eviction.mark_indices_pending_eviction",
    "evict_overcommitted_nodes": "eviction.evict_overcommitted_nodes",
    "evict_indices": "zoekt.evict_indices",
}


@shared_task(name="eviction.advance_moves")
def advance_moves_task() -> dict:
    """Every live move one step further (``eviction.moves``): swap what is ready, park
    what is stuck. Row locks, not a global lock: two runs at once share the work."""
    return run_event("advance_moves", moves.advance_moves)


@shared_task(name="eviction.memory_pressure")
def memory_pressure_task() -> dict:
    """Memory-pressure moves (``eviction.memory_pressure``): off until enabled."""
    return run_event(
        "memory_pressure",
        memory_pressure.run_memory_pressure,
        lock=LockKey.EVICTION_MEMORY_PRESSURE,
    )


@shared_task(name="eviction.drain_nodes")
def drain_nodes_task() -> dict:
    """One pass over every live drain (``eviction.drain``): nodes being removed or replaced.
    Row locks, not a global lock: two runs at once pass over each other's records."""
    return run_event("drain_nodes", drain.run_drains)


@shared_task(name="eviction.end_cooldowns")
def end_cooldowns_task() -> dict:
    """End the cooldowns whose evicted indices are all gone, and close the expired ones
    (``eviction.actions.end_cooldowns``). A decision of any trigger starts a cooldown, and
    node-level eviction (which runs this first) may be off or find no node over high: on
    its own beat entry, a node that shed an index is a placement and move target again
    minutes after the copy is deleted, not 12 hours later. Idempotent: safe to run twice."""
    return run_event("end_cooldowns", actions.end_cooldowns)


@shared_task(name="eviction.rebalance_fleet")
def rebalance_fleet_task() -> dict:
    """The rebalance reconciler (``eviction.rebalance``): moves towards the desired balance,
    off or standing aside as the settings and the fleet say. Every 5 minutes, and once after
    a node joins (``zoekt.hooks.rebalance_fleet_on_commit``); one run at a time."""
    return run_event("rebalance_fleet", rebalance.run_rebalance, lock=LockKey.REBALANCE_FLEET)
