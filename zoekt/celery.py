"""The Celery application: Redis broker, django-celery-beat's database scheduler.

Beat entries are declared here, in code. ``DatabaseScheduler`` copies them
into django-celery-beat's tables on start, where an operator can pause or
retime them in the admin. Exactly one beat process runs per deployment.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

from dashboard.beat import DASHBOARD_BEAT
from eviction.beat import EVICTION_BEAT
from gitlab_sync.beat import GITLAB_BEAT
from zoekt import jobmetrics
from zoekt.beat import every
from zoekt.scheduling.beat import SCHEDULING_BEAT

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoekt.settings")

app = Celery("zoekt")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(
    ["zoekt", "zoekt.scheduling", "planner", "eviction", "gitlab_sync", "dashboard"]
)

# Every job run is timed for /metrics (zoekt.jobmetrics).
task_prerun.connect(jobmetrics.on_prerun, weak=False)
task_postrun.connect(jobmetrics.on_postrun, weak=False)

# Every entry expires after its own interval, so a backlog of missed ticks
# never runs the same job several times in a row.
BEAT_SCHEDULE = {
    "refresh-buffer-factor": every("zoekt.refresh_buffer_factor", 3600),
    # Memory (docs/memory.md): opt-in auto-calibration of memory_ratio, and the
    # per-node estimated-vs-observed memory metrics as structured log records.
    "calibrate-memory-ratio": every("zoekt.calibrate_memory_ratio", 3600),
    "log-node-memory": every("zoekt.log_node_memory", 60),
    # Not GitLab's: failed tasks whose handle_task_failed message was lost (docs/reliability.md).
    "sweep-failed-tasks": every("zoekt.sweep_failed_tasks", 600),
    # GitLab's RolloutWorker cron (*/10): select, plan and provision namespaces.
    "rollout": every("zoekt.rollout", 600),
}
BEAT_SCHEDULE.update(SCHEDULING_BEAT)
BEAT_SCHEDULE.update(DASHBOARD_BEAT)
BEAT_SCHEDULE.update(EVICTION_BEAT)
# Following GitLab (docs/gitlab.md): hooks left over, the delta and the full sweep.
BEAT_SCHEDULE.update(GITLAB_BEAT)
app.conf.beat_schedule = BEAT_SCHEDULE
