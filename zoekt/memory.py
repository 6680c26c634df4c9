"""Node memory: budgets, memory watermarks, and estimated-vs-observed calibration.

The planner's memory dimension (``docs/memory.md``) needs three things from
the database edge, and operators need to see them:

**A budget per node.** Source A is the ``zoekt_node_memory_budget_bytes``
setting; unset (the default) memory planning is off. Source B is the limit a
node reports itself, ``process_health.webserver.memory_limit_bytes`` (its
cgroup limit): it is that node's budget when it is present, positive, not the
"no limit" sentinel of cgroup v1, and the node's own Zoekt version is at least
``MEMORY_LIMIT_MIN_VERSION``; otherwise the node takes A. B refines A; A is the
switch: while A is unset the planner sees no budget at all, so the plan is the
disk-only plan whatever nodes report (acceptance criterion 7).

**Memory watermarks.** Memory use is the webserver's observed ``rss_bytes``
over the node's budget, compared with ``MEMORY_WATERMARK_LIMIT_LOW / HIGH /
CRITICAL`` exactly as the disk ratio is compared with the disk limits
(reaching a limit exceeds it). A node without a budget or without an RSS
report gives no signal. While memory planning is on, a node at or over the
high memory watermark is not a rollout candidate (``planner.selection``).

**Calibration** (the issue's Step 2). Per node: the observed webserver
``rss_bytes`` and ``shards_loaded`` next to the *estimated* memory of the
indices it holds (``repository_size × memory_ratio`` over the projects in the
project-namespace ranges of its ready and pre-ready indices, the same figure
the planner reserves for them), and two observed ratios that are **not**
``memory_ratio``:

* ``observed_memory_ratio`` = RSS ÷ ``used_storage_bytes`` of its ready
  indices: resident bytes per byte of index on disk, the quantity the
  published sizing rule of thumb (about 0.125) speaks of;
* ``rss_per_repository_byte`` = RSS ÷ ``repository_size`` of the projects of
  its ready indices: the quantity ``memory_ratio`` estimates, and the only one
  auto-calibration learns from.

Auto-calibration (opt-in, ``zoekt_memory_auto_calibration``) sets
``memory_ratio`` to the ``AUTO_CALIBRATION_PERCENTILE`` (nearest rank) of the
online nodes' ``rss_per_repository_byte``, clamped to ``[MEMORY_RATIO_MIN,
MEMORY_RATIO_MAX]``, and does nothing when no node gives a sample.

Every database read here is a fixed number of queries whatever the fleet
size: the nodes, one aggregate over the index ranges, one over used storage.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from fractions import Fraction
from typing import Any

from django.db import connection
from django.db.models import Sum

from zoekt import app_settings, capacity, clock

# The watermark arithmetic on RSS ÷ budget is pure and lives beside the disk's.
from zoekt.capacity import (
    MEMORY_WATERMARK_LIMIT_HIGH,
    NodeWatermark,
    memory_percent_used,
    memory_watermark_limits,
)
from zoekt.reasons import Reason
from zoekt.search_health import parse_version

GIB = 1024**3


#: A node's reported memory limit (source B) is used from this Zoekt version on:
#: the release that reports ``process_health`` at all (GitLab's
#: ``ProcessHealth::MIN_VERSION``), where ``webserver.memory_limit_bytes`` lives.
#: Per node, on the node's own version: a missing or unparsable version fails.
MEMORY_LIMIT_MIN_VERSION: tuple[int, int, int] = (1, 16, 0)
#: At or above this a reported limit means "no limit" (cgroup v1 reports
#: 9223372036854771712 for an unlimited group): the node falls back to A.
UNLIMITED_MEMORY_LIMIT_BYTES = 2**62

#: Auto-calibration: the percentile of the per-node samples taken (nearest rank).
AUTO_CALIBRATION_PERCENTILE = 90
#: Auto-calibration never sets ``memory_ratio`` outside these bounds.
MEMORY_RATIO_MIN = 0.1
MEMORY_RATIO_MAX = 2.0
#: A node is a calibration sample only when its ready indices hold at least
#: this much repository: below it the webserver's fixed overhead dominates RSS
#: and the ratio says nothing about indices.
MIN_CALIBRATION_REPOSITORY_BYTES = 1 * GIB

#: Index states whose projects count toward a node's estimated memory: what
#: the webserver holds or is about to (``PRE_READY_STATES`` and ``ready``).
ESTIMATE_INDEX_STATES = (0, 1, 2, 10)
READY_INDEX_STATE = 10


class BudgetSource:
    """Where a node's memory budget comes from (strings, for logs and JSON)."""

    REPORTED = "reported"  # source B: the node's own memory_limit_bytes
    CONFIGURED = "configured"  # source A: the zoekt_node_memory_budget_bytes setting


# --------------------------------------------------------------------------- #
# Pure functions over a node's metadata
# --------------------------------------------------------------------------- #


def _count(value: Any) -> int | None:
    """A non-negative integer, or None for anything else (bools included)."""
    return value if type(value) is int and value >= 0 else None


def process_counter(metadata: Mapping[str, Any] | None, process: str, key: str) -> int | None:
    """``process_health.<process>.<key>`` as a non-negative integer, or None."""
    health = metadata.get("process_health") if isinstance(metadata, Mapping) else None
    if not isinstance(health, Mapping):
        return None
    block = health.get(process)
    if not isinstance(block, Mapping):
        return None
    return _count(block.get(key))


def webserver_counter(metadata: Mapping[str, Any] | None, key: str) -> int | None:
    """``process_health.webserver.<key>`` as a non-negative integer, or None."""
    return process_counter(metadata, "webserver", key)


def memory_limit_version_ok(version: Any) -> bool:
    parsed = parse_version(version)
    return parsed is not None and parsed >= MEMORY_LIMIT_MIN_VERSION


def reported_memory_limit(metadata: Mapping[str, Any] | None) -> int | None:
    """Source B: the node's reported limit when usable (positive, limited, version gate)."""
    limit = webserver_counter(metadata, "memory_limit_bytes")
    if not limit or limit >= UNLIMITED_MEMORY_LIMIT_BYTES:
        return None
    version = metadata.get("version") if isinstance(metadata, Mapping) else None
    if not memory_limit_version_ok(version):
        return None
    return limit


def memory_budget(
    metadata: Mapping[str, Any] | None, configured: int | None
) -> tuple[int | None, str | None]:
    """``(budget, source)``: the node's reported limit (B), else the setting (A), else none."""
    reported = reported_memory_limit(metadata)
    if reported is not None:
        return reported, BudgetSource.REPORTED
    if configured is not None:
        return configured, BudgetSource.CONFIGURED
    return None, None


def planning_budget(metadata: Mapping[str, Any] | None, configured: int | None) -> int | None:
    """The budget the planner uses: none at all while the setting (A) is unset."""
    if configured is None:
        return None
    return memory_budget(metadata, configured)[0]


def memory_watermark(percent_used: float | None) -> NodeWatermark | None:
    """The highest memory limit reached (>=), ``normal`` below all, None without a signal."""
    if percent_used is None:
        return None
    return capacity.node_watermark_for_limits(percent_used, memory_watermark_limits())


def _memory_limit_reached(
    metadata: Mapping[str, Any] | None, configured: int | None, which: int
) -> bool:
    budget, _ = memory_budget(metadata, configured)
    percent = memory_percent_used(webserver_counter(metadata, "rss_bytes"), budget)
    return percent is not None and percent >= memory_watermark_limits()[which]


def low_memory_watermark_exceeded(
    metadata: Mapping[str, Any] | None, configured: int | None
) -> bool:
    return _memory_limit_reached(metadata, configured, 0)


def high_memory_watermark_exceeded(
    metadata: Mapping[str, Any] | None, configured: int | None
) -> bool:
    return _memory_limit_reached(metadata, configured, 1)


def critical_memory_watermark_exceeded(
    metadata: Mapping[str, Any] | None, configured: int | None
) -> bool:
    return _memory_limit_reached(metadata, configured, 2)


def excluded_from_placement(metadata: Mapping[str, Any] | None, configured: int | None) -> bool:
    """A node over the high memory watermark takes no new index (only while planning is on)."""
    return configured is not None and high_memory_watermark_exceeded(metadata, configured)


def estimate_memory_bytes(repository_bytes: int, memory_ratio: int | float) -> int:
    """``repository_bytes × memory_ratio`` rounded up, the ratio at its shortest decimal form.

    The planner core's arithmetic (``planner.scenario.MemoryOptions.estimate``),
    so the two agree byte for byte. Not multiplied by the buffer factor.
    """
    if type(memory_ratio) is int:
        return repository_bytes * memory_ratio
    num, den = Fraction(repr(float(memory_ratio))).as_integer_ratio()
    return -(-repository_bytes * num // den)


def percentile(values: Iterable[float], pct: float) -> float | None:
    """The nearest-rank percentile (the smallest value with at least pct % at or below it)."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


# --------------------------------------------------------------------------- #
# Database reads: a fixed number of queries
# --------------------------------------------------------------------------- #

# Per node, the repository bytes of the projects in its indices' ranges: the
# projects whose project namespace lies under the index's root namespace and
# within the index's project-namespace id range (an open end is unbounded).
# Ready indices alone, and ready plus pre-ready. The range test on
# traversal_ids is the btree-friendly prefix test the loader uses.
_REPOSITORY_BYTES_SQL = """
SELECT i.{key},
       COALESCE(SUM(s.repository_size) FILTER (WHERE i.state = %s), 0),
       COALESCE(SUM(s.repository_size), 0)
FROM zoekt_indices i
JOIN namespaces n
  ON n.traversal_ids >= ARRAY[i.namespace_id]
 AND n.traversal_ids < ARRAY[i.namespace_id + 1]
 AND n.traversal_ids[1] = i.namespace_id
 AND n.type = 'Project'
 AND n.id >= COALESCE((i.metadata ->> 'project_namespace_id_from')::bigint, n.id)
 AND n.id <= COALESCE((i.metadata ->> 'project_namespace_id_to')::bigint, n.id)
JOIN projects p ON p.project_namespace_id = n.id
JOIN project_statistics s ON s.project_id = p.id
WHERE i.state = ANY(%s) {node_filter}
GROUP BY i.{key}
"""


def repository_bytes_by_node(
    node_ids: Iterable[int] | None = None,
) -> dict[int, tuple[int, int]]:
    """``{node_id: (ready, ready + pre-ready)}`` repository bytes of the node's indices.

    One query. Nodes without such indices are absent.
    """
    params: list[Any] = [READY_INDEX_STATE, list(ESTIMATE_INDEX_STATES)]
    node_filter = ""
    if node_ids is not None:
        ids = sorted(set(node_ids))
        if not ids:
            return {}
        node_filter = "AND i.zoekt_node_id = ANY(%s)"
        params.append(ids)
    with connection.cursor() as cursor:
        cursor.execute(
            _REPOSITORY_BYTES_SQL.format(key="zoekt_node_id", node_filter=node_filter), params
        )
        return {node_id: (int(ready), int(total)) for node_id, ready, total in cursor.fetchall()}


def repository_bytes_by_index(index_ids: Iterable[int]) -> dict[int, int]:
    """``{index_id: repository bytes of the projects in its range}`` (one query; indices
    in the estimate's states only)."""
    ids = sorted(set(index_ids))
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            _REPOSITORY_BYTES_SQL.format(key="id", node_filter="AND i.id = ANY(%s)"),
            [READY_INDEX_STATE, list(ESTIMATE_INDEX_STATES), ids],
        )
        return {index_id: int(total) for index_id, _ready, total in cursor.fetchall()}


def estimated_memory_by_node(
    node_ids: Iterable[int] | None, memory_ratio: int | float
) -> dict[int, int]:
    """``{node_id: estimated memory of its ready and pre-ready indices}`` (one query)."""
    return {
        node_id: estimate_memory_bytes(total, memory_ratio)
        for node_id, (_ready, total) in repository_bytes_by_node(node_ids).items()
    }


def ready_used_storage_by_node(node_ids: Iterable[int] | None = None) -> dict[int, int]:
    """``{node_id: Σ used_storage_bytes of its ready indices}`` (one query)."""
    from zoekt.models import Index

    rows = Index.objects.filter(state=Index.State.READY)
    if node_ids is not None:
        rows = rows.filter(zoekt_node_id__in=sorted(set(node_ids)))
    return {
        node_id: int(total or 0)
        for node_id, total in rows.order_by()
        .values("zoekt_node_id")
        .annotate(total=Sum("used_storage_bytes"))
        .values_list("zoekt_node_id", "total")
    }


@dataclasses.dataclass(frozen=True, slots=True)
class NodeMemory:
    """One node's memory picture: reported, budgeted, estimated and observed."""

    node_id: int
    name: str
    version: str | None
    online: bool
    #: Reported by the webserver (None: not reported).
    rss_bytes: int | None
    shards_loaded: int | None
    memory_limit_bytes: int | None
    #: The node's budget (B, else A) and where it comes from; None: no budget.
    memory_budget_bytes: int | None
    budget_source: str | None
    #: Whether the planner uses that budget now (the setting A is set).
    memory_planning: bool
    #: Repository bytes of the projects of its ready indices, and of its ready
    #: and pre-ready indices; the estimate is the latter × memory_ratio.
    ready_repository_bytes: int
    repository_bytes: int
    memory_ratio: float
    estimated_memory_bytes: int
    #: Σ used_storage_bytes of its ready indices.
    ready_used_storage_bytes: int

    @property
    def observed_memory_ratio(self) -> float | None:
        """RSS ÷ used storage of the ready indices (resident bytes per index byte on disk)."""
        if not self.rss_bytes or not self.ready_used_storage_bytes:
            return None
        return self.rss_bytes / self.ready_used_storage_bytes

    @property
    def rss_per_repository_byte(self) -> float | None:
        """RSS ÷ repository bytes of the ready indices: what ``memory_ratio`` estimates."""
        if not self.rss_bytes or not self.ready_repository_bytes:
            return None
        return self.rss_bytes / self.ready_repository_bytes

    @property
    def observed_to_estimated(self) -> float | None:
        """RSS ÷ estimated memory: above 1 the estimate is low (the silent direction)."""
        if not self.rss_bytes or not self.estimated_memory_bytes:
            return None
        return self.rss_bytes / self.estimated_memory_bytes

    @property
    def memory_percent_used(self) -> float | None:
        return memory_percent_used(self.rss_bytes, self.memory_budget_bytes)

    @property
    def memory_watermark(self) -> NodeWatermark | None:
        return memory_watermark(self.memory_percent_used)

    @property
    def excluded_from_placement(self) -> bool:
        """Over the high memory watermark while memory planning is on: no new index."""
        percent = self.memory_percent_used
        return (
            self.memory_planning and percent is not None and percent >= MEMORY_WATERMARK_LIMIT_HIGH
        )

    @property
    def calibration_sample(self) -> float | None:
        """This node's auto-calibration sample, or None when it gives none."""
        if not self.online or self.ready_repository_bytes < MIN_CALIBRATION_REPOSITORY_BYTES:
            return None
        return self.rss_per_repository_byte

    def as_dict(self) -> dict[str, Any]:
        watermark = self.memory_watermark
        return {
            "node_id": self.node_id,
            "node_name": self.name,
            "version": self.version,
            "online": self.online,
            "rss_bytes": self.rss_bytes,
            "shards_loaded": self.shards_loaded,
            "memory_limit_bytes": self.memory_limit_bytes,
            "memory_budget_bytes": self.memory_budget_bytes,
            "memory_budget_source": self.budget_source,
            "memory_planning": self.memory_planning,
            "memory_ratio": self.memory_ratio,
            "estimated_memory_bytes": self.estimated_memory_bytes,
            "ready_repository_bytes": self.ready_repository_bytes,
            "repository_bytes": self.repository_bytes,
            "ready_used_storage_bytes": self.ready_used_storage_bytes,
            "observed_memory_ratio": self.observed_memory_ratio,
            "rss_per_repository_byte": self.rss_per_repository_byte,
            "observed_to_estimated": self.observed_to_estimated,
            "memory_percent_used": self.memory_percent_used,
            "memory_watermark": None if watermark is None else watermark.value,
            "excluded_from_placement": self.excluded_from_placement,
        }


def node_memory_report(
    *,
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
    node_ids: Iterable[int] | None = None,
) -> list[NodeMemory]:
    """Every search node's memory picture, by id (three queries, whatever the fleet size)."""
    from zoekt.models import Node

    settings = settings or app_settings.current()
    now = now or clock.now()
    nodes = Node.objects.for_search().order_by("id")
    if node_ids is not None:
        nodes = nodes.filter(id__in=sorted(set(node_ids)))
    rows = list(nodes.values_list("id", "metadata", "last_seen_at"))
    ids = [row[0] for row in rows]
    repository = repository_bytes_by_node(ids) if ids else {}
    used = ready_used_storage_by_node(ids) if ids else {}
    configured = settings.node_memory_budget_bytes
    ratio = settings.memory_ratio
    out = []
    for node_id, metadata, last_seen_at in rows:
        metadata = metadata or {}
        budget, source = memory_budget(metadata, configured)
        ready_repo, total_repo = repository.get(node_id, (0, 0))
        online = (now - last_seen_at).total_seconds() < capacity.ONLINE_DURATION_THRESHOLD_SECONDS
        out.append(
            NodeMemory(
                node_id=node_id,
                name=str(metadata.get("name") or f"node-{node_id}"),
                version=metadata.get("version"),
                online=online,
                rss_bytes=webserver_counter(metadata, "rss_bytes"),
                shards_loaded=webserver_counter(metadata, "shards_loaded"),
                memory_limit_bytes=webserver_counter(metadata, "memory_limit_bytes"),
                memory_budget_bytes=budget,
                budget_source=source,
                memory_planning=configured is not None,
                ready_repository_bytes=ready_repo,
                repository_bytes=total_repo,
                memory_ratio=ratio,
                estimated_memory_bytes=estimate_memory_bytes(total_repo, ratio),
                ready_used_storage_bytes=used.get(node_id, 0),
            )
        )
    return out


# --------------------------------------------------------------------------- #
# Auto-calibration
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True, slots=True)
class Calibration:
    """What one auto-calibration run found and did."""

    applied: bool
    reason: Reason
    memory_ratio_before: float
    memory_ratio_after: float
    #: The percentile of the samples before clamping (None: no sample).
    observed_percentile: float | None = None
    samples: int = 0
    nodes_reporting_rss: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "reason": str(self.reason),
            "memory_ratio_before": self.memory_ratio_before,
            "memory_ratio_after": self.memory_ratio_after,
            "observed_percentile": self.observed_percentile,
            "percentile": AUTO_CALIBRATION_PERCENTILE,
            "samples": self.samples,
            "nodes_reporting_rss": self.nodes_reporting_rss,
            "bounds": [MEMORY_RATIO_MIN, MEMORY_RATIO_MAX],
        }


def calibrated_memory_ratio(report: Iterable[NodeMemory]) -> tuple[float | None, float | None, int]:
    """``(clamped value, raw percentile, sample count)`` from a report; None without samples."""
    samples = [s for node in report if (s := node.calibration_sample) is not None]
    raw = percentile(samples, AUTO_CALIBRATION_PERCENTILE)
    if raw is None:
        return None, None, 0
    value = round(min(max(raw, MEMORY_RATIO_MIN), MEMORY_RATIO_MAX), 4)
    return value, raw, len(samples)


def calibrate_memory_ratio(now: datetime | None = None) -> Calibration:
    """Set ``memory_ratio`` from the observed samples when auto-calibration is on.

    Reads the settings row itself (not the cached settings), so a change made
    a second ago is honoured. Writes the row only when the value changes; the
    save drops the settings cache, so the next rollout plans with it.
    """
    row = app_settings.load_row()
    before = row.zoekt_memory_ratio
    if not row.zoekt_memory_auto_calibration:
        return Calibration(False, Reason.MEMORY_AUTO_CALIBRATION_DISABLED, before, before)
    settings = app_settings.from_row(row)
    report = node_memory_report(settings=settings, now=now)
    reporting = sum(1 for node in report if node.online and node.rss_bytes)
    value, raw, count = calibrated_memory_ratio(report)
    if value is None:
        return Calibration(False, Reason.NO_MEMORY_OBSERVATIONS, before, before, None, 0, reporting)
    if value != before:
        row.zoekt_memory_ratio = value
        row.save(update_fields=["zoekt_memory_ratio", "updated_at"])
    return Calibration(True, Reason.MEMORY_RATIO_CALIBRATED, before, value, raw, count, reporting)
