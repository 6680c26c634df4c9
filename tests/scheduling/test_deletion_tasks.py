"""The deletion pipeline (6.9): index_should_be_marked_as_orphaned_check, index_to_delete_check,
repo_should_be_marked_as_orphaned_check and repo_to_delete_check, with GitLab's numbers."""

from __future__ import annotations

import pytest

from tests.factories import IndexFactory, NodeFactory, ReplicalessIndexFactory, RepositoryFactory
from tests.scheduling import builders
from zoekt.models import EnabledNamespace, Index, Project, Repository, Task
from zoekt.reasons import Reason
from zoekt.scheduling import handlers

pytestmark = pytest.mark.django_db

I = Index.State  # noqa: E741
R = Repository.State


# --- index_should_be_marked_as_orphaned_check ----------------------------------------------------


@pytest.mark.parametrize(
    ("make", "dispatches"),
    [
        pytest.param(lambda: ReplicalessIndexFactory(state=I.READY), True, id="no-replica"),
        pytest.param(
            lambda: ReplicalessIndexFactory(state=I.EVICTED), True, id="evicted-no-replica"
        ),
        pytest.param(
            lambda: IndexFactory(zoekt_enabled_namespace=None), True, id="no-enabled-namespace"
        ),
        pytest.param(
            lambda: ReplicalessIndexFactory(state=I.ORPHANED), False, id="already-orphaned"
        ),
        pytest.param(
            lambda: ReplicalessIndexFactory(state=I.PENDING_DELETION), False, id="pending-deletion"
        ),
        pytest.param(lambda: IndexFactory(), False, id="has-both"),
    ],
)
def test_an_index_without_namespace_or_replica_is_orphaned(service, dispatched, make, dispatches):
    make()
    service().execute("index_should_be_marked_as_orphaned_check")
    assert dispatched.names == (["orphan_indices"] if dispatches else [])


@pytest.mark.parametrize(
    ("count", "marked"),
    [pytest.param(1_000, 1_000, id="1000-all"), pytest.param(1_001, 1_000, id="1001-capped")],
)
def test_1000_indices_are_orphaned_per_event_in_id_order(now, count, marked):
    built = builders.indices(count)
    Index.objects.update(zoekt_replica=None)

    result = handlers.orphan_indices()

    assert result == {"indices_marked_orphaned": marked, "re_emit": False}
    orphaned = list(Index.objects.filter(state=I.ORPHANED).values_list("id", flat=True))
    assert sorted(orphaned) == [i.id for i in built[:marked]]


def test_deleting_an_enabled_namespace_sends_its_indices_down_the_pipeline(now):
    index = IndexFactory(state=I.READY)
    EnabledNamespace.objects.filter(pk=index.zoekt_enabled_namespace_id).delete()

    handlers.orphan_indices()

    index.refresh_from_db()
    assert (index.state, index.zoekt_enabled_namespace_id, index.zoekt_replica_id) == (
        I.ORPHANED,
        None,
        None,
    )


# --- index_to_delete_check ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "dispatches"),
    [
        pytest.param(I.ORPHANED, True, id="orphaned"),
        pytest.param(I.PENDING_DELETION, True, id="pending-deletion"),
        pytest.param(I.EVICTED, False, id="evicted"),
        pytest.param(I.READY, False, id="ready"),
    ],
)
def test_index_to_delete_check_needs_an_orphaned_or_pending_deletion_index(
    service, dispatched, state, dispatches
):
    ReplicalessIndexFactory(state=state)
    service().execute("index_to_delete_check")
    assert dispatched.names == (["delete_indices"] if dispatches else [])


def test_an_index_with_repositories_has_them_marked_pending_deletion(now):
    index = ReplicalessIndexFactory(state=I.ORPHANED)
    ready = RepositoryFactory(zoekt_index=index, state=R.READY)
    failed = RepositoryFactory(zoekt_index=index, state=R.FAILED)
    in_flight = RepositoryFactory(zoekt_index=index, state=R.DELETED)
    without_project = RepositoryFactory(zoekt_index=index, state=R.ORPHANED)
    Project.objects.filter(pk=without_project.project_id).delete()

    result = handlers.delete_indices()

    states = dict(Repository.objects.values_list("id", "state"))
    assert states == {
        ready.id: R.PENDING_DELETION,
        failed.id: R.PENDING_DELETION,
        in_flight.id: R.DELETED,  # its delete task is out already
        without_project.id: R.ORPHANED,  # not reached; deletable as it is
    }
    assert result["repositories_marked"] == 2
    assert result["indices_destroyed"] == 0
    assert Index.objects.filter(pk=index.pk).exists()


def test_an_index_without_repositories_is_destroyed(now):
    empty = ReplicalessIndexFactory(state=I.ORPHANED)
    kept = ReplicalessIndexFactory(state=I.EVICTED)

    result = handlers.delete_indices()

    assert result["indices_destroyed"] == 1
    assert not Index.objects.filter(pk=empty.pk).exists()
    assert Index.objects.filter(pk=kept.pk).exists()


@pytest.mark.parametrize(
    ("count", "destroyed"),
    [pytest.param(500, 500, id="500-all"), pytest.param(501, 500, id="501-capped")],
)
def test_500_indices_are_handled_per_event(now, count, destroyed):
    builders.indices(count, state=I.ORPHANED)

    result = handlers.delete_indices()

    assert result["indices_destroyed"] == destroyed
    assert Index.objects.count() == count - destroyed


def test_repositories_of_one_index_are_marked_in_batches_of_5000(now):
    index = builders.group_with_index(state=I.ORPHANED)
    builders.repositories(index, 5_001, state=R.READY)

    result = handlers.delete_indices()

    assert result["repositories_marked"] == 5_001
    assert set(Repository.objects.values_list("state", flat=True)) == {R.PENDING_DELETION}


# --- repo_should_be_marked_as_orphaned_check -------------------------------------------------


def test_a_repository_whose_project_was_deleted_is_orphaned(service, dispatched, now):
    repo = RepositoryFactory(state=R.READY)
    assert service(bypass_throttle=True).execute("repo_should_be_marked_as_orphaned_check")[
        "skipped"
    ] == (Reason.CONDITION_NOT_MET)

    Project.objects.filter(pk=repo.project_id).delete()
    service(bypass_throttle=True).execute("repo_should_be_marked_as_orphaned_check")
    assert dispatched.names == ["orphan_repos"]
    assert handlers.orphan_repos()["repositories_marked_orphaned"] == 1
    identifier = repo.project_identifier
    repo.refresh_from_db()
    assert (repo.state, repo.project_id, repo.project_identifier) == (R.ORPHANED, None, identifier)


@pytest.mark.parametrize(
    ("count", "marked", "re_emit"),
    [
        pytest.param(999, 999, False, id="999-no-re-emit"),
        pytest.param(1_000, 1_000, True, id="exactly-1000-re-emits"),
        pytest.param(1_001, 1_000, True, id="1001-re-emits"),
    ],
)
def test_1000_repositories_are_orphaned_per_event_re_emitting_at_exactly_1000(
    now, count, marked, re_emit
):
    index = builders.group_with_index()
    builders.repositories(index, count, state=R.READY)
    Project.objects.all().delete()

    result = handlers.orphan_repos()

    assert result == {"repositories_marked_orphaned": marked, "re_emit": re_emit}


# --- repo_to_delete_check ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "dispatches"),
    [
        pytest.param(R.ORPHANED, True, id="orphaned"),
        pytest.param(R.PENDING_DELETION, True, id="pending-deletion"),
        pytest.param(R.DELETED, False, id="deleted"),
        pytest.param(R.READY, False, id="ready"),
    ],
)
def test_repo_to_delete_check_needs_a_deletable_repository(service, dispatched, state, dispatches):
    RepositoryFactory(state=state)
    service().execute("repo_to_delete_check")
    assert dispatched.names == (["delete_repos"] if dispatches else [])


@pytest.mark.parametrize(
    ("deletable", "created", "re_emit"),
    [
        pytest.param(500, 500, False, id="500-all"),
        pytest.param(501, 500, True, id="501-re-emits"),
    ],
)
def test_500_delete_tasks_are_created_per_event(now, deletable, created, re_emit):
    index = builders.group_with_index(state=I.ORPHANED)
    builders.repositories(index, deletable, state=R.PENDING_DELETION)

    result = handlers.delete_repos()

    assert result["tasks_created"] == created
    assert result["re_emit"] is re_emit
    assert Task.objects.filter(task_type=Task.TaskType.DELETE_REPO).count() == created
    assert Repository.objects.filter(state=R.DELETED).count() == created


def delete_tasks(count: int, node_id: int, state=Task.State.PENDING) -> None:
    Task.objects.bulk_create(
        [
            Task(
                zoekt_node_id=node_id,
                zoekt_repository_id=i,
                project_identifier=i,
                task_type=Task.TaskType.DELETE_REPO,
                state=state,
            )
            for i in range(count)
        ]
    )


@pytest.mark.parametrize(
    ("live", "runs"),
    [
        pytest.param(4_999, True, id="4999-live-delete-tasks"),
        pytest.param(5_000, False, id="5000-live-delete-tasks"),
    ],
)
def test_no_delete_tasks_are_created_while_5000_are_live(now, live, runs):
    node = NodeFactory()
    delete_tasks(live - 1, node.id)
    delete_tasks(1, node.id, Task.State.PROCESSING)
    delete_tasks(10, node.id, Task.State.DONE)  # finished: not counted
    RepositoryFactory(state=R.ORPHANED)

    result = handlers.delete_repos()

    assert (result.get("skipped") == Reason.TOO_MANY_DELETE_TASKS) is not runs
    assert Repository.objects.filter(state=R.DELETED).exists() is runs


def test_delete_tasks_of_deleted_nodes_do_not_count(now):
    delete_tasks(5_000, node_id=10**9)  # no such node
    RepositoryFactory(state=R.ORPHANED)

    assert handlers.delete_repos()["tasks_created"] == 1
