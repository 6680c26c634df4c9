"""Indexing one project: the Router and IndexingTaskService (reference 5.6, 7.1).

The Router answers "which indices hold, or should hold, this project?": for
every replica of the project's root namespace, the indices that already have
a repository row for the project, else the replica's index with the most free
bytes (reserved − used). The project-namespace id range of an index is not
consulted; ranges only matter for initial indexing.

IndexingTaskService turns one request ("index project 42") into rows: it
finds or creates the repository row in each target index (model default of 3
retries) and creates the tasks through ``create_bulk_tasks``, which skips
repositories that already have a pending task of the same type. An
``index_repo`` request becomes ``force_index_repo`` with probability
``zoekt_force_reindexing_percentage`` %; the random source is injectable so
tests choose the outcome.

Differences from GitLab, on purpose:

* When choosing the largest-free index of a replica, indices that are
  orphaned or pending deletion are left out before choosing (GitLab chooses
  first and then skips the choice, leaving the replica without a target).
* A ``delete_repo`` request only targets indices that already have a
  repository row for the project: creating a row just to delete it would
  send a node a delete for data it never had.
* GitLab's newer service also defers work on indices above a storage
  watermark; reference 7.1 does not describe that and it is not done here.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from datetime import timedelta

from django.db import transaction

from zoekt import app_settings, clock
from zoekt.models import Index, Move, Project, Repository, Task
from zoekt.reasons import Reason
from zoekt.scheduling.task_creation import create_bulk_tasks

RandomSource = Callable[[], float]


def should_force_reindex(percentage: float, random_source: RandomSource = random.random) -> bool:
    """True with probability ``percentage`` %: ≤ 0 never, ≥ 100 always (reference 7.1)."""
    if percentage <= 0:
        return False
    if percentage >= 100:
        return True
    return random_source() * 100 < percentage


def fetch_indices_for_indexing(
    project_id: int, root_namespace_id: int, *, for_delete: bool = False
) -> list[Index]:
    """The Router (reference 5.6): the target indices of a project, one replica at a time.

    Two queries, whatever the number of replicas and indices (three when a
    replica is split by project range). A deletion reaches every index holding
    the project, a live move's replacement included.

    A new project goes, in each replica, to the index whose project-namespace
    id range holds it when there is one (search asks each index only for its
    range, ``zoekt.search_targets``), else to GitLab's choice: the index with
    the most free bytes.
    """
    indices = Index.objects.filter(
        zoekt_replica__namespace_id=root_namespace_id, zoekt_replica__isnull=False
    )
    if not for_delete:
        # A live move's build replica is a copy of one range: what it needs it takes
        # from the index it replaces at the swap (``eviction.moves``), never from here.
        indices = indices.exclude(
            zoekt_replica_id__in=Move.objects.live()
            .filter(replacement_replica_id__isnull=False)
            .values("replacement_replica_id")
        )
    indices = list(indices.order_by("zoekt_replica_id", "id"))
    if not indices:
        return []
    with_rows = set(
        Repository.objects.filter(
            project_identifier=project_id, zoekt_index_id__in=[i.id for i in indices]
        ).values_list("zoekt_index_id", flat=True)
    )
    by_replica: dict[int, list[Index]] = {}
    for index in indices:
        by_replica.setdefault(index.zoekt_replica_id, []).append(index)
    targets: list[Index] = []
    unread = object()
    project_namespace_id = unread  # read once, and only for a replica split by range
    for replica_indices in by_replica.values():
        existing = [i for i in replica_indices if i.id in with_rows]
        if existing:
            targets.extend(existing)
            continue
        if for_delete:
            continue
        candidates = [i for i in replica_indices if i.state not in Index.SHOULD_BE_DELETED_STATES]
        if any(i.project_namespace_id_range is not None for i in candidates):
            if project_namespace_id is unread:
                project_namespace_id = (
                    Project.objects.filter(id=project_id)
                    .values_list("project_namespace_id", flat=True)
                    .first()
                )
            holding = [i for i in candidates if i.holds_project_namespace(project_namespace_id)]
            candidates = holding or candidates
        if candidates:
            # Largest free bytes; the oldest index wins a tie.
            targets.append(max(candidates, key=lambda i: (i.free_storage_bytes, -i.id)))
    return targets


@dataclasses.dataclass(frozen=True)
class IndexingResult:
    """What one run of the service did, ready for one log line."""

    project_id: int
    requested_task_type: str
    task_type: str
    root_namespace_id: int | None = None
    index_ids: tuple[int, ...] = ()
    repositories_created: int = 0
    tasks_created: int = 0
    skipped: str | None = None

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["index_ids"] = list(self.index_ids)
        return data


def _type_name(task_type: int) -> str:
    return Task.TaskType(task_type).label


class IndexingTaskService:
    """GitLab's ``IndexingTaskService``: one project, one task type, every target index.

    ``project`` may be passed when the caller has just read it; otherwise it
    is read here. A delete needs no project row (the project may be gone) but
    then needs ``root_namespace_id``.
    """

    def __init__(
        self,
        project_id: int,
        task_type: int = Task.TaskType.INDEX_REPO,
        *,
        project: Project | None = None,
        root_namespace_id: int | None = None,
        delay_seconds: float | None = None,
        random_source: RandomSource = random.random,
        force_reindexing_percentage: float | None = None,
    ):
        self.project_id = project_id
        self.task_type = Task.TaskType(task_type)
        self.project = project
        self.root_namespace_id = root_namespace_id
        self.delay_seconds = delay_seconds
        self.random_source = random_source
        self.force_reindexing_percentage = force_reindexing_percentage

    def _effective_task_type(self) -> Task.TaskType:
        if self.task_type != Task.TaskType.INDEX_REPO:
            return self.task_type
        percentage = self.force_reindexing_percentage
        if percentage is None:
            percentage = app_settings.current().force_reindexing_percentage
        if should_force_reindex(percentage, self.random_source):
            return Task.TaskType.FORCE_INDEX_REPO
        return self.task_type

    def execute(self) -> IndexingResult:
        deleting = self.task_type == Task.TaskType.DELETE_REPO
        project = self.project
        if project is None:
            project = Project.objects.select_related("namespace").filter(pk=self.project_id).first()
        requested = _type_name(self.task_type)
        if project is None and not deleting:
            return IndexingResult(
                self.project_id, requested, requested, skipped=Reason.PROJECT_NOT_FOUND
            )
        root_id = self.root_namespace_id
        if root_id is None and project is not None:
            root_id = project.namespace.root_id
        if root_id is None:
            return IndexingResult(
                self.project_id, requested, requested, skipped=Reason.PROJECT_NOT_FOUND
            )
        effective = self._effective_task_type()
        targets = fetch_indices_for_indexing(self.project_id, root_id, for_delete=deleting)
        if not targets:
            return IndexingResult(
                self.project_id,
                requested,
                _type_name(effective),
                root_id,
                skipped=Reason.NO_TARGET_INDICES,
            )
        now = clock.now()
        perform_at = now + timedelta(seconds=self.delay_seconds) if self.delay_seconds else now
        created = 0
        repository_ids = []
        with transaction.atomic():
            for index in targets:
                repository, was_created = Repository.objects.get_or_create(
                    zoekt_index=index,
                    project_identifier=self.project_id,
                    defaults={
                        "project": project,
                        "retries_left": Repository.MODEL_DEFAULT_RETRIES_LEFT,
                        "created_at": now,
                        "updated_at": now,
                    },
                )
                created += was_created
                repository_ids.append(repository.id)
            tasks = create_bulk_tasks(
                Repository.objects.filter(id__in=repository_ids), effective, perform_at
            )
        return IndexingResult(
            project_id=self.project_id,
            requested_task_type=requested,
            task_type=_type_name(effective),
            root_namespace_id=root_id,
            index_ids=tuple(i.id for i in targets),
            repositories_created=created,
            tasks_created=tasks,
        )
