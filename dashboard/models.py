"""The dashboard's one table: a compact time series of every node (``zoekt_node_samples``).

Not a GitLab table: GitLab keeps no history of a node. ``dashboard.history``
writes one row per node per sample interval (five minutes) and prunes what
is older than the retention (21 days); the node page draws it. The primary
key is the node and the start of the interval, so a second sample in the
same interval writes nothing (``INSERT ... ON CONFLICT DO NOTHING``), and
rows carry only the figures the charts draw.
"""

from __future__ import annotations

from django.contrib.postgres.indexes import BrinIndex
from django.db import models

from zoekt.models import Node


class NodeSample(models.Model):
    pk = models.CompositePrimaryKey("node", "sampled_at")
    #: No index of its own: the primary key's leading column is the node.
    node = models.ForeignKey(
        Node, on_delete=models.CASCADE, related_name="history_samples", db_index=False
    )
    #: The start of the sample interval (``dashboard.history.bucket``), not the exact instant.
    sampled_at = models.DateTimeField()
    used_bytes = models.BigIntegerField()
    total_bytes = models.BigIntegerField()
    indexed_bytes = models.BigIntegerField()
    #: ``process_health.webserver.rss_bytes`` as last reported (None: not reported).
    rss_bytes = models.BigIntegerField(null=True)
    #: ``zoekt.memory``'s estimate of the node's ready and pre-ready indices
    #: (None: not a search node).
    estimated_memory_bytes = models.BigIntegerField(null=True)
    #: The node's memory budget, reported or configured (None: it has none).
    memory_budget_bytes = models.BigIntegerField(null=True)

    class Meta:
        db_table = "zoekt_node_samples"
        # Pruning deletes by age over every node; rows arrive in time order, so a
        # block-range index is enough and stays a few pages large.
        indexes = [BrinIndex(fields=["sampled_at"], name="zoekt_node_samples_at_brin")]

    def __str__(self) -> str:
        return f"node {self.node_id} at {self.sampled_at:%Y-%m-%d %H:%M}"

    @property
    def storage_percent_used(self) -> float | None:
        return self.used_bytes / self.total_bytes if self.total_bytes > 0 else None
