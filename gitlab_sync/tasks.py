"""Celery jobs of the GitLab integration."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from zoekt.logging import get_logger

log = get_logger(__name__)


@shared_task(name="gitlab_sync.process_hooks")
def process_hooks() -> dict:
    """Refetch what the stored system hooks name (nothing to do without a GitLab)."""
    if not (settings.ZOEKT_GITLAB_URL and settings.ZOEKT_GITLAB_TOKEN_FILE):
        return {}
    from gitlab_sync import hooks

    counts = hooks.process()
    pruned = hooks.prune()
    if pruned:
        counts["pruned"] = pruned
    if counts:
        log.info("gitlab_hooks_processed", **counts)
    return counts


def _sweep(kind: str) -> dict:
    if not (settings.ZOEKT_GITLAB_URL and settings.ZOEKT_GITLAB_TOKEN_FILE):
        return {}
    from gitlab_sync import sweep

    try:
        record = sweep.run(sweep.Config.from_settings(), kind=kind)
    except sweep.SweepBusy:
        return {"skipped": "another sweep is running"}
    except sweep.SweepError as exc:
        log.error("gitlab_sweep_job_failed", kind=kind, error=str(exc))
        return {"failed": str(exc)}
    return {"sweep_id": record.id, "kind": record.kind, **record.counts}


@shared_task(name="gitlab_sync.delta_sweep")
def delta_sweep() -> dict:
    """What changed in GitLab since the last complete sweep (nothing without a GitLab)."""
    return _sweep("delta")


@shared_task(name="gitlab_sync.full_sweep")
def full_sweep() -> dict:
    """All of GitLab, and the removal of what it lost (nothing without a GitLab)."""
    return _sweep("full")
