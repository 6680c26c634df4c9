"""Creating tasks for repositories in bulk (reference 7.1)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet

from zoekt import clock
from zoekt.models import Repository, Task


def create_bulk_tasks(
    repositories: QuerySet[Repository],
    task_type: int = Task.TaskType.INDEX_REPO,
    perform_at: datetime | None = None,
) -> int:
    """One task per repository, skipping those with a pending task of the same type.

    Index tasks are made only for indexable repositories, whose ``pending``
    rows become ``initializing``; delete tasks mark their repositories
    ``deleted``. Returns the number of tasks created. Safe to repeat: a
    second call finds the pending tasks of the first and creates nothing.
    """
    now = clock.now()
    perform_at = perform_at or now
    scope = repositories
    if task_type != Task.TaskType.DELETE_REPO:
        scope = scope.filter(state__in=Repository.INDEXABLE_STATES)
    pending_same_type = Task.objects.filter(
        zoekt_repository_id=OuterRef("pk"), task_type=task_type, state=Task.State.PENDING
    )
    with transaction.atomic():
        rows = list(
            scope.exclude(Exists(pending_same_type))
            .select_for_update(of=("self",))
            .order_by("id")
            .values_list("id", "zoekt_index__zoekt_node_id", "project_identifier")
        )
        if not rows:
            return 0
        Task.objects.bulk_create(
            [
                Task(
                    zoekt_repository_id=repo_id,
                    zoekt_node_id=node_id,
                    project_identifier=project_identifier,
                    task_type=task_type,
                    perform_at=perform_at,
                    retries_left=Task.MODEL_DEFAULT_RETRIES_LEFT,
                    created_at=now,
                    updated_at=now,
                )
                for repo_id, node_id, project_identifier in rows
            ]
        )
        ids = [row[0] for row in rows]
        if task_type == Task.TaskType.DELETE_REPO:
            Repository.objects.filter(id__in=ids).update(
                state=Repository.State.DELETED, updated_at=now
            )
        else:
            Repository.objects.filter(id__in=ids, state=Repository.State.PENDING).update(
                state=Repository.State.INITIALIZING, updated_at=now
            )
    return len(rows)
