"""The domain's after-commit enqueues, declared in one place.

An action that starts a Celery job once its transaction commits calls one
function here, which looks the task up by its registered name and enqueues
it after commit: a worker never races the rows it is told about, and no
action imports a task module. A message whose loss the database can repair
(a failed task's retry: ``zoekt.tasks.sweep_failed_tasks``) is sent without
raising when the broker is down; one the caller must know about (an
operator's "index this project") raises, and the API answers 503. The
task modules import the actions (``zoekt.tasks`` → ``zoekt.actions``), never
the other way round. ``ZoektConfig.ready`` imports the task modules, so every
name below is registered in every process, the web server's included.
"""

from __future__ import annotations

import functools

from celery import current_app
from django.db import transaction

from zoekt.logging import get_logger
from zoekt.outages import BROKER_ERRORS

log = get_logger(__name__)

HANDLE_TASK_FAILED = "zoekt.handle_task_failed"
INDEX_PROJECT = "zoekt.index_project"
REBALANCE_FLEET = "eviction.rebalance_fleet"
SAMPLE_NODE = "dashboard.sample_node"


def _task(name: str):
    return current_app.tasks[name]


def _send(name: str, args: tuple, **options) -> None:
    """Enqueue now; a broker that does not answer is logged, not raised: the request
    that committed its rows has done its part, and what the message would have done
    is recovered from the database (``zoekt.tasks.sweep_failed_tasks``)."""
    try:
        _task(name).apply_async(args, **options)
    except BROKER_ERRORS as error:
        log.warning("enqueue_failed", task=name, args=list(args), error=error.__class__.__name__)


def handle_task_failed_on_commit(task_id: int) -> None:
    """After commit: spend one of the failed task's repository retries (``zoekt.tasks``)."""
    transaction.on_commit(functools.partial(_send, HANDLE_TASK_FAILED, (task_id,)))


def index_project_on_commit(project_id: int, job_id: str) -> None:
    """After commit: queue an ``index_repo`` for the project as Celery job ``job_id``.

    ``delay_on_commit`` cannot choose the job id, which GitLab's reply needs;
    ``apply_async_on_commit`` is the same after-commit enqueue with that option.
    """
    _task(INDEX_PROJECT).apply_async_on_commit((project_id,), task_id=job_id)


def rebalance_fleet_on_commit() -> None:
    """After commit: one run of the rebalance reconciler (``eviction.rebalance``), when a
    node joins; the beat entry runs it anyway every 5 minutes, so a lost message is only
    a later start."""
    transaction.on_commit(functools.partial(_send, REBALANCE_FLEET, ()))


def sample_node_on_commit(node_id: int) -> None:
    """After commit: the first history sample of a node that just registered, so its page
    draws it from the start rather than after the next 5-minute beat run (a lost message
    only means that wait)."""
    transaction.on_commit(functools.partial(_send, SAMPLE_NODE, (node_id,)))
