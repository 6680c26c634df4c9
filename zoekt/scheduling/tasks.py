"""Celery tasks of scheduling: thin, ids or names as arguments, one log line each."""

from __future__ import annotations

from celery import shared_task

from zoekt import app_settings
from zoekt.locks import LockKey, try_advisory_lock
from zoekt.logging import get_logger
from zoekt.models import Project
from zoekt.reasons import Reason
from zoekt.scheduling import (
    events,  # noqa: F401  (registers the event tasks with the worker)
    lost_index_data,  # noqa: F401  (registers its check with the worker)
    metrics,
)
from zoekt.scheduling.indexing import IndexingTaskService
from zoekt.scheduling.service import TASKS, SchedulingService

log = get_logger(__name__)

# Beat's tick: ``scheduling`` in ``zoekt.scheduling.beat`` (GitLab's cron: every minute).
SCHEDULING_INTERVAL_SECONDS = 60

# One advisory lock per scheduled task; never renumbered (``zoekt.locks``).
SCHEDULING_LOCKS: dict[str, LockKey] = {
    "auto_index_self_managed": LockKey.SCHEDULING_AUTO_INDEX_SELF_MANAGED,
    "eviction": LockKey.SCHEDULING_EVICTION,
    "initial_indexing": LockKey.SCHEDULING_INITIAL_INDEXING,
    "node_with_negative_unclaimed_storage_bytes_check": (
        LockKey.SCHEDULING_NODE_WITH_NEGATIVE_UNCLAIMED_STORAGE_BYTES_CHECK
    ),
    "update_index_used_bytes": LockKey.SCHEDULING_UPDATE_INDEX_USED_BYTES,
    "force_update_overprovisioned_index": LockKey.SCHEDULING_FORCE_UPDATE_OVERPROVISIONED_INDEX,
    "indices_to_evict_check": LockKey.SCHEDULING_INDICES_TO_EVICT_CHECK,
    "index_mismatched_watermark_check": LockKey.SCHEDULING_INDEX_MISMATCHED_WATERMARK_CHECK,
    "index_should_be_marked_as_orphaned_check": (
        LockKey.SCHEDULING_INDEX_SHOULD_BE_MARKED_AS_ORPHANED_CHECK
    ),
    "index_should_be_marked_as_pending_eviction_check": (
        LockKey.SCHEDULING_INDEX_SHOULD_BE_MARKED_AS_PENDING_EVICTION_CHECK
    ),
    "index_to_delete_check": LockKey.SCHEDULING_INDEX_TO_DELETE_CHECK,
    "lost_nodes_check": LockKey.SCHEDULING_LOST_NODES_CHECK,
    "mark_indices_as_ready": LockKey.SCHEDULING_MARK_INDICES_AS_READY,
    "repo_should_be_marked_as_orphaned_check": (
        LockKey.SCHEDULING_REPO_SHOULD_BE_MARKED_AS_ORPHANED_CHECK
    ),
    "repo_to_index_check": LockKey.SCHEDULING_REPO_TO_INDEX_CHECK,
    "repo_to_reindex_check": LockKey.SCHEDULING_REPO_TO_REINDEX_CHECK,
    "repo_to_delete_check": LockKey.SCHEDULING_REPO_TO_DELETE_CHECK,
    "update_index_used_storage_bytes": LockKey.SCHEDULING_UPDATE_INDEX_USED_STORAGE_BYTES,
    # Shared with the standalone ``update-replica-states`` beat job: never both at once.
    "update_replica_states": LockKey.UPDATE_REPLICA_STATES,
}


def scheduling_gate() -> Reason | None:
    """Why scheduling may not run now (GitLab's SchedulingWorker gating), or None."""
    return app_settings.current().indexing_gate


@shared_task(name="zoekt.scheduling")
def scheduling_task() -> dict:
    """GitLab's SchedulingWorker without an argument: enqueue one job per scheduled task.

    Each job expires after the tick, so a backlog never runs a task twice in a row.
    """
    skipped = scheduling_gate()
    if skipped is not None:
        log.info("scheduling", skipped=skipped)
        return {"skipped": skipped}
    for name in TASKS:
        run_scheduled_task.apply_async((name,), expires=SCHEDULING_INTERVAL_SECONDS)
    result = {"enqueued": len(TASKS)}
    log.info("scheduling", **result)
    return result


@shared_task(name="zoekt.run_scheduled_task")
def run_scheduled_task(name: str, bypass_throttle: bool = False) -> dict:
    """GitLab's SchedulingWorker with a task name: run that one task under its lock."""
    lock = SCHEDULING_LOCKS[name]
    skipped = scheduling_gate()
    if skipped is not None:
        result = {"task": name, "skipped": skipped}
    else:
        with try_advisory_lock(lock) as acquired:
            if acquired:
                result = SchedulingService(bypass_throttle=bypass_throttle).execute(name)
            else:
                result = {"task": name, "skipped": Reason.LOCK_HELD}
    log.info("scheduled_task", **result)
    return result


@shared_task(name="zoekt.log_metrics")
def log_metrics_task() -> dict:
    """GitLab's MetricsUpdateCronWorker: node and index counts, as one log line a minute."""
    if not app_settings.current().indexing_enabled:
        log.info("zoekt_metrics", skipped=Reason.INDEXING_DISABLED)
        return {"skipped": Reason.INDEXING_DISABLED}
    result = metrics.collect()
    log.info("zoekt_metrics", **result)
    return result


@shared_task(name="zoekt.index_project")
def index_project_task(project_id: int) -> dict:
    """GitLab's IndexingTaskWorker for one ``index_repo`` request (reference 7.1).

    Runs only while indexing is enabled; re-reads the project, since it may
    have gone between the request and now.
    """
    if not app_settings.current().indexing_enabled:
        result = {"project_id": project_id, "skipped": Reason.INDEXING_DISABLED}
        log.info("index_project", **result)
        return result
    project = Project.objects.select_related("namespace").filter(pk=project_id).first()
    if project is None:
        result = {"project_id": project_id, "skipped": Reason.PROJECT_NOT_FOUND}
        log.info("index_project", **result)
        return result
    result = IndexingTaskService(project_id, project=project).execute().as_dict()
    log.info("index_project", **result)
    return result
