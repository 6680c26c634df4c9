"""Indexing one project: the Router (reference 5.6), IndexingTaskService (7.1) and its Celery task.

For every replica of the project's root namespace the Router picks the
indices that already hold the project, else the index with the most free
bytes that is not on its way out. The service finds or creates the
repository row there and creates the task through ``create_bulk_tasks``.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from tests.factories import (
    GIB,
    GroupFactory,
    IndexFactory,
    ProjectFactory,
    ReplicaFactory,
    RepositoryFactory,
)
from zoekt import app_settings
from zoekt.models import Index, Repository, Task
from zoekt.reasons import Reason
from zoekt.scheduling.indexing import (
    IndexingTaskService,
    fetch_indices_for_indexing,
    should_force_reindex,
)
from zoekt.scheduling.tasks import index_project_task

pytestmark = pytest.mark.django_db


set_setting = app_settings.update


def index_with_free_gib(replica, free_gib: int, **kwargs) -> Index:
    """An index of ``replica`` with ``free_gib`` GiB between its reservation and its use."""
    return IndexFactory(
        zoekt_replica=replica,
        reserved_storage_bytes=20 * GIB,
        used_storage_bytes=(20 - free_gib) * GIB,
        **kwargs,
    )


@pytest.fixture
def root():
    return GroupFactory()


@pytest.fixture
def project(root):
    return ProjectFactory(namespace=GroupFactory(parent=root))


def never() -> float:
    return 0.999_999


def run(project, **kwargs):
    kwargs.setdefault("random_source", never)
    return IndexingTaskService(project.id, **kwargs).execute()


# --- the Router -------------------------------------------------------------------------------


def test_the_router_picks_the_index_with_the_most_free_bytes_in_a_replica(root, project):
    replica = ReplicaFactory(namespace=root, zoekt_enabled_namespace__root_namespace=root)
    index_with_free_gib(replica, 3)
    roomiest = index_with_free_gib(replica, 9)
    index_with_free_gib(replica, 5)
    assert fetch_indices_for_indexing(project.id, root.id) == [roomiest]


def test_the_router_picks_one_index_in_each_replica_of_the_root(root, project):
    first = ReplicaFactory(namespace=root, zoekt_enabled_namespace__root_namespace=root)
    second = ReplicaFactory(namespace=root, zoekt_enabled_namespace=first.zoekt_enabled_namespace)
    index_with_free_gib(first, 1)
    first_choice = index_with_free_gib(first, 4)
    second_choice = index_with_free_gib(second, 7)
    index_with_free_gib(second, 2)
    ReplicaFactory()  # another namespace's replica
    index_with_free_gib(ReplicaFactory(), 19)
    assert fetch_indices_for_indexing(project.id, root.id) == [first_choice, second_choice]


@pytest.mark.parametrize("state", [Index.State.ORPHANED, Index.State.PENDING_DELETION])
def test_the_router_passes_over_an_index_on_its_way_out_even_with_more_room(root, project, state):
    replica = ReplicaFactory(namespace=root, zoekt_enabled_namespace__root_namespace=root)
    index_with_free_gib(replica, 19, state=state)
    chosen = index_with_free_gib(replica, 2)
    assert fetch_indices_for_indexing(project.id, root.id) == [chosen]


def test_the_router_keeps_a_project_in_the_index_that_already_holds_it(root, project):
    replica = ReplicaFactory(namespace=root, zoekt_enabled_namespace__root_namespace=root)
    holder = index_with_free_gib(replica, 1)
    index_with_free_gib(replica, 15)
    RepositoryFactory(zoekt_index=holder, project=project)
    assert fetch_indices_for_indexing(project.id, root.id) == [holder]


def test_the_router_breaks_a_tie_in_free_bytes_with_the_oldest_index(root, project):
    replica = ReplicaFactory(namespace=root, zoekt_enabled_namespace__root_namespace=root)
    oldest = index_with_free_gib(replica, 6)
    index_with_free_gib(replica, 6)
    assert fetch_indices_for_indexing(project.id, root.id) == [oldest]


def test_the_router_finds_nothing_for_a_root_without_replicas(root, project):
    assert fetch_indices_for_indexing(project.id, root.id) == []


# --- the force-reindex draw --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("percentage", "draw", "forced"),
    [
        pytest.param(0, 0.0, False, id="zero-never"),
        pytest.param(-1, 0.0, False, id="negative-never"),
        pytest.param(100, 0.999, True, id="hundred-always"),
        pytest.param(150, 0.999, True, id="above-hundred-always"),
        pytest.param(50, 0.49, True, id="draw-under-the-percentage"),
        pytest.param(50, 0.5, False, id="draw-at-the-percentage"),
        pytest.param(0.25, 0.0024, True, id="gitlab-default-hit"),
        pytest.param(0.25, 0.0025, False, id="gitlab-default-miss"),
    ],
)
def test_an_index_task_is_forced_with_the_configured_probability(percentage, draw, forced):
    assert should_force_reindex(percentage, lambda: draw) is forced


# --- the service --------------------------------------------------------------------------------


@pytest.fixture
def target(root):
    replica = ReplicaFactory(namespace=root, zoekt_enabled_namespace__root_namespace=root)
    return index_with_free_gib(replica, 5)


def test_indexing_creates_the_repository_and_one_index_task_on_the_targets_node(
    now, project, target
):
    result = run(project)
    repository = Repository.objects.get(zoekt_index=target, project=project)
    assert repository.project_identifier == project.id
    assert repository.retries_left == Repository.MODEL_DEFAULT_RETRIES_LEFT == 3
    assert repository.state == Repository.State.INITIALIZING
    task = Task.objects.get(zoekt_repository_id=repository.id)
    assert task.task_type == Task.TaskType.INDEX_REPO
    assert task.state == Task.State.PENDING
    assert task.zoekt_node_id == target.zoekt_node_id
    assert task.project_identifier == project.id
    assert task.perform_at == now
    assert result.as_dict() == {
        "project_id": project.id,
        "requested_task_type": "index_repo",
        "task_type": "index_repo",
        "root_namespace_id": project.namespace.traversal_ids[0],
        "index_ids": [target.id],
        "repositories_created": 1,
        "tasks_created": 1,
        "skipped": None,
    }


def test_indexing_twice_makes_no_second_repository_or_pending_task(project, target):
    run(project)
    again = run(project)
    assert (again.repositories_created, again.tasks_created) == (0, 0)
    assert Repository.objects.count() == 1
    assert Task.objects.count() == 1


def test_indexing_reuses_a_ready_repository_and_leaves_it_ready(project, target):
    repository = RepositoryFactory(
        zoekt_index=target, project=project, state=Repository.State.READY
    )
    result = run(project)
    assert (result.repositories_created, result.tasks_created) == (0, 1)
    repository.refresh_from_db()
    assert repository.state == Repository.State.READY


def test_indexing_reaches_every_replica_of_the_root(root, project):
    first = ReplicaFactory(namespace=root, zoekt_enabled_namespace__root_namespace=root)
    second = ReplicaFactory(namespace=root, zoekt_enabled_namespace=first.zoekt_enabled_namespace)
    a, b = index_with_free_gib(first, 3), index_with_free_gib(second, 3)
    result = run(project)
    assert result.tasks_created == 2
    assert sorted(Task.objects.values_list("zoekt_node_id", flat=True)) == sorted(
        [a.zoekt_node_id, b.zoekt_node_id]
    )


@pytest.mark.parametrize(
    ("percentage", "draw", "expected"),
    [
        pytest.param(100, 0.999, Task.TaskType.FORCE_INDEX_REPO, id="always"),
        pytest.param(0, 0.0, Task.TaskType.INDEX_REPO, id="never"),
        pytest.param(10, 0.05, Task.TaskType.FORCE_INDEX_REPO, id="drawn-in"),
        pytest.param(10, 0.2, Task.TaskType.INDEX_REPO, id="drawn-out"),
    ],
)
def test_the_setting_decides_how_often_an_index_task_becomes_a_force_reindex(
    project, target, percentage, draw, expected
):
    set_setting(zoekt_force_reindexing_percentage=percentage)
    result = run(project, random_source=lambda: draw)
    assert Task.objects.get().task_type == expected
    assert result.task_type == Task.TaskType(expected).label


def test_a_delete_is_never_upgraded_and_only_reaches_indices_holding_the_project(root, project):
    set_setting(zoekt_force_reindexing_percentage=100)
    first = ReplicaFactory(namespace=root, zoekt_enabled_namespace__root_namespace=root)
    second = ReplicaFactory(namespace=root, zoekt_enabled_namespace=first.zoekt_enabled_namespace)
    holder = index_with_free_gib(first, 1)
    index_with_free_gib(second, 9)  # does not hold the project: no row is made to delete
    repository = RepositoryFactory(zoekt_index=holder, project=project)
    result = run(project, task_type=Task.TaskType.DELETE_REPO)
    assert (result.task_type, result.tasks_created, result.repositories_created) == (
        "delete_repo",
        1,
        0,
    )
    assert Task.objects.get().task_type == Task.TaskType.DELETE_REPO
    repository.refresh_from_db()
    assert repository.state == Repository.State.DELETED
    assert Repository.objects.count() == 1


def test_a_delay_puts_the_task_in_the_future(now, project, target):
    run(project, delay_seconds=90)
    assert Task.objects.get().perform_at == now + timedelta(seconds=90)


def test_a_project_that_is_gone_is_skipped():
    result = IndexingTaskService(987654).execute()
    assert result.skipped == Reason.PROJECT_NOT_FOUND
    assert not Task.objects.exists()


def test_a_root_without_indices_is_skipped_and_creates_nothing(project):
    result = run(project)
    assert result.skipped == Reason.NO_TARGET_INDICES
    assert not Repository.objects.exists()
    assert not Task.objects.exists()


def test_an_orphaned_index_that_holds_the_project_gets_no_index_task(root, project):
    replica = ReplicaFactory(namespace=root, zoekt_enabled_namespace__root_namespace=root)
    holder = index_with_free_gib(replica, 1, state=Index.State.ORPHANED)
    RepositoryFactory(
        zoekt_index=holder, project=project, state=Repository.State.ORPHANED, retries_left=3
    )
    result = run(project)
    assert result.tasks_created == 0
    assert not Task.objects.exists()


# --- the Celery task ------------------------------------------------------------------------------


def index_project_lines(caplog) -> list[dict]:
    return [
        record.msg
        for record in caplog.records
        if isinstance(record.msg, dict) and record.msg.get("event") == "index_project"
    ]


def test_the_celery_task_is_named_for_beat_and_workers():
    assert index_project_task.name == "zoekt.index_project"


def test_the_celery_task_indexes_the_project_and_logs_one_line(caplog, project, target):
    set_setting(zoekt_indexing_enabled=True, zoekt_force_reindexing_percentage=0)
    caplog.set_level(logging.INFO)
    result = index_project_task(project.id)
    assert result["tasks_created"] == 1
    assert Task.objects.get().task_type == Task.TaskType.INDEX_REPO
    (line,) = index_project_lines(caplog)
    assert line["project_id"] == project.id
    assert line["tasks_created"] == 1


def test_the_celery_task_does_nothing_while_indexing_is_disabled(caplog, project, target):
    caplog.set_level(logging.INFO)
    result = index_project_task(project.id)
    assert result == {"project_id": project.id, "skipped": Reason.INDEXING_DISABLED}
    assert not Task.objects.exists()
    (line,) = index_project_lines(caplog)
    assert line["skipped"] == "indexing_disabled"


def test_the_celery_task_skips_a_project_deleted_since_the_request(caplog):
    set_setting(zoekt_indexing_enabled=True)
    caplog.set_level(logging.INFO)
    assert index_project_task(987654) == {
        "project_id": 987654,
        "skipped": Reason.PROJECT_NOT_FOUND,
    }
    assert len(index_project_lines(caplog)) == 1
