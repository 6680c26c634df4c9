"""Every eviction decision, applied or skipped, as a row (``zoekt_eviction_decisions``).

Not a GitLab table: GitLab only logs "Unassigning namespaces from node". A
decision says which node, which trigger and mode, why (a stable reason
code), which indices it chose with their bytes, the disk use projected after
it, the namespaces it affected, and when it was applied. A skipped decision
that repeats the node's previous one for the same trigger (same reason) is
folded into that row (``repeats``, ``last_seen_at``), so a node waiting out
its sustain period for 8 hours is one row, not 96.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models

from zoekt import clock
from zoekt.models import Node


class EvictionDecision(models.Model):
    class Trigger(models.TextChoices):
        NODE_LEVEL = "node_level", "node over the high disk watermark"
        INDEX_WATERMARK = "index_watermark", "index over its critical watermark"
        NEGATIVE_UNCLAIMED = "negative_unclaimed", "negative unclaimed storage"

    class Mode(models.TextChoices):
        SAFEGUARDS = "safeguards", "safeguards"
        LEGACY = "legacy", "legacy (GitLab's)"

    id = models.BigAutoField(primary_key=True)
    created_at = models.DateTimeField(default=clock.now, editable=False, db_index=True)
    last_seen_at = models.DateTimeField(default=clock.now)
    repeats = models.PositiveIntegerField(default=1)
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="eviction_decisions"
    )
    node_name = models.TextField(default="")
    trigger = models.CharField(max_length=32, choices=Trigger.choices)
    mode = models.CharField(max_length=16, choices=Mode.choices)
    reason = models.CharField(max_length=64)
    #: Applied (the chosen indices were handed to eviction) or skipped.
    applied_at = models.DateTimeField(null=True, blank=True)
    used_bytes = models.BigIntegerField(default=0)
    total_bytes = models.BigIntegerField(default=0)
    projected_used_bytes = models.BigIntegerField(null=True, blank=True)
    #: ``[{index_id, namespace_id, replica_id, used_storage_bytes, reserved_storage_bytes}]``
    chosen = models.JSONField(default=list, blank=True)
    index_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    namespace_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    namespaces_affected = models.PositiveIntegerField(default=0)
    #: Replicas deleted, namespaces left without a ready replica, what was
    #: passed over, the sustain clock...: whatever the reason needs.
    details = models.JSONField(default=dict, blank=True)
    #: When the node's cooldown from this decision ended, and why.
    cooldown_ended_at = models.DateTimeField(null=True, blank=True)
    cooldown_end_reason = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        db_table = "zoekt_eviction_decisions"
        ordering = ("-id",)
        indexes = [models.Index(fields=["node", "trigger", "-id"], name="eviction_node_trigger")]

    def __str__(self) -> str:
        verdict = "applied" if self.applied_at else "skipped"
        return f"{self.trigger} on {self.node_name or self.node_id}: {verdict} ({self.reason})"

    @property
    def chosen_bytes(self) -> int:
        return sum(int(c.get("used_storage_bytes") or 0) for c in self.chosen)
