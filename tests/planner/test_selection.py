"""Which namespaces a rollout plans and on which nodes: SelectionService (reference 5.2)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from planner import selection
from planner.selection import SelectionService
from tests.factories import (
    GIB,
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ProjectFactory,
    ReplicaFactory,
)
from zoekt import app_settings
from zoekt.models import Node

pytestmark = pytest.mark.django_db


set_setting = app_settings.update


def enabled(replicas: int = 0, **kwargs):
    namespace = EnabledNamespaceFactory(**kwargs)
    for _ in range(replicas):
        ReplicaFactory(zoekt_enabled_namespace=namespace)
    return namespace


def node(unclaimed_gib: int, **kwargs) -> Node:
    """A node whose usable storage is ``unclaimed_gib`` (nothing reserved yet)."""
    return NodeFactory(total_bytes=unclaimed_gib * GIB, used_bytes=0, indexed_bytes=0, **kwargs)


def selected_ids(**kwargs) -> list[int]:
    return [ns.enabled_namespace_id for ns in SelectionService(**kwargs).namespaces()]


# --- namespaces --------------------------------------------------------------------------------


def test_namespaces_whose_replica_count_differs_from_the_desired_count_are_selected(now):
    missing = enabled(replicas=0)
    enough = enabled(replicas=1)
    too_many = enabled(replicas=2)
    override_missing = enabled(replicas=1, number_of_replicas_override=2)
    override_met = enabled(replicas=2, number_of_replicas_override=2)

    pool = SelectionService().execute()

    assert [ns.enabled_namespace_id for ns in pool.namespaces] == [
        missing.id,
        too_many.id,
        override_missing.id,
    ]
    assert enough.id not in selected_ids() and override_met.id not in selected_ids()
    by_id = {ns.enabled_namespace_id: ns for ns in pool.namespaces}
    assert by_id[missing.id].namespace_id == missing.root_namespace_id
    assert (by_id[missing.id].number_of_replicas, by_id[missing.id].replica_count) == (1, 0)
    assert (by_id[too_many.id].number_of_replicas, by_id[too_many.id].replica_count) == (1, 2)
    assert by_id[override_missing.id].number_of_replicas == 2


def test_the_default_number_of_replicas_setting_is_the_desired_count_without_override(now):
    one = enabled(replicas=1)
    set_setting(zoekt_default_number_of_replicas=2)
    (selected,) = SelectionService().namespaces()
    assert (selected.enabled_namespace_id, selected.number_of_replicas) == (one.id, 2)


def test_the_batch_size_caps_the_namespaces_in_ascending_id_order(now):
    namespaces = [enabled() for _ in range(5)]
    assert selected_ids(max_batch_size=3) == [ns.id for ns in namespaces[:3]]


@pytest.mark.parametrize(
    ("failed_hours_ago", "interval", "selected"),
    [
        pytest.param(None, "1d", True, id="never-failed-is-allowed"),
        pytest.param(23, "1d", False, id="failed-within-the-retry-interval-waits"),
        pytest.param(25, "1d", True, id="failed-before-the-retry-interval-is-retried"),
        pytest.param(25, "0", False, id="retry-interval-0-never-retries-a-failed-namespace"),
        pytest.param(2, "1h", True, id="a-shorter-interval-retries-sooner"),
    ],
)
def test_a_failed_rollout_waits_for_the_retry_interval(now, failed_hours_ago, interval, selected):
    set_setting(zoekt_rollout_retry_interval=interval)
    failed_at = None if failed_hours_ago is None else now - timedelta(hours=failed_hours_ago)
    namespace = enabled(last_rollout_failed_at=failed_at)
    assert (namespace.id in selected_ids()) is selected


def test_batches_of_enabled_namespaces_are_walked_until_the_batch_size_is_reached(
    now, monkeypatch, django_assert_num_queries
):
    monkeypatch.setattr(selection, "NAMESPACE_BATCH_SIZE", 2)
    satisfied = [enabled(replicas=1) for _ in range(3)]  # the first batch and a half match nothing
    wanted = [enabled() for _ in range(4)]
    assert all(a.id < b.id for a, b in zip(satisfied, wanted, strict=False))

    assert selected_ids(max_batch_size=3) == [ns.id for ns in wanted[:3]]
    assert selected_ids(max_batch_size=100) == [ns.id for ns in wanted]
    # Two queries per batch walked: 7 namespaces in batches of 2 is 4 batches.
    service = SelectionService(max_batch_size=100)
    with django_assert_num_queries(8):
        service.namespaces()


def test_nothing_is_selected_when_every_namespace_has_its_replicas(now):
    enabled(replicas=1)
    assert SelectionService().execute().namespaces == ()


def test_the_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="max_batch_size"):
        SelectionService(0, settings=app_settings.DEFAULTS)


# --- nodes -------------------------------------------------------------------------------------


def test_candidate_nodes_are_online_search_nodes_with_room_most_unclaimed_first(now):
    small = node(10)
    big = node(50)
    tie_a = node(30)
    tie_b = node(30)
    node(80, last_seen_at=now - timedelta(seconds=31))  # offline
    node(80, services=[])  # not a search node
    full = node(20)
    IndexFactory(zoekt_node=full, reserved_storage_bytes=20 * GIB)  # unclaimed 0
    over = node(20)
    IndexFactory(zoekt_node=over, reserved_storage_bytes=25 * GIB)  # negative

    nodes = SelectionService().nodes()

    assert [(n.id, n.unclaimed_storage_bytes) for n in nodes] == [
        (big.id, 50 * GIB),
        (tie_a.id, 30 * GIB),
        (tie_b.id, 30 * GIB),
        (small.id, 10 * GIB),
    ]


def test_unclaimed_storage_counts_every_index_reservation_in_any_state(now):
    target = node(100)
    IndexFactory(zoekt_node=target, reserved_storage_bytes=30 * GIB)
    IndexFactory(zoekt_node=target, reserved_storage_bytes=10 * GIB, state=230)  # orphaned
    (selected,) = SelectionService().nodes()
    assert selected.unclaimed_storage_bytes == 60 * GIB


def test_candidate_nodes_carry_their_metadata_for_the_scenario(now):
    health = {"webserver": {"rss_bytes": 5, "shards_loaded": 2}}
    target = node(10, metadata={"name": "zoekt-a", "process_health": health})
    (selected,) = SelectionService().nodes()
    assert (selected.id, selected.metadata["process_health"]) == (target.id, health)


def test_selection_costs_a_fixed_number_of_queries(now, django_assert_num_queries):
    for _ in range(5):
        enabled()
    for size in (10, 20, 30):
        node(size)
    service = SelectionService()
    with django_assert_num_queries(3):  # batch end, the batch's mismatched rows, the nodes
        service.execute()


# --- GitLab's limit on project namespaces ------------------------------------------------------


def add_project_namespaces(root, count: int) -> None:
    """``count`` project namespaces directly under ``root``, in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO namespaces (name, path, type, parent_id, traversal_ids, visibility_level,
                                    archived, created_at, updated_at)
            SELECT 'p' || i, 'p' || i, 'Project', %s, ARRAY[%s::bigint], 20, false, now(), now()
            FROM generate_series(1, %s) AS i
            """,
            [root.id, root.id, count],
        )
        # traversal_ids end with the namespace's own id, as GitLab's do.
        cursor.execute(
            "UPDATE namespaces SET traversal_ids = traversal_ids || id "
            "WHERE parent_id = %s AND cardinality(traversal_ids) = 1",
            [root.id],
        )


def test_gitlabs_limit_is_20000_project_namespaces():
    assert selection.MAX_PROJECTS_PER_NAMESPACE == 20_000


def test_a_root_with_more_than_20000_project_namespaces_is_skipped_with_its_reason(now):
    at_limit = enabled()
    add_project_namespaces(at_limit.root_namespace, 20_000)
    over = enabled()
    add_project_namespaces(over.root_namespace, 20_000)
    subgroup = GroupFactory(parent=over.root_namespace)
    ProjectFactory(namespace=subgroup)  # the 20,001st, deeper down: it counts too
    small = enabled()
    ProjectFactory(namespace=small.root_namespace, repository_size=1)  # with statistics

    service = SelectionService()
    pool = service.execute()

    assert [ns.enabled_namespace_id for ns in pool.namespaces] == [at_limit.id, small.id]
    assert pool.skipped == (
        selection.SkippedNamespace(
            enabled_namespace_id=over.id,
            namespace_id=over.root_namespace_id,
            reason="too_many_project_namespaces",
            project_namespaces=20_001,
            limit=20_000,
        ),
    )


def test_skipped_namespaces_do_not_take_places_in_the_batch(now, monkeypatch):
    monkeypatch.setattr(selection, "MAX_PROJECTS_PER_NAMESPACE", 1)
    big = [enabled() for _ in range(3)]
    for namespace in big:
        group = GroupFactory(parent=namespace.root_namespace)
        ProjectFactory(namespace=namespace.root_namespace)
        ProjectFactory(namespace=group)  # two project namespaces, one of them deeper
    fits = [enabled() for _ in range(3)]
    ProjectFactory(namespace=fits[0].root_namespace, repository_size=1)  # at the limit: selected

    service = SelectionService(max_batch_size=2)
    assert [ns.enabled_namespace_id for ns in service.namespaces()] == [fits[0].id, fits[1].id]
    assert [s.enabled_namespace_id for s in service.skipped] == [ns.id for ns in big]
    assert {s.project_namespaces for s in service.skipped} == {2}  # counted up to limit + 1


def test_the_limit_costs_no_extra_query(now, monkeypatch, django_assert_num_queries):
    monkeypatch.setattr(selection, "MAX_PROJECTS_PER_NAMESPACE", 1)
    namespace = enabled()
    ProjectFactory(namespace=namespace.root_namespace)
    ProjectFactory(namespace=namespace.root_namespace)
    service = SelectionService()
    with django_assert_num_queries(2):  # the only batch: its end, then its rows
        assert service.namespaces() == []
    assert [s.enabled_namespace_id for s in service.skipped] == [namespace.id]


def test_a_namespace_whose_projects_all_lack_statistics_waits_for_them(
    now, django_assert_num_queries
):
    waiting = enabled()
    ProjectFactory(namespace=waiting.root_namespace)  # no statistics row
    ProjectFactory(namespace=GroupFactory(parent=waiting.root_namespace))  # none deeper either
    sized = enabled()
    ProjectFactory(namespace=sized.root_namespace)
    ProjectFactory(namespace=sized.root_namespace, repository_size=0)  # one with statistics
    empty = enabled()  # no project: GitLab's empty replica, nothing to wait for
    surplus = enabled(replicas=2)  # too many replicas: removing them needs no statistics
    ProjectFactory(namespace=surplus.root_namespace)

    service = SelectionService()
    # The only batch: its end, its rows, then the statistics test of the short roots.
    with django_assert_num_queries(3):
        selected = [ns.enabled_namespace_id for ns in service.namespaces()]

    assert selected == [sized.id, empty.id, surplus.id]
    assert service.skipped == [
        selection.SkippedNamespace(
            enabled_namespace_id=waiting.id,
            namespace_id=waiting.root_namespace_id,
            reason="waiting_for_project_statistics",
            project_namespaces=2,
        )
    ]


def test_project_namespaces_without_projects_are_not_waiting(now, django_assert_num_queries):
    """The loader plans such a root as empty (GitLab's empty replica): nothing to wait for."""
    namespace = enabled()
    add_project_namespaces(namespace.root_namespace, 3)
    with_statistics = enabled()
    ProjectFactory(namespace=with_statistics.root_namespace, repository_size=5)
    service = SelectionService()
    with django_assert_num_queries(3):  # its end, its rows, the statistics test
        selected = [ns.enabled_namespace_id for ns in service.namespaces()]
    assert selected == [namespace.id, with_statistics.id]
    assert service.skipped == []


def test_the_statistics_test_is_asked_only_of_roots_short_of_replicas_with_projects(
    now, django_assert_num_queries
):
    ProjectFactory(namespace=enabled(replicas=2).root_namespace)  # a surplus to remove
    enabled()  # no project namespace: empty
    service = SelectionService()
    with django_assert_num_queries(2):  # the only batch: its end, then its rows
        assert len(service.namespaces()) == 2
