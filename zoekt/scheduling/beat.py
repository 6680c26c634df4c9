"""Beat entries of the scheduling jobs, declared in code (merged into ``config.celery``).

Plain data with no Django import: the Celery app reads it at start-up.
Every entry expires after its own interval.
"""

from __future__ import annotations

from zoekt.beat import every

SCHEDULING_BEAT: dict[str, dict] = {
    # GitLab's search_zoekt_scheduling_worker cron (every minute): one job per scheduled task.
    "scheduling": every("zoekt.scheduling", 60),
    # GitLab's search_zoekt_metrics_update_cron_worker (every minute): one metrics log line.
    "scheduling-metrics": every("zoekt.log_metrics", 60),
    # Nodes that report far fewer indexed bytes than their ready indices hold (a disk lost
    # under the same uuid): their indices are re-indexed (zoekt.scheduling.lost_index_data).
    "reindex-lost-index-data": every("zoekt.reindex_lost_index_data", 60),
}
