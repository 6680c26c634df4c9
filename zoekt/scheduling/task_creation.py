"""Creating tasks for repositories in bulk (reference 7.1)."""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet

from zoekt import clock, transitions
from zoekt.models import Repository, Task

_INSERT_TASKS_SQL = """
INSERT INTO zoekt_tasks (
    zoekt_repository_id, zoekt_node_id, project_identifier, task_type, state,
    perform_at, retries_left, created_at, updated_at
)
SELECT t.repository_id, t.node_id, t.project_identifier, %(task_type)s, 0,
       %(perform_at)s, %(retries_left)s, %(now)s, %(now)s
FROM unnest(%(repositories)s::bigint[], %(nodes)s::bigint[], %(projects)s::bigint[])
     AS t(repository_id, node_id, project_identifier)
ON CONFLICT DO NOTHING
RETURNING zoekt_repository_id
"""


def create_bulk_tasks(
    repositories: QuerySet[Repository],
    task_type: int = Task.TaskType.INDEX_REPO,
    perform_at: datetime | None = None,
) -> int:
    """One task per repository, skipping those with a pending task of the same type.

    Index tasks are made only for indexable repositories, whose ``pending``
    rows become ``initializing``; delete tasks mark their repositories
    ``deleted``. Returns the number of tasks created. Safe to repeat: a
    second call finds the pending tasks of the first and creates nothing, and
    two calls at once cannot both create one (the database refuses the second).
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
        # The database refuses a second pending task of one type for one repository
        # (the partial unique index ``zoekt_tasks_one_pending_per_repository``): the
        # NOT EXISTS above is read under READ COMMITTED, and two runs at once can both
        # pass it. The insert skips what the index refuses and says what it wrote.
        with connection.cursor() as cursor:
            cursor.execute(
                _INSERT_TASKS_SQL,
                {
                    "repositories": [row[0] for row in rows],
                    "nodes": [row[1] for row in rows],
                    "projects": [row[2] for row in rows],
                    "task_type": int(task_type),
                    "perform_at": perform_at,
                    "retries_left": Task.MODEL_DEFAULT_RETRIES_LEFT,
                    "now": now,
                },
            )
            ids = [repo_id for (repo_id,) in cursor.fetchall()]
        if task_type == Task.TaskType.DELETE_REPO:
            transitions.mark_repositories_deleted(Repository.objects.filter(id__in=ids), now=now)
        else:
            transitions.mark_repositories_initializing(
                Repository.objects.filter(id__in=ids), now=now
            )
    return len(ids)
