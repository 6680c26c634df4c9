"""Creating tasks in bulk for a set of repositories (reference 7.1).

Index tasks are made only for indexable repositories (pending, initializing,
ready) and move pending ones to initializing; delete tasks are made for any
repository and mark it deleted. A repository that already has a pending task
of the same type gets no second one, so a repeated call creates nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.api.helpers import make_repository, make_task
from tests.factories import IndexFactory, NodeFactory
from zoekt import clock
from zoekt.models import Repository, Task
from zoekt.scheduling.task_creation import create_bulk_tasks

pytestmark = pytest.mark.django_db

State = Repository.State


def repositories_in(index, *states) -> list[Repository]:
    return [make_repository(index, state=state, retries_left=3) for state in states]


def scope(repositories) -> object:
    return Repository.objects.filter(id__in=[r.id for r in repositories])


def tasks_for(repository: Repository) -> list[Task]:
    return list(Task.objects.filter(zoekt_repository_id=repository.id).order_by("id"))


def state_of(repository: Repository) -> int:
    repository.refresh_from_db()
    return repository.state


def test_index_tasks_are_made_only_for_indexable_repositories(index, now):
    indexable = repositories_in(index, State.PENDING, State.INITIALIZING, State.READY)
    not_indexable = repositories_in(
        index, State.ORPHANED, State.PENDING_DELETION, State.DELETED, State.FAILED
    )

    created = create_bulk_tasks(scope(indexable + not_indexable))

    assert created == 3
    assert [len(tasks_for(r)) for r in indexable] == [1, 1, 1]
    assert [len(tasks_for(r)) for r in not_indexable] == [0, 0, 0, 0]


def test_a_new_task_carries_its_repository_node_and_project(index, now):
    (repository,) = repositories_in(index, State.PENDING)

    create_bulk_tasks(scope([repository]))

    (task,) = tasks_for(repository)
    assert task.zoekt_node_id == index.zoekt_node_id
    assert task.project_identifier == repository.project_identifier
    assert task.task_type == Task.TaskType.INDEX_REPO
    assert task.state == Task.State.PENDING
    assert task.retries_left == 3
    assert task.perform_at == task.created_at == task.updated_at == now


def test_tasks_are_created_in_repository_id_order(index, now):
    repositories = repositories_in(index, State.PENDING, State.PENDING, State.PENDING)

    create_bulk_tasks(scope(repositories))

    created = Task.objects.order_by("id").values_list("zoekt_repository_id", flat=True)
    assert list(created) == [r.id for r in repositories]


def test_a_delayed_task_is_created_with_its_perform_at(index, now):
    (repository,) = repositories_in(index, State.READY)
    later = now + timedelta(minutes=10)

    create_bulk_tasks(scope([repository]), perform_at=later)

    assert tasks_for(repository)[0].perform_at == later


def test_index_tasks_move_pending_repositories_to_initializing(index, now):
    pending, initializing, ready = repositories_in(
        index, State.PENDING, State.INITIALIZING, State.READY
    )

    create_bulk_tasks(scope([pending, initializing, ready]))

    assert [state_of(r) for r in (pending, initializing, ready)] == [
        State.INITIALIZING,
        State.INITIALIZING,
        State.READY,
    ]


def test_force_index_tasks_follow_the_index_rules(index, now):
    pending, orphaned = repositories_in(index, State.PENDING, State.ORPHANED)

    created = create_bulk_tasks(scope([pending, orphaned]), Task.TaskType.FORCE_INDEX_REPO)

    assert created == 1
    assert tasks_for(pending)[0].task_type == Task.TaskType.FORCE_INDEX_REPO
    assert state_of(pending) == State.INITIALIZING


def test_delete_tasks_are_made_for_any_repository_and_mark_it_deleted(index, now):
    repositories = repositories_in(index, State.ORPHANED, State.PENDING_DELETION, State.READY)

    created = create_bulk_tasks(scope(repositories), Task.TaskType.DELETE_REPO)

    assert created == 3
    assert [tasks_for(r)[0].task_type for r in repositories] == [Task.TaskType.DELETE_REPO] * 3
    assert [state_of(r) for r in repositories] == [State.DELETED] * 3


def test_a_repository_with_a_pending_task_of_the_same_type_is_skipped(index, now):
    waiting, fresh = repositories_in(index, State.READY, State.READY)
    existing = make_task(waiting)

    created = create_bulk_tasks(scope([waiting, fresh]))

    assert created == 1
    assert tasks_for(waiting) == [existing]
    assert len(tasks_for(fresh)) == 1


@pytest.mark.parametrize(
    ("task_type", "state"),
    [
        pytest.param(Task.TaskType.DELETE_REPO, Task.State.PENDING, id="pending-of-another-type"),
        pytest.param(Task.TaskType.INDEX_REPO, Task.State.PROCESSING, id="processing-same-type"),
        pytest.param(Task.TaskType.INDEX_REPO, Task.State.DONE, id="done-same-type"),
    ],
)
def test_other_existing_tasks_do_not_prevent_a_new_one(index, now, task_type, state):
    (repository,) = repositories_in(index, State.READY)
    make_task(repository, task_type=task_type, state=state)

    assert create_bulk_tasks(scope([repository])) == 1


def test_a_second_call_creates_nothing(index, now):
    repositories = repositories_in(index, State.PENDING, State.READY)
    create_bulk_tasks(scope(repositories))
    clock.advance(60)
    before = (
        list(Task.objects.order_by("id").values()),
        list(Repository.objects.order_by("id").values()),
    )

    assert create_bulk_tasks(scope(repositories)) == 0
    assert (
        list(Task.objects.order_by("id").values()),
        list(Repository.objects.order_by("id").values()),
    ) == before


def test_a_second_delete_call_creates_nothing(index, now):
    repositories = repositories_in(index, State.ORPHANED)
    create_bulk_tasks(scope(repositories), Task.TaskType.DELETE_REPO)

    assert create_bulk_tasks(scope(repositories), Task.TaskType.DELETE_REPO) == 0
    assert Task.objects.count() == 1


def test_an_empty_scope_creates_nothing(now):
    assert create_bulk_tasks(Repository.objects.none()) == 0
    assert not Task.objects.exists()


def test_each_task_goes_to_the_node_of_its_own_index(now):
    first, second = IndexFactory(zoekt_node=NodeFactory()), IndexFactory(zoekt_node=NodeFactory())
    (a,) = repositories_in(first, State.PENDING)
    (b,) = repositories_in(second, State.PENDING)

    create_bulk_tasks(scope([a, b]))

    assert tasks_for(a)[0].zoekt_node_id == first.zoekt_node_id
    assert tasks_for(b)[0].zoekt_node_id == second.zoekt_node_id
