"""Capacity arithmetic as plain functions over plain numbers.

The model methods and querysets call these, and so can the pure planner; the
numbers are GitLab's (reference sections 1.1, 1.4, 2.2, 4).
"""

from __future__ import annotations

import enum
from decimal import ROUND_HALF_UP, Decimal

GIB = 1024**3

# --- Node (zoekt_nodes) ---------------------------------------------------------
DEFAULT_CONCURRENCY_LIMIT = 20
MAX_CONCURRENCY_LIMIT = 200
ONLINE_DURATION_THRESHOLD_SECONDS = 30
WATERMARK_LIMIT_LOW = 0.60
WATERMARK_LIMIT_HIGH = 0.75
WATERMARK_LIMIT_CRITICAL = 0.85
# GitLab's development environment raises the high and critical node limits.
DEVELOPMENT_WATERMARK_LIMIT_HIGH = 0.98
DEVELOPMENT_WATERMARK_LIMIT_CRITICAL = 0.99
TASK_PULL_FREQUENCY_DEFAULT = "5s"
TASK_PULL_FREQUENCY_INCREASED = "500ms"
DEBOUNCE_DELAY_SECONDS = 5

# --- Index (zoekt_indices) ---------------------------------------------------------
DEFAULT_RESERVED_STORAGE_BYTES = 10 * GIB
DEFAULT_USED_STORAGE_BYTES = 1024
STORAGE_IDEAL_PERCENT_USED = 0.60
STORAGE_LOW_WATERMARK = 0.70
STORAGE_HIGH_WATERMARK = 0.75
STORAGE_CRITICAL_WATERMARK = 0.80

# --- Planning ---------------------------------------------------------------------------
MAX_INDICES_PER_REPLICA = 10
DEFAULT_BUFFER_FACTOR = 3


class NodeWatermark(enum.StrEnum):
    """A node's disk bucket, each node in its highest one (as `gitlab:zoekt:info` counts)."""

    NORMAL = "normal"
    LOW = "low"
    HIGH = "high"
    CRITICAL = "critical"


#: The eviction sustain clock's hysteresis: a node's clock, started when its
#: disk use reached the high watermark, keeps running while use stays above
#: high − this, so a node hovering around 75 % does not restart it on every
#: dip (docs/eviction.md). Eviction still needs use at or over high.
EVICTION_HYSTERESIS = 0.05


def hysteresis_floor(high: float) -> float:
    """The high watermark less the hysteresis band: a node under it has no sustain clock
    running, and work the control plane adds to a node (a move's target, the temporary
    bytes of builds) keeps it under it so that it never starts one."""
    return high - EVICTION_HYSTERESIS


def watermark_limits(development: bool = False) -> tuple[float, float, float]:
    """(low, high, critical) node disk limits."""
    if development:
        return (
            WATERMARK_LIMIT_LOW,
            DEVELOPMENT_WATERMARK_LIMIT_HIGH,
            DEVELOPMENT_WATERMARK_LIMIT_CRITICAL,
        )
    return WATERMARK_LIMIT_LOW, WATERMARK_LIMIT_HIGH, WATERMARK_LIMIT_CRITICAL


def storage_percent_used(used_bytes: int, total_bytes: int) -> float:
    """used ÷ total, or 0 when the node reports no disk."""
    if not total_bytes:
        return 0.0
    return used_bytes / total_bytes


def node_watermark(percent_used: float, development: bool = False) -> NodeWatermark:
    """The highest limit the ratio reaches; reaching a limit (>=) exceeds it."""
    return node_watermark_for_limits(percent_used, watermark_limits(development))


def node_watermark_for_limits(
    percent_used: float, limits: tuple[float, float, float]
) -> NodeWatermark:
    """The highest of ``(low, high, critical)`` the ratio reaches (>=); also for memory."""
    low, high, critical = limits
    if percent_used >= critical:
        return NodeWatermark.CRITICAL
    if percent_used >= high:
        return NodeWatermark.HIGH
    if percent_used >= low:
        return NodeWatermark.LOW
    return NodeWatermark.NORMAL


def usable_storage_bytes(total_bytes: int, used_bytes: int, indexed_bytes: int) -> int:
    """Free space plus what Zoekt's own index files take: what Zoekt could use."""
    return (total_bytes - used_bytes) + indexed_bytes


def concurrency_limit(
    concurrency: int | None, concurrency_override: int | None, cpu_to_tasks_ratio: float
) -> int:
    """How many tasks a node is handed at once (reference 1.1)."""
    if concurrency_override and concurrency_override > 0:
        return int(concurrency_override)
    # Ruby's round(): halves away from zero, unlike Python's banker's rounding.
    # Decimal(float) is exact, so no "+ 0.5" can round 0.49999999999999994 up.
    product = Decimal((concurrency or 0) * cpu_to_tasks_ratio)
    computed = int(product.to_integral_value(rounding=ROUND_HALF_UP))
    if computed == 0:
        return DEFAULT_CONCURRENCY_LIMIT
    return min(computed, MAX_CONCURRENCY_LIMIT)


# Index watermark levels: GitLab's enum values.
class IndexWatermark(enum.IntEnum):
    HEALTHY = 0
    OVERPROVISIONED = 10
    LOW_WATERMARK_EXCEEDED = 30
    HIGH_WATERMARK_EXCEEDED = 60
    CRITICAL_WATERMARK_EXCEEDED = 90


def index_watermark_level(
    used_storage_bytes: int, reserved_storage_bytes: int | None
) -> IndexWatermark:
    """The level stored on an index (GitLab's Ruby calculation, reference 2.2).

    A ratio that cannot be computed (no or zero reservation) or is negative is
    critical.
    """
    if not reserved_storage_bytes:
        return IndexWatermark.CRITICAL_WATERMARK_EXCEEDED
    ratio = used_storage_bytes / reserved_storage_bytes
    if ratio < 0:
        return IndexWatermark.CRITICAL_WATERMARK_EXCEEDED
    if ratio < STORAGE_IDEAL_PERCENT_USED:
        return IndexWatermark.OVERPROVISIONED
    if ratio < STORAGE_LOW_WATERMARK:
        return IndexWatermark.HEALTHY
    if ratio < STORAGE_HIGH_WATERMARK:
        return IndexWatermark.LOW_WATERMARK_EXCEEDED
    if ratio < STORAGE_CRITICAL_WATERMARK:
        return IndexWatermark.HIGH_WATERMARK_EXCEEDED
    return IndexWatermark.CRITICAL_WATERMARK_EXCEEDED


def resized_reservation(
    used_storage_bytes: int,
    reserved_storage_bytes: int | None,
    node_unclaimed_storage_bytes: int,
    index_is_ready: bool,
) -> int:
    """The reservation an index ends with after a refresh (reference 4.3, steps 2-5).

    Growing claims from the node's unclaimed bytes, never more than it has and
    nothing when it has none; shrinking to the ideal happens only once the
    index is ready, so the planner's buffer survives while it fills.
    """
    current = reserved_storage_bytes or 0
    ideal = int(used_storage_bytes / STORAGE_IDEAL_PERCENT_USED)
    if ideal > current:
        if node_unclaimed_storage_bytes <= 0:
            return current
        return min(ideal, node_unclaimed_storage_bytes + current)
    if index_is_ready:
        return ideal
    return current


def observed_buffer_factor(
    used_storage_bytes: int, repository_size: int, fallback: float = DEFAULT_BUFFER_FACTOR
) -> float:
    """Index bytes per repository byte over ready indices, or the fallback when unknown."""
    if used_storage_bytes <= 0 or repository_size <= 0:
        return float(fallback)
    return used_storage_bytes / repository_size


#: The largest byte count a node or the catalog may report: 1 PiB, more than any disk or
#: repository, and small enough that sums of 8,192 of them (a node's usable storage,
#: an index's repositories) stay inside PostgreSQL's bigint.
MAX_BYTES = 2**50

# --- Memory: the same watermark arithmetic on RSS ÷ budget -----------------------------------

#: Memory watermarks on ``rss_bytes / budget`` (the disk limits' values, reference 4.1).
MEMORY_WATERMARK_LIMIT_LOW = 0.60
MEMORY_WATERMARK_LIMIT_HIGH = 0.75
MEMORY_WATERMARK_LIMIT_CRITICAL = 0.85


def memory_percent_used(rss_bytes: int | None, budget_bytes: int | None) -> float | None:
    """RSS ÷ budget, or None without an RSS report or a positive budget."""
    if rss_bytes is None or not budget_bytes:
        return None
    return rss_bytes / budget_bytes


def memory_watermark_limits() -> tuple[float, float, float]:
    return MEMORY_WATERMARK_LIMIT_LOW, MEMORY_WATERMARK_LIMIT_HIGH, MEMORY_WATERMARK_LIMIT_CRITICAL
