"""Stable snake_case reason codes that decisions carry as data.

A code is never renamed or reused, only added: logs, dashboards and tests
match on them.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    # Periodic jobs
    LOCK_HELD = "lock_held"
    # Buffer factor
    BUFFER_FACTOR_OBSERVED = "buffer_factor_observed"
    BUFFER_FACTOR_NO_OBSERVATIONS = "buffer_factor_no_observations"
    # Search health: why a node is left out of search (zoekt.search_health)
    PROCESS_RESTARTS_EXCEEDED = "process_restarts_exceeded"
    MMAP_NEAR_LIMIT = "mmap_near_limit"
    WEBSERVER_STALE = "webserver_stale"
    # Search targets: why a namespace has none (zoekt.search_targets)
    NAMESPACE_NOT_ENABLED = "namespace_not_enabled"
    SEARCH_DISABLED = "search_disabled"
    NO_READY_REPLICA = "no_ready_replica"
    NO_SEARCHABLE_REPLICA = "no_searchable_replica"
    # Search requests: why a request for some projects has no route (zoekt.search_requests)
    NO_REQUESTED_PROJECT_SERVED = "no_requested_project_served"
    # Indexing one project (zoekt.scheduling.indexing, zoekt.scheduling.tasks)
    INDEXING_DISABLED = "indexing_disabled"
    PROJECT_NOT_FOUND = "project_not_found"
    NO_TARGET_INDICES = "no_target_indices"
    # Rollout (planner.selection, planner.apply, planner.rollout, planner.tasks)
    INDEXING_PAUSED = "indexing_paused"
    NO_ENABLED_NAMESPACES = "no_enabled_namespaces"
    NO_AVAILABLE_NODES = "no_available_nodes"
    DRY_RUN = "dry_run"
    NODE_NOT_FOUND = "node_not_found"
    NODE_CAPACITY_EXCEEDED = "node_capacity_exceeded"
    #: The apply's re-check: the node is being taken out of service (not a GitLab type).
    NODE_SHUTTING_DOWN = "node_shutting_down"
    MISSING_ENABLED_NAMESPACE = "missing_enabled_namespace"
    NAMESPACE_ALREADY_ON_NODE = "namespace_already_on_node"
    PROVISIONING_FAILED = "provisioning_failed"
    TOO_MANY_PROJECT_NAMESPACES = "too_many_project_namespaces"
    WAITING_FOR_PROJECT_STATISTICS = "waiting_for_project_statistics"
    # Scheduling (zoekt.scheduling): why a scheduled task or an event job did nothing
    THROTTLED = "throttled"
    CONDITION_NOT_MET = "condition_not_met"
    AUTO_INDEX_DISABLED = "auto_index_disabled"
    NODE_LEVEL_EVICTION_DISABLED = "node_level_eviction_disabled"
    # Eviction decisions (eviction.policy): why a node was evicted from, or not
    EVICTION_OVER_HIGH_WATERMARK = "eviction_over_high_watermark"
    EVICTION_SUSTAINED_OVER_HIGH_WATERMARK = "eviction_sustained_over_high_watermark"
    EVICTION_CRITICAL_WATERMARK = "eviction_critical_watermark"
    EVICTION_SUSTAIN_NOT_REACHED = "eviction_sustain_not_reached"
    EVICTION_NODE_COOLING_DOWN = "eviction_node_cooling_down"
    EVICTION_NOTHING_ELIGIBLE = "eviction_nothing_eligible"
    EVICTION_UNDER_HIGH_WATERMARK = "eviction_under_high_watermark"
    EVICTION_INDEX_CRITICAL_WATERMARK = "eviction_index_critical_watermark"
    EVICTION_NEGATIVE_UNCLAIMED_STORAGE = "eviction_negative_unclaimed_storage"
    EVICTION_REPLICAS_DELETED = "eviction_replicas_deleted"
    # Moves (eviction.moves): why an index was not moved, fell back, or was parked.
    EVICTION_MOVES_STARTED = "eviction_moves_started"
    MOVE_NO_TARGET = "move_no_target"
    MOVE_THROTTLED = "move_throttled"
    MOVE_SPLIT_NAMESPACE = "move_split_namespace"
    MOVE_ALREADY_MOVING = "move_already_moving"
    MOVE_FALLBACK_CRITICAL_NO_TARGET = "move_fallback_critical_no_target"
    MOVE_DEADLINE_PASSED = "move_deadline_passed"
    MOVE_TARGET_LOST = "move_target_lost"
    MOVE_REPLACEMENT_LOST = "move_replacement_lost"
    MOVE_SOURCE_GONE = "move_source_gone"
    MOVE_NOT_COVERED = "move_not_covered"
    MOVE_CATCHING_UP = "move_catching_up"
    MOVE_RETRYING = "move_retrying"
    # Eviction cooldown (eviction.actions): why it ended
    COOLDOWN_EVICTED_INDICES_GONE = "cooldown_evicted_indices_gone"
    COOLDOWN_EXPIRED = "cooldown_expired"
    # Rollout: why a node is not a candidate
    NODE_EVICTION_COOLDOWN = "node_eviction_cooldown"
    LOST_NODE_HANDLING_DISABLED = "lost_node_handling_disabled"
    NO_LOST_NODES = "no_lost_nodes"
    NO_ONLINE_NODES = "no_online_nodes"
    NODE_NOT_LOST = "node_not_lost"
    NODE_OFFLINE = "node_offline"
    INDEX_NOT_FOUND = "index_not_found"
    INDEX_NOT_PENDING = "index_not_pending"
    INDEX_CLAIMED = "index_claimed"
    ENABLED_NAMESPACE_NOT_FOUND = "enabled_namespace_not_found"
    TOO_MANY_DELETE_TASKS = "too_many_delete_tasks"
    DEPRECATED = "deprecated"
    # Memory (zoekt.memory)
    MEMORY_AUTO_CALIBRATION_DISABLED = "memory_auto_calibration_disabled"
    NO_MEMORY_OBSERVATIONS = "no_memory_observations"
    MEMORY_RATIO_CALIBRATED = "memory_ratio_calibrated"
    MEMORY_HIGH_WATERMARK = "memory_high_watermark"
    # Lost index data (zoekt.scheduling.lost_index_data): why a node's indices were re-indexed
    INDEXED_BYTES_SHORTFALL = "indexed_bytes_shortfall"
    # Node shutdown records (zoekt.shutdowns): how a restart completed, and why a job
    # left a node alone
    NODE_RETURNED = "node_returned"
    RESTART_DELAY_EXPIRED = "restart_delay_expired"
    NODE_NEVER_LEFT = "node_never_left"
    SHUTDOWN_NODE_DELETED = "shutdown_node_deleted"
    NODE_IN_RESTART = "node_in_restart"
    # Moves by hand (eviction.manual) and move targets (eviction.moves.target_refusal):
    # why an index was not moved where an operator asked, or why a node is no target
    MOVE_INDEX_NOT_READY = "move_index_not_ready"
    MOVE_TARGET_IS_SOURCE = "move_target_is_source"
    MOVE_TARGET_NOT_SEARCH_NODE = "move_target_not_search_node"
    MOVE_TARGET_OFFLINE = "move_target_offline"
    MOVE_TARGET_RESTARTING = "move_target_restarting"
    MOVE_TARGET_SHUTTING_DOWN = "move_target_shutting_down"
    MOVE_TARGET_COOLING_DOWN = "move_target_cooling_down"
    MOVE_TARGET_HOLDS_NAMESPACE = "move_target_holds_namespace"
    #: The target's zone holds another replica of the namespace, and the index's own
    #: zone does not: the move would put two replicas in one zone (docs/balance.md).
    MOVE_TARGET_ZONE_HOLDS_REPLICA = "move_target_zone_holds_replica"
    MOVE_TARGET_NO_DISK_ROOM = "move_target_no_disk_room"
    MOVE_TARGET_OVER_MEMORY_WATERMARK = "move_target_over_memory_watermark"
    MOVE_TARGET_NO_MEMORY_ROOM = "move_target_no_memory_room"
    # Drains (a remove or a replace; eviction.drain, zoekt.drains): how one completed,
    # why it is stalled, what it did to a move, why a node is no candidate, and why a
    # node's row was not deleted (zoekt.node_deletion)
    NODE_DRAINED = "node_drained"
    NODE_IN_DRAIN = "node_in_drain"
    DRAIN_NO_TARGET = "drain_no_target"
    DRAIN_MOVE_PARKED = "drain_move_parked"
    DRAIN_CANCELLED = "drain_cancelled"
    DRAIN_REPLICA_NOT_SERVING = "drain_replica_not_serving"
    REPLACE_TARGET_DOES_NOT_FIT = "replace_target_does_not_fit"
    NODE_HOLDS_LAST_COPY = "node_holds_last_copy"
    FORCED_DELETE = "forced_delete"
    # The desired balance (planner.balance): why a move is planned, and why a node takes none
    REBALANCE_BUSIEST_NODE = "rebalance_busiest_node"
    REBALANCE_NEXT_BUSIEST_NODE = "rebalance_next_busiest_node"
    BALANCE_TARGET_NOT_RECEIVING = "balance_target_not_receiving"
    # The explain of one index (planner.balance.explain_indices): why it may not move now
    # (for every node), why a node may not take it now, and why the desired balance
    # leaves it where it is
    BALANCE_INDEX_ORPHANED = "balance_index_orphaned"
    BALANCE_INDEX_PINNED = "balance_index_pinned"
    BALANCE_MOVED_RECENTLY = "balance_moved_recently"
    BALANCE_SOURCE_OFFLINE = "balance_source_offline"
    BALANCE_SOURCE_IN_MAINTENANCE = "balance_source_in_maintenance"
    BALANCE_SOURCE_SETTLING = "balance_source_settling"
    BALANCE_SOURCE_NO_DISK_SIZE = "balance_source_no_disk_size"
    BALANCE_SOURCE_AT_LOWER_BOUND = "balance_source_at_lower_bound"
    BALANCE_SOURCE_DOES_NOT_FALL = "balance_source_does_not_fall"
    BALANCE_MARGIN_NOT_MET = "balance_margin_not_met"
    BALANCE_NO_TARGET_QUALIFIES = "balance_no_target_qualifies"
    BALANCE_OTHER_MOVES_PREFERRED = "balance_other_moves_preferred"
    BALANCE_PLAN_CAPPED = "balance_plan_capped"
    # The rebalance reconciler (eviction.rebalance): why it started nothing this run
    REBALANCE_DISABLED = "rebalance_disabled"
    REBALANCE_NODE_OVER_HIGH_WATERMARK = "rebalance_node_over_high_watermark"
    REBALANCE_NODE_OVER_HIGH_MEMORY_WATERMARK = "rebalance_node_over_high_memory_watermark"
    REBALANCE_NODE_SHUTTING_DOWN = "rebalance_node_shutting_down"
    REBALANCE_EVICTION_MOVING = "rebalance_eviction_moving"
    REBALANCE_DRAIN_MOVING = "rebalance_drain_moving"
    # Capacity (planner.provisioning): why a provisioning status was given, and why a
    # what-if moved or could not place an index
    NODES_NEEDED_EXCEED_PRESENT = "nodes_needed_exceed_present"
    NODES_PRESENT_EXCEED_NEED = "nodes_present_exceed_need"
    NODES_PRESENT_MEET_NEED = "nodes_present_meet_need"
    NOT_ENOUGH_HISTORY = "not_enough_history"
    NO_NODE_SIZE = "no_node_size"
    WHAT_IF_NODE_REMOVED = "what_if_node_removed"
    WHAT_IF_NO_TARGET = "what_if_no_target"
