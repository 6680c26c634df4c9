"""The read models agree with the models, querysets and search targets they summarise."""

from __future__ import annotations

import pytest

from dashboard import readmodels
from tests.dashboard.builders import build_fleet, unplaced_namespace
from tests.factories import IndexFactory
from zoekt.capacity import NodeWatermark
from zoekt.models import EnabledNamespace, Index, Node, Replica
from zoekt.search_targets import search_targets

pytestmark = pytest.mark.django_db


def test_fleet_overview_rows_match_each_nodes_own_figures(now):
    fleet = build_fleet(5, 4)
    overview = readmodels.fleet_overview()
    assert [row.id for row in overview.nodes] == sorted(node.id for node in fleet.nodes)
    for row in overview.nodes:
        node = Node.objects.get(pk=row.id)
        assert row.name == node.name
        assert row.storage_percent_used == node.storage_percent_used
        assert row.watermark == node.watermark
        assert row.reserved_storage_bytes == node.reserved_storage_bytes
        assert row.unclaimed_storage_bytes == node.unclaimed_storage_bytes
        assert row.index_count == node.indices.count()
        assert row.memory.node_id == node.id
    assert overview.online == 5
    assert overview.indices["ready"] == Index.objects.count()
    assert overview.replicas == {"pending": 0, "ready": 4}
    assert overview.enabled_namespaces == overview.search_enabled_namespaces == 4
    # 20, 30, 40 and 50 % are normal; 60 % reaches the low watermark.
    assert overview.watermarks[NodeWatermark.NORMAL.value] == 4
    assert overview.watermarks[NodeWatermark.LOW.value] == 1


def test_fleet_overview_searchable_is_the_querysets_and_says_why_not(now):
    fleet = build_fleet(3, 0)
    sick = fleet.nodes[1]
    metadata = dict(sick.metadata)
    metadata["process_health"]["webserver"]["restarts_15m"] = 9
    Node.objects.filter(pk=sick.pk).update(metadata=metadata)
    overview = readmodels.fleet_overview()
    assert {row.id for row in overview.nodes if row.searchable} == set(
        Node.objects.searchable().values_list("id", flat=True)
    )
    by_id = {row.id: row for row in overview.nodes}
    assert not by_id[sick.id].searchable
    assert by_id[sick.id].search_exclusions == ("process_restarts_exceeded",)


def test_namespace_rows_are_searchable_exactly_when_search_targets_say_so(now):
    fleet = build_fleet(3, 6)
    ns = fleet.namespaces
    Replica.objects.filter(zoekt_enabled_namespace=ns[0]).update(state=Replica.State.PENDING)
    Index.objects.filter(zoekt_enabled_namespace=ns[1]).update(state=Index.State.PENDING)
    EnabledNamespace.objects.filter(pk=ns[2].pk).update(search=False)
    Node.objects.filter(pk=fleet.nodes[0].pk).update(last_seen_at=now.replace(year=2025))
    IndexFactory(zoekt_enabled_namespace=ns[5], zoekt_replica=None, namespace_id=0)
    _page, rows = readmodels.namespace_page()
    assert len(rows) == 6
    for row in rows:
        assert row.searchable == search_targets(row.root_namespace_id).search_enabled, row.path
    assert [row.searchable for row in rows].count(True) >= 1


def test_namespace_detail_counts_projects_in_each_range(now):
    fleet = build_fleet(2, 1)
    detail = readmodels.namespace_detail(fleet.namespaces[0].root_namespace_id)
    (replica,) = detail.replicas
    assert [index.projects_in_range for index in replica.indices] == [2, 1]
    assert detail.project_count == 3
    assert [index.repositories for index in replica.indices] == [{"ready": 2}, {"ready": 1}]
    assert detail.targets.search_enabled
    assert detail.node_ids == sorted(node.id for node in fleet.nodes)


def test_namespace_detail_lists_indices_without_a_replica_apart(now):
    fleet = build_fleet(2, 1)
    enabled = fleet.namespaces[0]
    Replica.objects.filter(zoekt_enabled_namespace=enabled).delete()
    detail = readmodels.namespace_detail(enabled.root_namespace_id)
    assert detail.replicas == []
    assert len(detail.detached_indices) == 2
    assert detail.targets.reason == "no_ready_replica"


def test_namespace_detail_says_a_namespace_without_project_statistics_waits_for_them(now):
    fleet = build_fleet(2, 1)
    waiting = unplaced_namespace("stats-less", (None, None))
    detail = readmodels.namespace_detail(waiting.root_namespace_id)
    assert detail.rollout_waiting_reason == "waiting_for_project_statistics"
    assert detail.project_count == 2
    # A placed namespace, one still to place with statistics, and one without projects wait
    # for nothing.
    for enabled in (
        fleet.namespaces[0],
        unplaced_namespace("sized", (None, 10)),
        unplaced_namespace("empty", ()),
    ):
        assert readmodels.namespace_detail(enabled.root_namespace_id).rollout_waiting_reason is None


def test_namespace_detail_of_a_namespace_that_is_not_enabled_is_none(now):
    assert readmodels.namespace_detail(987_654) is None
