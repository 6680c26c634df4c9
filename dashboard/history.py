"""Node history: a compact time series of every node's disk and memory, sampled and pruned.

The dashboard shows the current value of everything; this keeps the recent
past so the node page can draw it (docs/dashboard.md, "History").

* **Sampling** (``sample_nodes``): one row per node per
  ``SAMPLE_INTERVAL_SECONDS`` (5 minutes) into ``zoekt_node_samples``:
  disk used, total and indexed bytes, webserver RSS, ``zoekt.memory``'s
  estimate and the memory budget. Only nodes seen within the interval are
  sampled, so an offline node's stale figures are not repeated: its chart
  has a gap instead. The row's time is the start of the interval
  (``bucket``) and the primary key is (node, that time), so the rows go in
  with one ``INSERT ... ON CONFLICT DO NOTHING`` and a second run in the
  same interval (a beat retry, two beats) writes nothing more.
* **Pruning** (``prune_samples``): one ``DELETE`` of the rows older than
  ``RETENTION_SECONDS`` (21 days).
* **Reading** (``node_history``): one node and its retained samples, in two
  queries; ``recent_disk_by_node``: every node's disk share over the last
  day by hour, in one, drawn by ``disk_sparklines`` for the fleet page.

``record_history`` does both writes; beat runs it every interval
(``record-node-history`` in ``dashboard.beat``) through
``dashboard.tasks.record_node_history_task``. It needs no advisory lock:
two runs at once write each row once and delete the same old rows.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import FloatField, Max
from django.db.models.functions import Cast, TruncHour
from django.utils.safestring import SafeString

from dashboard import charts
from dashboard.beat import SAMPLE_INTERVAL_SECONDS
from dashboard.models import NodeSample
from zoekt import app_settings, capacity, clock, memory
from zoekt.clock import EPOCH
from zoekt.models import Node

#: How long samples are kept: 21 days, 6,048 rows per node.
RETENTION_SECONDS = 21 * 24 * 3600


def bucket(at: datetime, interval_seconds: int = SAMPLE_INTERVAL_SECONDS) -> datetime:
    """The start of the sample interval ``at`` falls in (intervals counted from the epoch)."""
    seconds = int((at - EPOCH).total_seconds())
    return EPOCH + timedelta(seconds=seconds - seconds % interval_seconds)


def sample_nodes(
    *,
    now: datetime | None = None,
    settings: app_settings.ZoektSettings | None = None,
    node_ids: list[int] | None = None,
) -> int:
    """Write this interval's sample of every node seen within it; returns the nodes sampled.

    Statements: the nodes (1), their memory (``zoekt.memory.node_memory_report``,
    3) and one insert, whatever the fleet size; nothing more when no node was
    seen. A node already sampled in this interval keeps its row. ``node_ids``: only these
    (a node's first sample, taken when it registers).
    """
    now = now or clock.now()
    settings = settings or app_settings.current()
    seen = Node.objects.filter(last_seen_at__gt=now - timedelta(seconds=SAMPLE_INTERVAL_SECONDS))
    if node_ids is not None:
        seen = seen.filter(id__in=node_ids)
    nodes = list(
        seen.order_by("id").values_list("id", "used_bytes", "total_bytes", "indexed_bytes")
    )
    if not nodes:
        return 0
    ids = [node_id for node_id, *_ in nodes]
    memories = {
        row.node_id: row
        for row in memory.node_memory_report(settings=settings, now=now, node_ids=ids)
    }
    at = bucket(now)
    rows = []
    for node_id, used, total, indexed in nodes:
        m = memories.get(node_id)
        rows.append(
            NodeSample(
                node_id=node_id,
                sampled_at=at,
                used_bytes=used,
                total_bytes=total,
                indexed_bytes=indexed,
                rss_bytes=None if m is None else m.rss_bytes,
                estimated_memory_bytes=None if m is None else m.estimated_memory_bytes,
                memory_budget_bytes=None if m is None else m.memory_budget_bytes,
            )
        )
    NodeSample.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def prune_samples(*, now: datetime | None = None) -> int:
    """Delete the samples older than the retention, in one statement; returns how many."""
    now = now or clock.now()
    cutoff = now - timedelta(seconds=RETENTION_SECONDS)
    deleted, _ = NodeSample.objects.filter(sampled_at__lt=cutoff).delete()
    return deleted


def record_history(*, now: datetime | None = None) -> dict[str, int]:
    """Sample every node, then prune: the beat job's whole work."""
    now = now or clock.now()
    return {"nodes_sampled": sample_nodes(now=now), "samples_pruned": prune_samples(now=now)}


# ----------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sample:
    sampled_at: datetime
    used_bytes: int
    total_bytes: int
    indexed_bytes: int
    rss_bytes: int | None
    estimated_memory_bytes: int | None
    memory_budget_bytes: int | None

    @property
    def storage_percent_used(self) -> float | None:
        return self.used_bytes / self.total_bytes if self.total_bytes > 0 else None


@dataclasses.dataclass(frozen=True)
class DaySummary:
    """One UTC day of a node's samples: the peaks and the last budget."""

    day: datetime
    samples: int
    max_storage_percent_used: float | None
    max_used_bytes: int
    max_rss_bytes: int | None
    max_estimated_memory_bytes: int | None
    memory_budget_bytes: int | None


def _max(values) -> int | float | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


@dataclasses.dataclass(frozen=True)
class NodeHistory:
    node: Node
    now: datetime
    start: datetime
    samples: list[Sample]
    #: The disk watermarks (low, high, critical) the chart draws.
    watermark_limits: tuple[float, float, float]

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def chart_start(self) -> datetime:
        """Where the charts begin: the oldest retained sample, showing at least six hours."""
        if not self.samples:
            return self.start
        return max(self.start, min(self.samples[0].sampled_at, self.now - timedelta(hours=6)))

    @property
    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    @property
    def days(self) -> list[DaySummary]:
        """Per UTC day, newest first."""
        by_day: dict[datetime, list[Sample]] = defaultdict(list)
        for sample in self.samples:
            by_day[sample.sampled_at.replace(hour=0, minute=0, second=0, microsecond=0)].append(
                sample
            )
        return [
            DaySummary(
                day=day,
                samples=len(rows),
                max_storage_percent_used=_max(row.storage_percent_used for row in rows),
                max_used_bytes=max(row.used_bytes for row in rows),
                max_rss_bytes=_max(row.rss_bytes for row in rows),
                max_estimated_memory_bytes=_max(row.estimated_memory_bytes for row in rows),
                memory_budget_bytes=rows[-1].memory_budget_bytes,
            )
            for day, rows in sorted(by_day.items(), reverse=True)
        ]


def node_history(node_id: int, *, now: datetime | None = None) -> NodeHistory | None:
    """One node and its retained samples, oldest first (two queries); None: no such node."""
    now = now or clock.now()
    node = Node.objects.filter(id=node_id).first()
    if node is None:
        return None
    start = now - timedelta(seconds=RETENTION_SECONDS)
    samples = [
        Sample(*row)
        for row in NodeSample.objects.filter(node_id=node_id, sampled_at__gte=start)
        .order_by("sampled_at")
        .values_list(
            "sampled_at",
            "used_bytes",
            "total_bytes",
            "indexed_bytes",
            "rss_bytes",
            "estimated_memory_bytes",
            "memory_budget_bytes",
        )
    ]
    return NodeHistory(
        node=node,
        now=now,
        start=start,
        samples=samples,
        watermark_limits=capacity.watermark_limits(app_settings.development_watermarks()),
    )


def recent_disk_by_node(
    *, now: datetime | None = None, hours: int = 24
) -> dict[int, list[tuple[datetime, float]]]:
    """``{node_id: [(hour, peak disk share), ...]}`` over the last ``hours``, oldest first.

    One grouped query (one row per node and hour, whatever the interval); an
    hour without a sample is absent, a sample with no disk reported left out.
    """
    now = now or clock.now()
    rows = (
        NodeSample.objects.filter(sampled_at__gte=now - timedelta(hours=hours), total_bytes__gt=0)
        .annotate(hour=TruncHour("sampled_at"))
        .order_by()
        .values("node_id", "hour")
        .annotate(peak=Max(Cast("used_bytes", FloatField()) / Cast("total_bytes", FloatField())))
        .order_by("node_id", "hour")
        .values_list("node_id", "hour", "peak")
    )
    out: dict[int, list[tuple[datetime, float]]] = defaultdict(list)
    for node_id, hour, peak in rows:
        out[node_id].append((hour, peak))
    return dict(out)


def disk_sparklines(
    *,
    now: datetime | None = None,
    high_watermark: float | None = None,
    hours: int = 24,
    width: int = 200,
) -> dict[int, SafeString]:
    """``{node_id: sparkline}`` of each node's peak disk share per hour over the last day.

    The fleet page draws them under the disk bars; one query
    (``recent_disk_by_node``). A node without a sample in that time has none.
    """
    now = now or clock.now()
    start = now - timedelta(hours=hours)
    out = {}
    for node_id, points in recent_disk_by_node(now=now, hours=hours).items():
        peak = max(share for _, share in points)
        out[node_id] = charts.sparkline(
            points,
            start=start,
            end=now,
            limit=high_watermark,
            width=width,
            height=14,
            label=f"disk used, peak per hour over the last {hours} h: "
            f"last {points[-1][1]:.1%}, peak {peak:.1%}",
        )
    return out
