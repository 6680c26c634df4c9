"""Indexing: initial_indexing (6.6), repo_to_index_check, repo_to_reindex_check (6.10),
mark_indices_as_ready and update_replica_states (2.3), each with GitLab's numbers."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.factories import (
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ProjectFactory,
    ReplicaFactory,
    RepositoryFactory,
)
from tests.scheduling import builders
from zoekt import app_settings, clock
from zoekt.models import Index, Replica, Repository, Task
from zoekt.reasons import Reason
from zoekt.scheduling import handlers

pytestmark = pytest.mark.django_db

I = Index.State  # noqa: E741
R = Repository.State
set_setting = app_settings.update


def snapshot() -> dict:
    return {
        "indices": sorted(Index.objects.values_list("id", "state")),
        "repositories": sorted(Repository.objects.values_list("id", "state")),
        "tasks": Task.objects.count(),
    }


# --- initial_indexing: the scheduled task, GitLab's rule ---------------------------------------


@pytest.fixture
def gitlab_admission():
    """GitLab's initial indexing: ``zoekt_initial_indexing_limit`` indices per node a run."""
    set_setting(zoekt_indexing_admission="gitlab")


def test_initial_indexing_dispatches_the_oldest_pending_index_of_each_online_node(
    gitlab_admission, service, dispatched
):
    a, b = NodeFactory(), NodeFactory()
    oldest_a = IndexFactory(zoekt_node=a)
    IndexFactory(zoekt_node=a)
    only_b = IndexFactory(zoekt_node=b)
    IndexFactory(zoekt_node=NodeFactory(), state=I.READY)  # a node without pending indices

    result = service().execute("initial_indexing")

    assert dispatched == [("initialize_index", (oldest_a.id,)), ("initialize_index", (only_b.id,))]
    assert result["nodes_with_pending_indices"] == 2


def test_initial_indexing_starts_one_index_per_node_by_default(
    gitlab_admission, service, dispatched
):
    assert app_settings.current().initial_indexing_limit == 1
    node = NodeFactory()
    oldest, _, _ = (IndexFactory(zoekt_node=node) for _ in range(3))

    result = service().execute("initial_indexing")

    assert dispatched == [("initialize_index", (oldest.id,))]
    assert result["initial_indexing_limit"] == 1


def test_initial_indexing_starts_the_limits_oldest_pending_indices_of_each_online_node(
    gitlab_admission, service, dispatched, now
):
    set_setting(zoekt_initial_indexing_limit=3)
    a, b, c = NodeFactory(), NodeFactory(), NodeFactory()
    on_a = [IndexFactory(zoekt_node=a) for _ in range(5)]
    on_b = [IndexFactory(zoekt_node=b) for _ in range(2)]
    IndexFactory(zoekt_node=c, state=I.READY)  # nothing pending
    offline = NodeFactory(last_seen_at=now - timedelta(seconds=30))
    IndexFactory(zoekt_node=offline)
    # Not pending: never counted against a node's limit.
    IndexFactory(zoekt_node=b, state=I.INITIALIZING)

    result = service().execute("initial_indexing")

    expected = [index.id for index in (*on_a[:3], *on_b)]
    assert dispatched == [("initialize_index", (index_id,)) for index_id in expected]
    assert result["index_ids"] == expected
    assert result["nodes_with_pending_indices"] == 2
    assert result["initial_indexing_limit"] == 3
    assert Index.objects.filter(state=I.PENDING).count() == 8  # the task only dispatches


def test_a_raised_limit_takes_the_oldest_pending_indices_first(
    gitlab_admission, service, dispatched
):
    set_setting(zoekt_initial_indexing_limit=2)
    node = NodeFactory()
    indices = [IndexFactory(zoekt_node=node) for _ in range(4)]
    Index.objects.filter(pk=indices[0].pk).update(state=I.INITIALIZING)

    service().execute("initial_indexing")

    assert dispatched == [
        ("initialize_index", (indices[1].id,)),
        ("initialize_index", (indices[2].id,)),
    ]


@pytest.mark.parametrize("mode", ["admission", "gitlab"])
def test_initial_indexing_skips_offline_nodes_and_nodes_not_for_search(
    service, dispatched, now, mode
):
    set_setting(zoekt_indexing_admission=mode)
    offline = NodeFactory(last_seen_at=now - timedelta(seconds=30))
    not_for_search = NodeFactory(services=[7])
    IndexFactory(zoekt_node=offline)
    IndexFactory(zoekt_node=not_for_search)

    service().execute("initial_indexing")

    assert dispatched == []


# --- initial_indexing: the event --------------------------------------------------------------


def namespace_with_projects(count: int, **index_fields) -> tuple[Index, list]:
    index = builders.group_with_index(**index_fields)
    root = index.zoekt_enabled_namespace.root_namespace
    return index, builders.projects(root, count)


def test_initializing_an_index_creates_a_repository_per_project_with_database_defaults(now):
    index, projects = namespace_with_projects(3)
    ProjectFactory()  # another namespace's project

    result = handlers.initialize_index(index.id)

    index.refresh_from_db()
    assert index.state == I.INITIALIZING
    repos = list(Repository.objects.filter(zoekt_index=index).order_by("project_id"))
    assert [r.project_id for r in repos] == [p.id for p in projects]
    assert {(r.state, r.retries_left, r.schema_version) for r in repos} == {
        (R.PENDING, Repository.DB_DEFAULT_RETRIES_LEFT, 0)
    }
    assert all(r.project_identifier == r.project_id for r in repos)
    assert result["repositories_created"] == 3
    assert result["re_emit"] is False


def test_initializing_an_index_keeps_to_its_inclusive_project_namespace_range(now):
    index, projects = namespace_with_projects(5)
    namespace_ids = [p.project_namespace_id for p in projects]
    Index.objects.filter(pk=index.pk).update(
        metadata={
            "project_namespace_id_from": namespace_ids[1],
            "project_namespace_id_to": namespace_ids[3],
        }
    )

    handlers.initialize_index(index.id)

    assert sorted(Repository.objects.values_list("project_id", flat=True)) == [
        p.id for p in projects[1:4]
    ]


@pytest.mark.parametrize(
    ("range_", "expected"),
    [
        pytest.param({"project_namespace_id_from": 2}, [2, 3, 4], id="open-ended-to"),
        pytest.param({"project_namespace_id_to": 1}, [0, 1], id="open-ended-from"),
    ],
)
def test_an_open_range_end_means_no_bound(now, range_, expected):
    index, projects = namespace_with_projects(5)
    ns = [p.project_namespace_id for p in projects]
    metadata = {key: ns[value] for key, value in range_.items()}
    Index.objects.filter(pk=index.pk).update(metadata=metadata)

    handlers.initialize_index(index.id)

    assert sorted(Repository.objects.values_list("project_id", flat=True)) == [
        projects[i].id for i in expected
    ]


@pytest.mark.parametrize(
    ("projects", "first_created", "first_state", "second_created", "second_state"),
    [
        pytest.param(9_999, 9_999, "initializing", None, None, id="9999-projects-one-run"),
        pytest.param(10_000, 10_000, "pending", 0, "initializing", id="10000-hits-the-cap"),
        pytest.param(10_001, 10_000, "pending", 1, "initializing", id="10001-two-runs"),
    ],
)
def test_initial_indexing_stops_at_10000_inserts_and_re_emits(
    now, projects, first_created, first_state, second_created, second_state
):
    index, _ = namespace_with_projects(projects)

    first = handlers.initialize_index(index.id)

    assert first["repositories_created"] == first_created
    assert first["index_state"] == first_state
    assert first["re_emit"] is (first_state == "pending")
    if second_created is not None:
        second = handlers.initialize_index(index.id)
        assert second["repositories_created"] == second_created
        assert second["index_state"] == second_state
        assert second["re_emit"] is False
    assert Repository.objects.count() == projects
    assert Index.objects.get(pk=index.pk).state == I.INITIALIZING


def test_initial_indexing_walks_project_namespaces_in_batches_of_1000(now):
    index, _ = namespace_with_projects(2_001)

    result = handlers.initialize_index(index.id)

    assert result["namespace_batches"] == 3
    assert result["repositories_created"] == 2_001


def test_a_second_run_adds_only_missing_repositories(now):
    index, projects = namespace_with_projects(2)
    RepositoryFactory(zoekt_index=index, project=projects[0])

    result = handlers.initialize_index(index.id)

    assert result["repositories_created"] == 1
    assert Repository.objects.filter(zoekt_index=index).count() == 2


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param("ready", Reason.INDEX_NOT_PENDING, id="index-no-longer-pending"),
        pytest.param("no-namespace", Reason.ENABLED_NAMESPACE_NOT_FOUND, id="namespace-gone"),
        pytest.param("deleted", Reason.INDEX_NOT_FOUND, id="index-gone"),
    ],
)
def test_initial_indexing_ignores_an_event_whose_index_moved_on(now, change, reason):
    index, _ = namespace_with_projects(2)
    if change == "ready":
        Index.objects.filter(pk=index.pk).update(state=I.READY)
    elif change == "no-namespace":
        Index.objects.filter(pk=index.pk).update(zoekt_enabled_namespace=None)
    else:
        Index.objects.filter(pk=index.pk).delete()
    before = snapshot()

    result = handlers.initialize_index(index.id)

    assert result["skipped"] == reason
    assert snapshot() == before


def test_an_index_of_an_empty_namespace_goes_straight_to_initializing(now):
    index = builders.group_with_index()

    result = handlers.initialize_index(index.id)

    assert result["repositories_created"] == 0
    assert Index.objects.get(pk=index.pk).state == I.INITIALIZING


# --- repo_to_index_check ------------------------------------------------------------------------


def test_repo_to_index_check_dispatches_only_while_a_pending_repository_exists(service, dispatched):
    RepositoryFactory(state=R.READY)
    assert service().execute("repo_to_index_check")["skipped"] == Reason.CONDITION_NOT_MET
    assert dispatched == []

    RepositoryFactory(state=R.PENDING)
    assert service().execute("repo_to_index_check")["dispatched"] == ["index_repos"]
    assert dispatched.names == ["index_repos"]


@pytest.mark.parametrize(
    ("pending", "created", "re_emit"),
    [
        pytest.param(499, 499, False, id="499-all-in-one-batch"),
        pytest.param(500, 500, False, id="500-a-full-batch-and-nothing-left"),
        pytest.param(501, 500, True, id="501-re-emits-for-the-last-one"),
    ],
)
def test_index_repos_creates_tasks_for_500_pending_repositories(now, pending, created, re_emit):
    index = builders.group_with_index(state=I.INITIALIZING)
    builders.repositories(index, pending)

    result = handlers.index_repos()

    assert result["tasks_created"] == created
    assert result["re_emit"] is re_emit
    assert Task.objects.filter(task_type=Task.TaskType.INDEX_REPO).count() == created
    assert Repository.objects.filter(state=R.INITIALIZING).count() == created
    assert Repository.objects.filter(state=R.PENDING).count() == pending - created
    tasks = Task.objects.filter(zoekt_node_id=index.zoekt_node_id, state=Task.State.PENDING)
    assert tasks.count() == created


def test_index_repos_twice_creates_no_second_task(now):
    index = builders.group_with_index(state=I.INITIALIZING)
    builders.repositories(index, 3)

    handlers.index_repos()
    again = handlers.index_repos()

    assert again["tasks_created"] == 0
    assert Task.objects.count() == 3


# --- repo_to_reindex_check ----------------------------------------------------------------------


def test_repo_to_reindex_check_needs_a_ready_repository_below_the_online_maximum(
    service, dispatched, now
):
    node = NodeFactory(schema_version=2531)
    index = IndexFactory(zoekt_node=node)
    RepositoryFactory(zoekt_index=index, state=R.READY, schema_version=2531)
    RepositoryFactory(zoekt_index=index, state=R.PENDING, schema_version=0)  # queued anyway
    before = snapshot()

    result = service().execute("repo_to_reindex_check")

    assert result["skipped"] == Reason.CONDITION_NOT_MET
    assert dispatched == []
    assert snapshot() == before

    Repository.objects.filter(state=R.READY).update(schema_version=2530)
    result = service().execute("repo_to_reindex_check")
    assert dispatched == [("reindex_repos", (node.id,))]
    assert result["maximum_schema_version"] == 2531


def test_repo_to_reindex_check_dispatches_at_most_100_nodes(service, dispatched, now):
    for _ in range(101):
        index = IndexFactory(zoekt_node=NodeFactory(schema_version=2))
        RepositoryFactory(zoekt_index=index, state=R.READY, schema_version=1)

    result = service().execute("repo_to_reindex_check")

    assert len(dispatched) == 100
    assert len(result["node_ids"]) == 100


def test_a_node_is_dispatched_only_for_its_own_outdated_repositories(service, dispatched, now):
    old = NodeFactory(schema_version=1)
    new = NodeFactory(schema_version=2)
    RepositoryFactory(zoekt_index=IndexFactory(zoekt_node=old), state=R.READY, schema_version=1)
    RepositoryFactory(zoekt_index=IndexFactory(zoekt_node=new), state=R.READY, schema_version=1)

    service().execute("repo_to_reindex_check")

    assert dispatched == [("reindex_repos", (new.id,))]


@pytest.mark.parametrize(
    ("outdated", "created"),
    [
        pytest.param(999, 999, id="999-all"),
        pytest.param(1_000, 1_000, id="1000-all"),
        pytest.param(1_001, 1_000, id="1001-capped-at-1000"),
    ],
)
def test_reindex_repos_creates_index_tasks_for_1000_of_a_nodes_repositories(now, outdated, created):
    node = NodeFactory(schema_version=2)
    index = builders.group_with_index(node, state=I.READY)
    builders.repositories(index, outdated, state=R.READY, schema_version=1)
    builders.repositories(index, 2, state=R.READY, schema_version=2)  # current

    result = handlers.reindex_repos(node.id)

    assert result["tasks_created"] == created
    assert result["re_emit"] is False
    assert Task.objects.filter(task_type=Task.TaskType.INDEX_REPO).count() == created
    # Ready repositories stay ready until their callback refreshes the schema version.
    assert set(Repository.objects.values_list("state", flat=True)) == {R.READY}


def test_reindex_repos_ignores_an_offline_node(now):
    node = NodeFactory(schema_version=2, last_seen_at=now - timedelta(minutes=5))
    RepositoryFactory(zoekt_index=IndexFactory(zoekt_node=node), state=R.READY, schema_version=1)

    assert handlers.reindex_repos(node.id)["skipped"] == Reason.NODE_OFFLINE
    assert Task.objects.count() == 0


# --- mark_indices_as_ready -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("repository_states", "dispatches"),
    [
        pytest.param([], True, id="no-repositories"),
        pytest.param([R.READY, R.FAILED], True, id="all-ready-or-failed"),
        pytest.param([R.READY, R.INITIALIZING], False, id="one-still-initializing"),
        pytest.param([R.PENDING], False, id="one-pending"),
    ],
)
def test_mark_indices_as_ready_needs_an_initializing_index_with_every_repository_finished(
    service, dispatched, repository_states, dispatches
):
    index = IndexFactory(state=I.INITIALIZING)
    for state in repository_states:
        RepositoryFactory(zoekt_index=index, state=state)

    service().execute("mark_indices_as_ready")

    assert dispatched.names == (["mark_indices_ready"] if dispatches else [])


@pytest.mark.parametrize(
    ("count", "marked"),
    [pytest.param(1_000, 1_000, id="1000-all"), pytest.param(1_001, 1_000, id="1001-capped")],
)
def test_mark_indices_ready_marks_1000_indices_per_run(now, count, marked):
    builders.indices(count, state=I.INITIALIZING)

    result = handlers.mark_indices_ready()

    assert result["indices_marked_ready"] == marked
    assert Index.objects.filter(state=I.READY).count() == marked
    assert Index.objects.filter(state=I.INITIALIZING).count() == count - marked


def test_mark_indices_ready_leaves_unfinished_and_non_initializing_indices(now):
    unfinished = IndexFactory(state=I.INITIALIZING)
    RepositoryFactory(zoekt_index=unfinished, state=R.INITIALIZING)
    pending = IndexFactory(state=I.PENDING)

    assert handlers.mark_indices_ready()["indices_marked_ready"] == 0
    assert Index.objects.get(pk=unfinished.pk).state == I.INITIALIZING
    assert Index.objects.get(pk=pending.pk).state == I.PENDING


# --- update_replica_states -----------------------------------------------------------------------


def test_update_replica_states_runs_the_replica_state_service(service):
    ready = ReplicaFactory()
    IndexFactory(zoekt_replica=ready, state=I.READY)
    demoted = ReplicaFactory(state=Replica.State.READY)
    IndexFactory(zoekt_replica=demoted, state=I.INITIALIZING)

    result = service().execute("update_replica_states")

    assert result == {
        "task": "update_replica_states",
        "replicas_marked_ready": 1,
        "replicas_marked_pending": 1,
    }
    assert Replica.objects.get(pk=ready.pk).state == Replica.State.READY
    assert Replica.objects.get(pk=demoted.pk).state == Replica.State.PENDING


def test_the_factories_agree_with_the_builders(now):
    # Guard for the helpers above: a built index is pending, with its own namespace and replica.
    index = builders.group_with_index()
    assert index.state == I.PENDING
    assert index.zoekt_replica.namespace_id == index.namespace_id
    assert index.zoekt_enabled_namespace.root_namespace.traversal_ids == [index.namespace_id]
    assert GroupFactory().traversal_ids
    assert EnabledNamespaceFactory().search is True
    assert clock.now() == now
