"""The domain's after-commit enqueues, declared in one place.

An action that starts a Celery job once its transaction commits calls one
function here, which looks the task up by its registered name and enqueues
it with ``delay_on_commit`` / ``apply_async_on_commit``: a worker never
races the rows it is told about, and no action imports a task module. The
task modules import the actions (``zoekt.tasks`` → ``zoekt.actions``), never
the other way round. ``ZoektConfig.ready`` imports the task modules, so every
name below is registered in every process, the web server's included.
"""

from __future__ import annotations

from celery import current_app

HANDLE_TASK_FAILED = "zoekt.handle_task_failed"
INDEX_PROJECT = "zoekt.index_project"


def _task(name: str):
    return current_app.tasks[name]


def handle_task_failed_on_commit(task_id: int) -> None:
    """After commit: spend one of the failed task's repository retries (``zoekt.tasks``)."""
    _task(HANDLE_TASK_FAILED).delay_on_commit(task_id)


def index_project_on_commit(project_id: int, job_id: str) -> None:
    """After commit: queue an ``index_repo`` for the project as Celery job ``job_id``.

    ``delay_on_commit`` cannot choose the job id, which GitLab's reply needs;
    ``apply_async_on_commit`` is the same after-commit enqueue with that option.
    """
    _task(INDEX_PROJECT).apply_async_on_commit((project_id,), task_id=job_id)
