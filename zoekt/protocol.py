"""What a node receives on its heartbeat: task hand-out and the wire format (reference 3.4, 7.2).

``hand_out_tasks`` chooses and claims the node's tasks; ``serialize_tasks``
turns them into GitLab's wire shape. Both read in batches, so the number of
queries does not grow with the number of tasks.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.db import connection

from zoekt import admission, capacity, clock
from zoekt.app_settings import ZoektSettings
from zoekt.models import ForkNetworkMember, Namespace, Project, Repository, Task

PAGE_SIZE = Task.PROCESSING_BATCH_SIZE


@dataclasses.dataclass(frozen=True)
class HandOut:
    tasks: list[Task]
    orphaned: int
    skipped: int
    # Pending tasks of the node, counted up to the concurrency limit (pull frequency).
    backlog: int


_PAGE_SQL = """
SELECT b.backlog, t.id, t.zoekt_repository_id, t.project_identifier, t.task_type, t.state,
       t.perform_at
FROM (
    SELECT count(*) AS backlog FROM (
        SELECT 1 FROM zoekt_tasks WHERE zoekt_node_id = %(node_id)s AND state = 0
        LIMIT %(backlog_cap)s
    ) pending
) b
LEFT JOIN LATERAL (
    SELECT id, zoekt_repository_id, project_identifier, task_type, state, perform_at
    FROM zoekt_tasks
    WHERE zoekt_node_id = %(node_id)s AND state IN (0, 1) AND perform_at <= %(now)s
      AND (NOT %(only_delete)s OR task_type = 50)
      AND (%(after_at)s::timestamptz IS NULL OR (perform_at, id) > (%(after_at)s, %(after_id)s))
    ORDER BY perform_at, id
    LIMIT %(page)s
) t ON true
"""


def _page(
    node_id: int, limit: int, only_delete: bool, now: datetime, cursor: tuple[datetime, int] | None
) -> tuple[int, list[Task]]:
    """One page of candidates, with the node's pending backlog, in one round trip."""
    params = {
        # Up to twice the limit: after claiming at most ``limit`` the remainder is still exact
        # enough to tell whether a full backlog is left.
        "node_id": node_id,
        "backlog_cap": 2 * limit,
        "now": now,
        "only_delete": only_delete,
        "after_at": cursor[0] if cursor else None,
        "after_id": cursor[1] if cursor else 0,
        "page": PAGE_SIZE,
    }
    with connection.cursor() as db:
        db.execute(_PAGE_SQL, params)
        rows = db.fetchall()
    tasks = [
        Task(
            id=row[1],
            zoekt_node_id=node_id,
            zoekt_repository_id=row[2],
            project_identifier=row[3],
            task_type=row[4],
            state=row[5],
            perform_at=row[6],
        )
        for row in rows
        if row[1] is not None
    ]
    return (rows[0][0] if rows else 0), tasks


def hand_out_tasks(
    node_id: int, limit: int, *, only_delete: bool, now: datetime | None = None
) -> HandOut:
    """Claim up to ``limit`` tasks for the node, oldest ``perform_at`` first.

    Delete tasks are always valid; an index task whose repository has lost
    its project is marked ``orphaned`` and one whose repository is no longer
    indexable ``skipped``. Only the first valid task per project is sent in
    one hand-out. Sent tasks become ``processing`` and are offered again on
    every heartbeat until a callback arrives (the node de-duplicates by id).
    The common case, a node with nothing to do, costs one query.
    """
    now = now or clock.now()
    chosen: list[Task] = []
    orphaned: list[int] = []
    skipped: list[int] = []
    seen_projects: set[int] = set()
    cursor: tuple[datetime, int] | None = None
    backlog = None
    while len(chosen) < limit:
        pending, page = _page(node_id, limit, only_delete, now, cursor)
        backlog = pending if backlog is None else backlog
        if not page:
            break
        cursor = (page[-1].perform_at, page[-1].id)
        index_repo_ids = [
            t.zoekt_repository_id for t in page if t.task_type != Task.TaskType.DELETE_REPO
        ]
        repositories = (
            {
                repo["id"]: repo
                for repo in Repository.objects.filter(id__in=index_repo_ids).values(
                    "id", "state", "project_id"
                )
            }
            if index_repo_ids
            else {}
        )
        for task in page:
            repo = repositories.get(task.zoekt_repository_id) or {}
            invalid = _invalid(task.task_type, repo.get("state"), repo.get("project_id"))
            if invalid is not None:
                (orphaned if invalid == Task.State.ORPHANED else skipped).append(task.id)
                continue
            if task.project_identifier in seen_projects:
                continue
            seen_projects.add(task.project_identifier)
            chosen.append(task)
            if len(chosen) >= limit:
                break
        if len(page) < PAGE_SIZE:
            break
    return _claim(chosen, orphaned, skipped, backlog or 0, now)


def _invalid(task_type: int, repository_state: int | None, project_id: int | None) -> int | None:
    """``orphaned`` for an index task whose repository lost its project (or is gone),
    ``skipped`` for one whose repository is no longer indexable, else None (a delete is
    always valid)."""
    if task_type == Task.TaskType.DELETE_REPO:
        return None
    if repository_state is None or project_id is None:
        return Task.State.ORPHANED
    if repository_state not in Repository.INDEXABLE_STATES:
        return Task.State.SKIPPED
    return None


def _claim(
    chosen: list[Task], orphaned: list[int], skipped: list[int], backlog: int, now: datetime
) -> HandOut:
    """Mark the invalid tasks and claim the chosen ones; each update is safe to repeat."""
    live = (Task.State.PENDING, Task.State.PROCESSING)
    if orphaned:
        Task.objects.filter(id__in=orphaned, state__in=live).update(
            state=Task.State.ORPHANED, updated_at=now
        )
    if skipped:
        Task.objects.filter(id__in=skipped, state__in=live).update(
            state=Task.State.SKIPPED, updated_at=now
        )
    if chosen:
        claimed = Task.objects.filter(
            id__in=[t.id for t in chosen], state=Task.State.PENDING
        ).update(state=Task.State.PROCESSING, updated_at=now)
        for task in chosen:
            task.state = Task.State.PROCESSING
        # Tasks just claimed left the pending backlog.
        backlog = max(0, backlog - claimed)
    return HandOut(chosen, len(orphaned), len(skipped), backlog)


# --- admission control (zoekt.admission, docs/scheduling.md) ---------------------------------

# The node's tasks in flight, then the head of its admission queue (pending and due, by
# priority, turn and queue order: ``zoekt_tasks_queue_head``), each read up to the window, so
# a hand-out reads a bounded number of rows however long the node's backlog.
_ADMISSION_SQL = """
SELECT t.id, t.zoekt_repository_id, t.project_identifier, t.task_type, t.state, t.perform_at,
       r.state, r.project_id, t.index_bytes, t.priority, t.namespace_id, t.turn, b.backlog
FROM (
    SELECT count(*) AS backlog FROM (
        SELECT 1 FROM zoekt_tasks WHERE zoekt_node_id = %(node_id)s AND state = 0
        LIMIT %(backlog_cap)s
    ) pending
) b
LEFT JOIN LATERAL (
    (
        SELECT * FROM zoekt_tasks
        WHERE zoekt_node_id = %(node_id)s AND state = 1 AND perform_at <= %(now)s
          AND (NOT %(only_delete)s OR task_type = 50)
        ORDER BY id
        LIMIT %(window)s
    )
    UNION ALL
    (
        SELECT * FROM zoekt_tasks
        WHERE zoekt_node_id = %(node_id)s AND state = 0 AND perform_at <= %(now)s
          AND (NOT %(only_delete)s OR priority = 0)
        ORDER BY priority, turn, perform_at, id
        LIMIT %(window)s
    )
) t ON true
LEFT JOIN zoekt_repositories r ON r.id = t.zoekt_repository_id
"""

_INDEXING_FIGURES_SQL = """
SELECT zoekt_node_id, state, priority, count(*),
       COALESCE(sum(CASE WHEN task_type = 50 THEN 0 ELSE index_bytes END), 0)
FROM zoekt_tasks
WHERE state IN (0, 1)
GROUP BY 1, 2, 3
"""


@dataclasses.dataclass
class NodeIndexing:
    """A node's indexing work as admission control sees it (docs/scheduling.md)."""

    #: Tasks handed out and not yet called back: the slots they hold.
    in_flight: int = 0
    #: The temporary bytes of the builds in flight (their index bytes × the factor).
    temporary_bytes: int = 0
    #: Pending tasks and their index bytes, by priority name.
    backlog: dict[str, int] = dataclasses.field(default_factory=dict)
    backlog_bytes: int = 0

    @property
    def backlog_tasks(self) -> int:
        return sum(self.backlog.values())


def indexing_figures(temporary_space_factor: float) -> dict[int, NodeIndexing]:
    """Every node's tasks in flight, their temporary bytes and its backlog by priority, in
    one query (pending and processing tasks only)."""
    figures: dict[int, NodeIndexing] = {}
    with connection.cursor() as db:
        db.execute(_INDEXING_FIGURES_SQL)
        rows = db.fetchall()
    for node_id, state, priority, count, index_bytes in rows:
        node = figures.setdefault(node_id, NodeIndexing())
        if state == Task.State.PROCESSING:
            node.in_flight += count
            node.temporary_bytes += admission.temporary_bytes(
                int(index_bytes), temporary_space_factor
            )
        else:
            name = admission.Priority(priority).name.lower()
            node.backlog[name] = node.backlog.get(name, 0) + count
            node.backlog_bytes += int(index_bytes)
    return figures


def hand_out_admitted(
    node_id: int,
    room: admission.NodeRoom,
    *,
    only_delete: bool,
    temporary_space_factor: float,
    now: datetime | None = None,
) -> tuple[HandOut, admission.Admission]:
    """Claim the node's tasks by admission control (``zoekt.admission``) in one query.

    The database reads the node's tasks in flight and the head of its queue (by priority,
    then turn: round robin between namespaces, set when the tasks were queued);
    ``admission.admit`` decides within the node's slots and disk headroom. Invalid tasks
    are marked as in ``hand_out_tasks``.
    """
    now = now or clock.now()
    params = {
        "node_id": node_id,
        "now": now,
        "only_delete": only_delete,
        "window": 2 * room.slots + PAGE_SIZE,
        "backlog_cap": 2 * room.slots,
    }
    with connection.cursor() as db:
        db.execute(_ADMISSION_SQL, params)
        rows = db.fetchall()
    tasks: dict[int, Task] = {}
    candidates: list[admission.Candidate] = []
    orphaned: list[int] = []
    skipped: list[int] = []
    for row in rows:
        if row[0] is None:
            continue
        (task_id, repository_id, project_identifier, task_type, state, perform_at) = row[:6]
        repository_state, project_id, index_bytes, priority, namespace_id, turn = row[6:12]
        invalid = _invalid(task_type, repository_state, project_id)
        if invalid is not None:
            (orphaned if invalid == Task.State.ORPHANED else skipped).append(task_id)
            continue
        deleting = task_type == Task.TaskType.DELETE_REPO
        tasks[task_id] = Task(
            id=task_id,
            zoekt_node_id=node_id,
            zoekt_repository_id=repository_id,
            project_identifier=project_identifier,
            task_type=task_type,
            state=state,
            perform_at=perform_at,
        )
        candidates.append(
            admission.Candidate(
                task_id=task_id,
                priority=admission.Priority(priority),
                namespace_id=namespace_id,
                project_id=project_identifier,
                temporary_bytes=0
                if deleting
                else admission.temporary_bytes(index_bytes, temporary_space_factor),
                in_flight=state == Task.State.PROCESSING,
                turn=turn,
            )
        )
    decided = admission.admit(candidates, room)
    chosen = [tasks[task_id] for task_id in decided.admitted]
    backlog = rows[0][12] if rows else 0
    return _claim(chosen, orphaned, skipped, backlog, now), decided


def task_pull_frequency(backlog: int, limit: int) -> str:
    """``500ms`` while the node has a full backlog of pending tasks, else ``5s``."""
    if backlog >= limit:
        return capacity.TASK_PULL_FREQUENCY_INCREASED
    return capacity.TASK_PULL_FREQUENCY_DEFAULT


def pending_backlog(node_id: int, limit: int) -> int:
    """Pending tasks of the node, counted up to ``limit`` (``perform_at`` is ignored)."""
    return Task.objects.filter(zoekt_node_id=node_id, state=Task.State.PENDING)[:limit].count()


# --- serialisation ------------------------------------------------------------------------


def hashed_disk_path(project_id: int) -> str:
    """GitLab's hashed-storage path of a project's repository."""
    digest = hashlib.sha256(str(project_id).encode()).hexdigest()
    return f"@hashed/{digest[0:2]}/{digest[2:4]}/{digest}"


def gitaly_address(address: str) -> str:
    """A relative ``unix:`` socket path made absolute (from the project root), as GitLab does."""
    if address.startswith("unix:") and not address[len("unix:") :].startswith("/"):
        return f"unix:{(settings.BASE_DIR / address[len('unix:') :]).resolve()}"
    return address


def _gitaly_connection_info(project: Project) -> dict:
    storages = settings.ZOEKT_GITALY_STORAGES
    storage = storages.get(project.repository_storage) or {}
    return {
        "Address": gitaly_address(storage.get("address", "")),
        "Token": storage.get("token", ""),
        "Storage": project.repository_storage,
        "Path": f"{hashed_disk_path(project.id)}.git",
    }


def _flag(value: bool) -> str:
    return "t" if value else "f"


def serialize_tasks(
    tasks: Iterable[Task], *, node_schema_version: int, zoekt_settings: ZoektSettings
) -> list[dict]:
    """The ``tasks`` array of a heartbeat reply, in hand-out order."""
    tasks = list(tasks)
    if not tasks:
        return []
    project_ids = {t.project_identifier for t in tasks if t.task_type != Task.TaskType.DELETE_REPO}
    projects = {
        p.id: p
        for p in Project.objects.filter(id__in=project_ids).select_related(
            "namespace", "project_feature", "statistics"
        )
    }
    forked = set(
        ForkNetworkMember.objects.filter(
            project_id__in=project_ids, forked_from_project__isnull=False
        ).values_list("project_id", flat=True)
    )
    ancestor_ids = {i for p in projects.values() for i in p.namespace.traversal_ids}
    archived_namespaces = set(
        Namespace.objects.filter(id__in=ancestor_ids, archived=True).values_list("id", flat=True)
    )
    out = []
    for task in tasks:
        if task.task_type == Task.TaskType.DELETE_REPO:
            out.append(
                {
                    "name": "delete",
                    "payload": {
                        "RepoId": task.project_identifier,
                        "Callback": {
                            "name": "delete",
                            "payload": {"task_id": task.id, "service_type": "zoekt"},
                        },
                    },
                }
            )
            continue
        project = projects.get(task.project_identifier)
        if project is None:
            # Deleted since the hand-out: not sent; the next hand-out orphans the task.
            continue
        out.append(
            {
                "name": "index",
                "payload": _index_payload(
                    task,
                    project,
                    node_schema_version,
                    zoekt_settings,
                    forked=project.id in forked,
                    archived=project.archived
                    or bool(archived_namespaces.intersection(project.namespace.traversal_ids)),
                ),
            }
        )
    return out


def _index_payload(
    task: Task,
    project: Project,
    node_schema_version: int,
    zoekt_settings: ZoektSettings,
    *,
    forked: bool,
    archived: bool,
) -> dict:
    statistics = getattr(project, "statistics", None)
    # No statistics, or an empty repository, is what GitLab calls a missing repository.
    missing = statistics is None or statistics.repository_size <= 0
    feature = getattr(project, "project_feature", None)
    access_level = feature.repository_access_level if feature else 20
    traversal = "".join(f"{i}-" for i in project.namespace.traversal_ids)
    payload = {
        "Callback": {
            "name": "index",
            "payload": {"task_id": task.id, "schema_version": node_schema_version},
        },
        "RepoId": project.id,
        "FileSizeLimit": zoekt_settings.indexed_file_size_limit_bytes or 0,
        "Parallelism": zoekt_settings.indexing_parallelism,
        "Timeout": zoekt_settings.indexing_timeout,
        "FileCountLimit": zoekt_settings.maximum_files,
        "TrigramMax": zoekt_settings.trigram_max,
        "MissingRepo": missing,
        "Metadata": {
            "project_id": str(project.id),
            "traversal_ids": traversal,
            "visibility_level": str(project.visibility_level),
            "repository_access_level": str(access_level),
            "forked": _flag(forked),
            "archived": _flag(archived),
        },
    }
    if not missing:
        payload["GitalyConnectionInfo"] = _gitaly_connection_info(project)
    if task.task_type == Task.TaskType.FORCE_INDEX_REPO:
        payload["Force"] = True
    return payload
