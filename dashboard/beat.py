"""Beat entry of the dashboard's one job, declared in code (merged into ``config.celery``).

Plain data with no Django import: the Celery app reads it at start-up. The
entry expires after its own interval, like every other.
"""

from __future__ import annotations

from zoekt.beat import every

#: One node history sample per node per this many seconds (``dashboard.history``).
SAMPLE_INTERVAL_SECONDS = 300

DASHBOARD_BEAT: dict[str, dict] = {
    # Node history (docs/dashboard.md, "History"): sample every node's disk and
    # memory into zoekt_node_samples, and prune what is past the retention.
    "record-node-history": every("dashboard.record_node_history", SAMPLE_INTERVAL_SECONDS),
}
