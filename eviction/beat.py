"""Beat entries of the eviction package's own jobs, declared in code (merged into
``config.celery``). The three triggers are dispatched by the scheduling service;
moving what they chose on is these entries', and so are draining nodes, ending
cooldowns and rebalancing the fleet. Plain data
with no Django import."""

from __future__ import annotations

from zoekt.beat import every

#: How often live moves are taken one step further (``eviction.moves``).
ADVANCE_MOVES_SECONDS = 60
#: How often the memory-pressure job reads the nodes (``eviction.memory_pressure``).
MEMORY_PRESSURE_SECONDS = 300
#: How often each live drain (a node being removed or replaced) gets a pass
#: (``eviction.drain``).
DRAIN_NODES_SECONDS = 60
#: How often the cooldowns whose evicted indices are all gone are ended, whatever
#: trigger started them and whether node-level eviction is on (``eviction.actions``).
END_COOLDOWNS_SECONDS = 300
#: How often the rebalance reconciler starts moves towards the desired balance
#: (``eviction.rebalance``; also once after a node joins). Its moves take minutes to hours
#: to build, so a run every 5 minutes keeps its slots busy without recomputing the balance
#: for nothing.
REBALANCE_FLEET_SECONDS = 300

EVICTION_BEAT: dict[str, dict] = {
    "advance-moves": every("eviction.advance_moves", ADVANCE_MOVES_SECONDS),
    "memory-pressure": every("eviction.memory_pressure", MEMORY_PRESSURE_SECONDS),
    "drain-nodes": every("eviction.drain_nodes", DRAIN_NODES_SECONDS),
    "end-eviction-cooldowns": every("eviction.end_cooldowns", END_COOLDOWNS_SECONDS),
    "rebalance-fleet": every("eviction.rebalance_fleet", REBALANCE_FLEET_SECONDS),
}
