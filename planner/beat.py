"""Beat entry of the rollout, declared in code (merged into ``config.celery``).
Plain data with no Django import."""

from __future__ import annotations

from zoekt.beat import every

#: GitLab's RolloutWorker cron (*/10): select, plan and provision namespaces.
ROLLOUT_SECONDS = 600

PLANNER_BEAT: dict[str, dict] = {
    "rollout": every("zoekt.rollout", ROLLOUT_SECONDS),
}
