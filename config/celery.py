"""The Celery application: Redis broker, django-celery-beat's database scheduler.

Beat entries are declared in code, each app's in its own ``beat.py``, and
merged here. ``DatabaseScheduler`` copies them into django-celery-beat's tables
on start, where an operator can pause or retime them in the admin. Exactly one
beat process runs per deployment.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

from dashboard.beat import DASHBOARD_BEAT
from eviction.beat import EVICTION_BEAT
from gitlab_sync.beat import GITLAB_BEAT
from planner.beat import PLANNER_BEAT
from zoekt import jobmetrics
from zoekt.beat import ZOEKT_BEAT
from zoekt.scheduling.beat import SCHEDULING_BEAT

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("zoekt")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(
    ["zoekt", "zoekt.scheduling", "planner", "eviction", "gitlab_sync", "dashboard"]
)

# Every job run is timed for /metrics (zoekt.jobmetrics).
task_prerun.connect(jobmetrics.on_prerun, weak=False)
task_postrun.connect(jobmetrics.on_postrun, weak=False)

# Every entry expires after its own interval, so a backlog of missed ticks
# never runs the same job several times in a row. Each app declares its own.
BEAT_SCHEDULE = {
    **ZOEKT_BEAT,
    **PLANNER_BEAT,
    **SCHEDULING_BEAT,
    **DASHBOARD_BEAT,
    **EVICTION_BEAT,
    # Following GitLab (docs/gitlab.md): hooks left over, the delta and the full sweep.
    **GITLAB_BEAT,
}
app.conf.beat_schedule = BEAT_SCHEDULE
