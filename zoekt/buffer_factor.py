"""The global buffer factor: index bytes on disk per byte of Gitaly repository.

The planner sizes a project as ``repository_size * buffer_factor``. Rather
than a constant, the factor is observed across the fleet: the sum of
``used_storage_bytes`` over ready indices divided by the sum of
``repository_size`` of the projects those indices hold. It is recomputed by
the hourly ``refresh-buffer-factor`` job and kept in Redis; when nothing is
ready yet (or the sizes are zero) the factor falls back to GitLab's 3.
"""

from __future__ import annotations

import dataclasses

from django.core.cache import cache
from django.db.models import Sum

from zoekt import capacity
from zoekt.reasons import Reason

CACHE_KEY = "zoekt:global-buffer-factor:v1"
CACHE_SECONDS = 3600


@dataclasses.dataclass(frozen=True)
class BufferFactor:
    value: float
    reason: Reason
    used_storage_bytes: int
    repository_size: int


def compute_global_buffer_factor() -> BufferFactor:
    """Observe the factor from the database (no cache)."""
    from zoekt.models import Index, Repository

    ready_indices = Index.objects.filter(state=Index.State.READY)
    used = ready_indices.aggregate(total=Sum("used_storage_bytes"))["total"] or 0
    # One repository size per repository row: a project held by two replicas is two copies,
    # matching the used bytes of both replicas' indices.
    repository_size = (
        Repository.objects.filter(zoekt_index__in=ready_indices, project__isnull=False).aggregate(
            total=Sum("project__statistics__repository_size")
        )["total"]
        or 0
    )
    value = capacity.observed_buffer_factor(used, repository_size)
    reason = (
        Reason.BUFFER_FACTOR_OBSERVED
        if used > 0 and repository_size > 0
        else Reason.BUFFER_FACTOR_NO_OBSERVATIONS
    )
    return BufferFactor(value, reason, used, repository_size)


def refresh_global_buffer_factor() -> BufferFactor:
    factor = compute_global_buffer_factor()
    cache.set(CACHE_KEY, dataclasses.asdict(factor), CACHE_SECONDS)
    return factor


def global_buffer_factor() -> float:
    """The cached factor, computed now when the cache has none."""
    cached = cache.get(CACHE_KEY)
    if isinstance(cached, dict) and "value" in cached:
        return float(cached["value"])
    return refresh_global_buffer_factor().value
