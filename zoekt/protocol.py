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
from django.db import transaction
from django.db.models import Q

from zoekt import capacity, clock
from zoekt.app_settings import ZoektSettings
from zoekt.models import ForkNetworkMember, Namespace, Project, Repository, Task

PAGE_SIZE = Task.PROCESSING_BATCH_SIZE


@dataclasses.dataclass(frozen=True)
class HandOut:
    tasks: list[Task]
    orphaned: int
    skipped: int


def hand_out_tasks(
    node_id: int, limit: int, *, only_delete: bool, now: datetime | None = None
) -> HandOut:
    """Claim up to ``limit`` tasks for the node, oldest ``perform_at`` first.

    Delete tasks are always valid; an index task whose repository has lost
    its project is marked ``orphaned`` and one whose repository is no longer
    indexable ``skipped``. Only the first valid task per project is sent in
    one hand-out. Sent tasks become ``processing`` and are offered again on
    every heartbeat until a callback arrives (the node de-duplicates by id).
    """
    now = now or clock.now()
    chosen: list[Task] = []
    orphaned: list[int] = []
    skipped: list[int] = []
    seen_projects: set[int] = set()
    cursor: tuple[datetime, int] | None = None
    base = Task.objects.filter(
        zoekt_node_id=node_id,
        state__in=(Task.State.PENDING, Task.State.PROCESSING),
        perform_at__lte=now,
    )
    if only_delete:
        base = base.filter(task_type=Task.TaskType.DELETE_REPO)
    with transaction.atomic():
        while len(chosen) < limit:
            page_qs = base
            if cursor is not None:
                page_qs = page_qs.filter(
                    Q(perform_at__gt=cursor[0]) | Q(perform_at=cursor[0], id__gt=cursor[1])
                )
            page = list(page_qs.order_by("perform_at", "id")[:PAGE_SIZE])
            if not page:
                break
            cursor = (page[-1].perform_at, page[-1].id)
            repositories = {
                repo["id"]: repo
                for repo in Repository.objects.filter(
                    id__in=[
                        t.zoekt_repository_id
                        for t in page
                        if t.task_type != Task.TaskType.DELETE_REPO
                    ]
                ).values("id", "state", "project_id")
            }
            for task in page:
                if task.task_type != Task.TaskType.DELETE_REPO:
                    repo = repositories.get(task.zoekt_repository_id)
                    if repo is None or repo["project_id"] is None:
                        orphaned.append(task.id)
                        continue
                    if repo["state"] not in Repository.INDEXABLE_STATES:
                        skipped.append(task.id)
                        continue
                if task.project_identifier in seen_projects:
                    continue
                seen_projects.add(task.project_identifier)
                chosen.append(task)
                if len(chosen) >= limit:
                    break
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
            Task.objects.filter(id__in=[t.id for t in chosen], state=Task.State.PENDING).update(
                state=Task.State.PROCESSING, updated_at=now
            )
            for task in chosen:
                task.state = Task.State.PROCESSING
    return HandOut(chosen, len(orphaned), len(skipped))


def task_pull_frequency(node_id: int, limit: int) -> str:
    """``500ms`` while the node has a full backlog of pending tasks, else ``5s``."""
    backlog = Task.objects.filter(zoekt_node_id=node_id, state=Task.State.PENDING)[:limit].count()
    if backlog >= limit:
        return capacity.TASK_PULL_FREQUENCY_INCREASED
    return capacity.TASK_PULL_FREQUENCY_DEFAULT


# --- serialisation ------------------------------------------------------------------------


def hashed_disk_path(project_id: int) -> str:
    """GitLab's hashed-storage path of a project's repository."""
    digest = hashlib.sha256(str(project_id).encode()).hexdigest()
    return f"@hashed/{digest[0:2]}/{digest[2:4]}/{digest}"


def _gitaly_connection_info(project: Project) -> dict:
    storages = settings.ZOEKT_GITALY_STORAGES
    storage = storages.get(project.repository_storage) or {}
    return {
        "Address": storage.get("address", ""),
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
        project = projects[task.project_identifier]
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
