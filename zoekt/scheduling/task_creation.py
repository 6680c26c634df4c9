"""Creating tasks for repositories in bulk (reference 7.1)."""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet

from zoekt import admission, clock, transitions
from zoekt.models import Repository, Task

_INSERT_TASKS_SQL = """
INSERT INTO zoekt_tasks (
    zoekt_repository_id, zoekt_node_id, project_identifier, task_type, state,
    perform_at, retries_left, created_at, updated_at, priority
)
SELECT t.repository_id, t.node_id, t.project_identifier, %(task_type)s, 0,
       %(perform_at)s, %(retries_left)s, %(now)s, %(now)s, %(being_queued)s
FROM unnest(%(repositories)s::bigint[], %(nodes)s::bigint[], %(projects)s::bigint[])
     AS t(repository_id, node_id, project_identifier)
ON CONFLICT DO NOTHING
RETURNING id, zoekt_repository_id
"""

# What a task's place in its node's admission queue depends on (``zoekt.admission``): its
# priority, from its repository, index and the live moves; its index's root namespace; its
# index bytes, the repository's or, before its first build, the project's repository size.
PRIORITY_SQL = """CASE
           WHEN t.task_type = 50 THEN 0
           WHEN r.zoekt_index_id IN (
               SELECT replacement_index_id FROM zoekt_moves
               WHERE state IN ('planned', 'building', 'ready_to_swap', 'swapping')
                 AND replacement_index_id IS NOT NULL
           ) THEN 1
           WHEN r.indexed_at IS NOT NULL AND i.state <> 10 THEN 2
           WHEN r.indexed_at IS NULL THEN 3
           ELSE 4
       END"""
INDEX_BYTES_SQL = "COALESCE(NULLIF(r.size_bytes, 0), s.repository_size, 0)"
QUEUED_FROM_SQL = """FROM zoekt_tasks t
LEFT JOIN zoekt_repositories r ON r.id = t.zoekt_repository_id
LEFT JOIN zoekt_indices i ON i.id = r.zoekt_index_id
LEFT JOIN project_statistics s ON s.project_id = r.project_id"""
_QUEUED_SQL = f"""
SELECT t.id, t.zoekt_node_id,
       {PRIORITY_SQL},
       COALESCE(i.namespace_id, 0),
       {INDEX_BYTES_SQL}
{QUEUED_FROM_SQL}
WHERE t.id = ANY(%(ids)s)
"""

#: The priority of a task inserted and not yet given its place: outside every queue.
BEING_QUEUED = -1

# The round each queue is serving (its lowest pending turn) and each namespace's last
# pending turn in it: two index probes per namespace (the tasks being queued are in no
# queue yet).
_QUEUE_ENDS_SQL = """
SELECT g.node_id, g.priority, g.namespace_id,
       (SELECT min(o.turn) FROM zoekt_tasks o
        WHERE o.state = 0 AND o.zoekt_node_id = g.node_id AND o.priority = g.priority),
       (SELECT max(o.turn) FROM zoekt_tasks o
        WHERE o.state = 0 AND o.zoekt_node_id = g.node_id AND o.priority = g.priority
          AND o.namespace_id = g.namespace_id)
FROM unnest(%(nodes)s::bigint[], %(priorities)s::smallint[], %(namespaces)s::bigint[])
     AS g(node_id, priority, namespace_id)
"""

_SET_QUEUE_PLACES_SQL = """
UPDATE zoekt_tasks t
SET priority = v.priority, namespace_id = v.namespace_id, index_bytes = v.index_bytes,
    turn = v.turn
FROM unnest(%(ids)s::bigint[], %(priorities)s::smallint[], %(namespaces)s::bigint[],
            %(index_bytes)s::bigint[], %(turns)s::bigint[])
     AS v(id, priority, namespace_id, index_bytes, turn)
WHERE t.id = v.id
"""


def queue_for_admission(task_ids: list[int]) -> None:
    """Give new tasks their place in their nodes' admission queues (``admission.queue_turns``).

    The tasks are inserted with the priority ``BEING_QUEUED``, and this runs in the
    transaction that inserts them, so a hand-out never sees a task without its place.
    Three statements, whatever the number of tasks.
    """
    if not task_ids:
        return
    with connection.cursor() as cursor:
        cursor.execute(_QUEUED_SQL, {"ids": task_ids})
        queued = [
            admission.Queued(task_id, node_id, admission.Priority(priority), namespace, size)
            for task_id, node_id, priority, namespace, size in cursor.fetchall()
        ]
        groups = sorted({(q.node_id, int(q.priority), q.namespace_id) for q in queued})
        cursor.execute(
            _QUEUE_ENDS_SQL,
            {
                "nodes": [g[0] for g in groups],
                "priorities": [g[1] for g in groups],
                "namespaces": [g[2] for g in groups],
            },
        )
        heads: dict[admission.QueueKey, int] = {}
        lasts: dict[tuple[int, admission.Priority, int], int] = {}
        for node_id, priority, namespace_id, head, last in cursor.fetchall():
            if head is not None:
                heads[(node_id, admission.Priority(priority))] = head
            if last is not None:
                lasts[(node_id, admission.Priority(priority), namespace_id)] = last
        turns = admission.queue_turns(queued, heads, lasts)
        cursor.execute(
            _SET_QUEUE_PLACES_SQL,
            {
                "ids": [q.task_id for q in queued],
                "priorities": [int(q.priority) for q in queued],
                "namespaces": [q.namespace_id for q in queued],
                "index_bytes": [q.index_bytes for q in queued],
                "turns": [turns[q.task_id] for q in queued],
            },
        )


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
                    "being_queued": BEING_QUEUED,
                },
            )
            inserted = cursor.fetchall()
        queue_for_admission([task_id for task_id, _repo_id in inserted])
        ids = [repo_id for _task_id, repo_id in inserted]
        if task_type == Task.TaskType.DELETE_REPO:
            transitions.mark_repositories_deleted(Repository.objects.filter(id__in=ids), now=now)
        else:
            transitions.mark_repositories_initializing(
                Repository.objects.filter(id__in=ids), now=now
            )
    return len(ids)
