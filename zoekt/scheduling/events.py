"""The event jobs of scheduling: GitLab's event workers (reference 6.4) as Celery tasks.

A scheduled task (``zoekt.scheduling.service``) dispatches an event by
enqueueing one of these after its transaction commits (``delay_on_commit``),
so a worker never races the rows it was told about. Each task is thin: it
skips while indexing is paused (GitLab pauses its event workers), runs one
handler of ``zoekt.scheduling.handlers`` and logs one line. When the handler
says work remains (a full batch and more to do), the task enqueues itself
again, after its lock is released.

Safe to run twice at once:

* jobs over a global scope take their own advisory lock and skip when it is
  held (GitLab deduplicates its event jobs until executed); the two storage
  refreshes take a session-level lock, because each index is refreshed in its
  own short transaction that locks the index's node row;
* ``reindex_repos`` (one event per node) waits for its lock rather than
  skipping, so the events of several nodes run one after another and none is
  lost;
* ``initialize_index`` and ``delete_lost_node`` claim their row instead (see
  the handlers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from celery import shared_task
from django.db import transaction

from zoekt import app_settings
from zoekt.locks import LockKey, advisory_xact_lock, try_advisory_lock, try_advisory_session_lock
from zoekt.logging import get_logger
from zoekt.reasons import Reason
from zoekt.scheduling import handlers

log = get_logger(__name__)

LOG_EVENT = "scheduling_event"


@contextlib.contextmanager
def _waiting_lock(key: LockKey) -> Iterator[bool]:
    with transaction.atomic():
        advisory_xact_lock(key)
        yield True


def _run(
    event: str,
    handler: Callable[[], dict[str, Any]],
    *,
    lock: LockKey | None = None,
    session_lock: bool = False,
    wait: bool = False,
    re_emit: Callable[[], None] | None = None,
    **ids: Any,
) -> dict[str, Any]:
    if app_settings.current().indexing_paused:
        result: dict[str, Any] = {"skipped": Reason.INDEXING_PAUSED, "re_emit": False}
    elif lock is None:
        result = handler()
    else:
        if wait:
            held = _waiting_lock(lock)
        elif session_lock:
            held = try_advisory_session_lock(lock)
        else:
            held = try_advisory_lock(lock)
        with held as acquired:
            result = handler() if acquired else {"skipped": Reason.LOCK_HELD, "re_emit": False}
    # The lock is released (and its transaction committed): a re-emitted job can take it.
    if result.get("re_emit") and re_emit is not None:
        re_emit()
    log.info(LOG_EVENT, **{**ids, **result, "worker": event})
    return result


@shared_task(name="zoekt.initialize_index")
def initialize_index_task(index_id: int) -> dict:
    """InitialIndexingEventWorker: the repository rows of one pending index (6.6)."""
    return _run(
        "initialize_index",
        lambda: handlers.initialize_index(index_id),
        re_emit=lambda: initialize_index_task.delay_on_commit(index_id),
        index_id=index_id,
    )


@shared_task(name="zoekt.index_repos")
def index_repos_task() -> dict:
    """RepoToIndexEventWorker: index tasks for 500 pending repositories."""
    return _run(
        "index_repos",
        handlers.index_repos,
        lock=LockKey.EVENT_INDEX_REPOS,
        re_emit=index_repos_task.delay_on_commit,
    )


@shared_task(name="zoekt.reindex_repos")
def reindex_repos_task(node_id: int) -> dict:
    """RepoToReindexEventWorker: index tasks for 1,000 outdated repositories of one node."""
    return _run(
        "reindex_repos",
        lambda: handlers.reindex_repos(node_id),
        lock=LockKey.EVENT_REINDEX_REPOS,
        wait=True,
        node_id=node_id,
    )


@shared_task(name="zoekt.delete_repos")
def delete_repos_task() -> dict:
    """RepoMarkedAsToDeleteEventWorker: delete tasks for 500 deletable repositories."""
    return _run(
        "delete_repos",
        handlers.delete_repos,
        lock=LockKey.EVENT_DELETE_REPOS,
        re_emit=delete_repos_task.delay_on_commit,
    )


@shared_task(name="zoekt.orphan_repos")
def orphan_repos_task() -> dict:
    """OrphanedRepoEventWorker: mark 1,000 repositories without a project orphaned."""
    return _run(
        "orphan_repos",
        handlers.orphan_repos,
        lock=LockKey.EVENT_ORPHAN_REPOS,
        re_emit=orphan_repos_task.delay_on_commit,
    )


@shared_task(name="zoekt.orphan_indices")
def orphan_indices_task() -> dict:
    """OrphanedIndexEventWorker: mark 1,000 indices without namespace or replica orphaned."""
    return _run("orphan_indices", handlers.orphan_indices, lock=LockKey.EVENT_ORPHAN_INDICES)


@shared_task(name="zoekt.mark_indices_ready")
def mark_indices_ready_task() -> dict:
    """IndexMarkedAsReadyEventWorker: 1,000 finished initializing indices become ready."""
    return _run(
        "mark_indices_ready", handlers.mark_indices_ready, lock=LockKey.EVENT_MARK_INDICES_READY
    )


@shared_task(name="zoekt.delete_indices")
def delete_indices_task() -> dict:
    """IndexMarkedAsToDeleteEventWorker: drain or destroy 500 deletable indices."""
    return _run("delete_indices", handlers.delete_indices, lock=LockKey.EVENT_DELETE_INDICES)


@shared_task(name="zoekt.update_index_used_storage_bytes")
def update_index_used_storage_bytes_task() -> dict:
    """UpdateIndexUsedStorageBytesEventWorker: refresh 1,000 stale indices (4.3)."""
    return _run(
        "update_index_used_storage_bytes",
        handlers.update_index_used_storage_bytes,
        lock=LockKey.EVENT_UPDATE_INDEX_USED_STORAGE_BYTES,
        session_lock=True,
        re_emit=update_index_used_storage_bytes_task.delay_on_commit,
    )


@shared_task(name="zoekt.shrink_overprovisioned_indices")
def shrink_overprovisioned_indices_task() -> dict:
    """ForceUpdateOverprovisionedIndexEventWorker: shrink 1,000 over-provisioned reservations."""
    return _run(
        "shrink_overprovisioned_indices",
        handlers.shrink_overprovisioned_indices,
        lock=LockKey.EVENT_SHRINK_OVERPROVISIONED_INDICES,
        session_lock=True,
        re_emit=shrink_overprovisioned_indices_task.delay_on_commit,
    )


@shared_task(name="zoekt.delete_lost_node")
def delete_lost_node_task(node_id: int) -> dict:
    """LostNodeEventWorker: delete one lost node with its indices and repositories (6.7)."""
    return _run("delete_lost_node", lambda: handlers.delete_lost_node(node_id), node_id=node_id)


#: The shared runner of event jobs (skip while paused, lock, log one line).
run_event = _run

# Event name → Celery task; the names scheduled tasks dispatch.
EVENTS = {
    "initialize_index": initialize_index_task,
    "index_repos": index_repos_task,
    "reindex_repos": reindex_repos_task,
    "delete_repos": delete_repos_task,
    "orphan_repos": orphan_repos_task,
    "orphan_indices": orphan_indices_task,
    "mark_indices_ready": mark_indices_ready_task,
    "delete_indices": delete_indices_task,
    "update_index_used_storage_bytes": update_index_used_storage_bytes_task,
    "shrink_overprovisioned_indices": shrink_overprovisioned_indices_task,
    "delete_lost_node": delete_lost_node_task,
}

#: Event name → Celery task name, for the events whose jobs another package owns:
#: each registers its table when its app is ready (``register_events``), so nothing
#: here imports it. Eviction's (``eviction.tasks.EVICTION_EVENTS``) are the ones.
REGISTERED: dict[str, str] = {}


def register_events(table: Mapping[str, str]) -> None:
    """Dispatch each event of ``table`` to the Celery task it names. Registering the same
    table again changes nothing; an event registered to another task is refused."""
    for event, task_name in table.items():
        if event in EVENTS or REGISTERED.get(event, task_name) != task_name:
            raise ValueError(f"event {event!r} has a job already")
    REGISTERED.update(table)


def task_for(event: str):
    """The Celery task an event dispatches: zoekt's own, or a registered one by its name."""
    if event in EVENTS:
        return EVENTS[event]
    from celery import current_app

    return current_app.tasks[REGISTERED[event]]
