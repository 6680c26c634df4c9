"""The global buffer factor: planned index bytes per byte of Gitaly repository.

The planner sizes a project as ``repository_size * buffer_factor``. The
factor is observed across the fleet as GitLab's newest code observes it
(``Index.global_buffer_factor``):

* per root namespace, the ``used_storage_bytes`` of its ``ready`` indices
  whose used bytes are above the 1 KiB placeholder (an index that was never
  measured, or holds nothing, carries exactly that), over the namespace's
  ``namespace_root_storage_statistics.repository_size``; a namespace without
  a statistics row, or with a size of 0, is left out;
* the ratio of the two sums over those namespaces (not the mean of their
  ratios), times ``SAFETY_MARGIN`` = (1 / 0.6) × 1.5 = 2.5;
* GitLab's 3.0 when nothing is left to observe.

The margin: a freshly provisioned index reserves ``repository_size × factor``
= its expected used bytes × the margin, so it settles at used ÷ reserved =
1 / margin. 1 / 0.6 puts it exactly at the ideal fill (0.6); the 1.5 on top
is headroom for growth and for namespaces whose index is larger than the
fleet's average. A margin below 1 / 0.8 would provision an index that is
already critical. An earlier GitLab version used 1.2, behind a feature flag;
where GitLab's versions differ, this module follows the newest.

Recomputed by the hourly ``refresh-buffer-factor`` job and kept in Redis for
an hour; a cache miss recomputes it.
"""

from __future__ import annotations

import contextlib
import dataclasses

from django.core.cache import cache
from django.db import connection

from zoekt import capacity
from zoekt.outages import REDIS_ERRORS
from zoekt.reasons import Reason

CACHE_KEY = "zoekt:global-buffer-factor:v2"
CACHE_SECONDS = 3600

#: (1 / ideal fill 0.6) × 1.5 = 2.5 (GitLab's newest DYNAMIC_BUFFER_SAFETY_MARGIN).
SAFETY_MARGIN = (1 / capacity.STORAGE_IDEAL_PERCENT_USED) * 1.5

_OBSERVATIONS_SQL = """
SELECT COALESCE(SUM(per_namespace.used_storage_bytes), 0),
       COALESCE(SUM(per_namespace.repository_size), 0),
       COUNT(*)
FROM (
    SELECT e.root_namespace_id,
           SUM(i.used_storage_bytes) AS used_storage_bytes,
           MAX(s.repository_size) AS repository_size
    FROM zoekt_indices i
    JOIN zoekt_enabled_namespaces e ON e.id = i.zoekt_enabled_namespace_id
    JOIN namespace_root_storage_statistics s ON s.namespace_id = e.root_namespace_id
    WHERE i.state = %(ready)s
      AND i.used_storage_bytes > %(placeholder)s
      AND s.repository_size > 0
    GROUP BY e.root_namespace_id
) per_namespace
"""


@dataclasses.dataclass(frozen=True)
class BufferFactor:
    value: float
    reason: Reason
    #: Σ used bytes of the observed namespaces' measured ready indices.
    used_storage_bytes: int
    #: Σ root repository size of the observed namespaces.
    repository_size: int
    #: How many root namespaces were observed.
    namespaces: int = 0


def compute_global_buffer_factor() -> BufferFactor:
    """Observe the factor from the database (no cache)."""
    from zoekt.models import Index

    with connection.cursor() as cursor:
        cursor.execute(
            _OBSERVATIONS_SQL,
            {"ready": Index.State.READY, "placeholder": capacity.DEFAULT_USED_STORAGE_BYTES},
        )
        used, repository_size, namespaces = cursor.fetchone()
    used, repository_size = int(used), int(repository_size)
    if used <= 0 or repository_size <= 0:
        return BufferFactor(
            float(capacity.DEFAULT_BUFFER_FACTOR), Reason.BUFFER_FACTOR_NO_OBSERVATIONS, 0, 0, 0
        )
    value = capacity.observed_buffer_factor(used, repository_size) * SAFETY_MARGIN
    return BufferFactor(
        value, Reason.BUFFER_FACTOR_OBSERVED, used, repository_size, int(namespaces)
    )


def refresh_global_buffer_factor() -> BufferFactor:
    factor = compute_global_buffer_factor()
    with contextlib.suppress(*REDIS_ERRORS):  # a cache: computed again next time
        cache.set(CACHE_KEY, dataclasses.asdict(factor), CACHE_SECONDS)
    return factor


def global_buffer_factor() -> float:
    """The cached factor, computed now when the cache has none (or Redis is down)."""
    try:
        cached = cache.get(CACHE_KEY)
    except REDIS_ERRORS:
        cached = None
    if isinstance(cached, dict) and "value" in cached:
        return float(cached["value"])
    return refresh_global_buffer_factor().value
