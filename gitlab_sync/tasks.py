"""Celery jobs of the GitLab integration."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from zoekt.logging import get_logger

log = get_logger(__name__)

#: Beat's safety net: hooks whose enqueue was lost, and pushes past their debounce.
PROCESS_HOOKS_SECONDS = 60


@shared_task(name="gitlab_sync.process_hooks")
def process_hooks() -> dict:
    """Refetch what the stored system hooks name (nothing to do without a GitLab)."""
    if not (settings.ZOEKT_GITLAB_URL and settings.ZOEKT_GITLAB_TOKEN_FILE):
        return {}
    from gitlab_sync import hooks

    counts = hooks.process()
    if counts:
        log.info("gitlab_hooks_processed", **counts)
    return counts
