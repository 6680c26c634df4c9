"""The planner's own table: the recent rollout plans, for the dashboard.

A rollout logs its whole plan as one structured record (``zoekt_rollout_plan``);
the same run also keeps it here (``planner.records``), with a summary and a
compact explanation, so an operator can read the last runs in the admin
dashboard without a log search. Only the last ``planner.records.KEEP`` rows
are kept. Not a GitLab table: GitLab only logs its plans.
"""

from __future__ import annotations

from django.db import models

from zoekt import clock


class RolloutPlan(models.Model):
    id = models.BigAutoField(primary_key=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    dry_run = models.BooleanField(default=False)
    #: Counts, bounds, candidate node names, phase seconds (``planner.records.summary``).
    summary = models.JSONField(default=dict)
    #: The plan exactly as the ``zoekt_rollout_plan`` log record carries it.
    plan = models.JSONField(default=dict)
    #: Per namespace, why each candidate node was taken or passed over
    #: (``planner.records.compact_explanation``); NULL when the run kept no
    #: decision records.
    explanation = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "zoekt_rollout_plans"
        ordering = ("-id",)

    def __str__(self) -> str:
        kind = "dry run" if self.dry_run else "rollout"
        return f"{kind} plan {self.id} at {self.created_at:%Y-%m-%d %H:%M:%S}"
