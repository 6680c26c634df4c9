"""What a kept rollout plan (planner.records) says about nodes and skipped namespaces."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from planner import selection
from planner.models import RolloutPlan
from planner.rollout import RolloutService
from tests.factories import EnabledNamespaceFactory, GroupFactory, NodeFactory, ProjectFactory

pytestmark = pytest.mark.django_db


def node(unclaimed: int, **kwargs):
    return NodeFactory(total_bytes=unclaimed, used_bytes=0, indexed_bytes=0, **kwargs)


def enabled_group(*sizes: int):
    group = GroupFactory()
    namespace = EnabledNamespaceFactory(root_namespace=group)
    for size in sizes:
        ProjectFactory(namespace=group, repository_size=size)
    return namespace


def dry_run() -> RolloutPlan:
    RolloutService(record_decisions=True).execute(dry_run=True, batch_size=10)
    return RolloutPlan.objects.get()


def test_each_explained_candidate_carries_its_node_name(now):
    small = node(100, metadata={"name": "zoekt-small"})
    roomy = node(1000, metadata={"name": "zoekt-roomy"})
    plain = node(50, metadata={})
    enabled_group(1000)  # 3,000 bytes: every candidate is passed over, and says why

    row = dry_run()

    (item,) = row.explanation
    names = {entry["node_id"]: entry["node_name"] for entry in item["nodes"]}
    assert names == {roomy.id: "zoekt-roomy", small.id: "zoekt-small", plain.id: None}
    assert row.summary["node_names"] == {
        str(roomy.id): "zoekt-roomy",
        str(small.id): "zoekt-small",
        str(plain.id): f"node-{plain.id}",
    }


def test_the_record_lists_the_namespaces_selection_skipped_and_why(now, monkeypatch):
    monkeypatch.setattr(selection, "MAX_PROJECTS_PER_NAMESPACE", 1)
    node(10_000)
    big = enabled_group(1, 1)
    enabled_group(1)

    row = dry_run()

    assert row.summary["namespaces_skipped"] == [
        {
            "namespace_id": big.root_namespace_id,
            "enabled_namespace_id": big.id,
            "reason": "too_many_project_namespaces",
            "project_namespaces": 2,
            "limit": 1,
        }
    ]
    assert [ns["namespace_id"] for ns in row.plan["create"]] != [big.root_namespace_id]


def test_the_record_lists_the_nodes_left_out_for_their_eviction_cooldown(now):
    roomy = node(10_000, metadata={"name": "zoekt-roomy"})
    cooling = node(
        20_000, metadata={"name": "zoekt-cooling"}, eviction_cooldown_until=now + timedelta(hours=2)
    )
    plain = node(30_000, metadata={}, eviction_cooldown_until=now + timedelta(hours=12))
    cooled = node(40_000, metadata={"name": "zoekt-cooled"}, eviction_cooldown_until=now)
    enabled_group(1)

    row = dry_run()

    assert row.summary["nodes_in_eviction_cooldown"] == [
        {
            "node_id": plain.id,
            "node_name": f"node-{plain.id}",
            "reason": "node_eviction_cooldown",
            "cooldown_until": (now + timedelta(hours=12)).isoformat(),
        },
        {
            "node_id": cooling.id,
            "node_name": "zoekt-cooling",
            "reason": "node_eviction_cooldown",
            "cooldown_until": (now + timedelta(hours=2)).isoformat(),
        },
    ]
    assert set(row.summary["node_names"]) == {str(cooled.id), str(roomy.id)}
    assert [n["id"] for n in row.plan["nodes"]] == [cooled.id]  # the roomiest not cooling


def test_a_record_without_cooling_nodes_lists_none(now):
    node(10_000)
    enabled_group(1)
    assert dry_run().summary["nodes_in_eviction_cooldown"] == []


def test_the_plan_page_names_the_skipped_namespaces(admin_client, now, monkeypatch):
    monkeypatch.setattr(selection, "MAX_PROJECTS_PER_NAMESPACE", 1)
    node(10_000)
    big = enabled_group(1, 1)
    enabled_group(1)
    row = dry_run()

    html = admin_client.get(reverse("dashboard-plan", args=[row.id])).content.decode()

    assert 'data-figure="skipped"' in html
    assert f'data-skipped-namespace-id="{big.root_namespace_id}"' in html
    assert "more than 1 project namespaces" in html
