"""GET /api/v1/namespaces/<root_namespace_id>/search_routing: the routing view for operators."""

from __future__ import annotations

import pytest

from tests.api.test_search_targets import enabled, ready_replica, search_node  # noqa: F401
from tests.factories import GroupFactory, ProjectFactory, RepositoryFactory
from zoekt import search_routing
from zoekt.models import Namespace, Repository

pytestmark = pytest.mark.django_db


def routing_url(namespace_id) -> str:
    return f"/api/v1/namespaces/{namespace_id}/search_routing"


def repository(index, project_namespace_id: int, state=Repository.State.READY) -> Repository:
    """A repository in ``index`` of a project whose project namespace has this id."""
    group = GroupFactory()
    own = GroupFactory(id=project_namespace_id, type=Namespace.Type.PROJECT, parent=group)
    project = ProjectFactory(namespace=group, project_namespace=own)
    return RepositoryFactory(zoekt_index=index, project=project, state=state)


def test_a_split_namespace_is_shown_node_by_node_with_its_ranges_and_counts(admin_client, enabled):  # noqa: F811
    first, second = search_node("zoekt-a"), search_node("zoekt-b")
    replica = ready_replica(enabled, first, second)
    index_a, index_b = replica.indices.order_by("zoekt_node_id")
    low = [repository(index_a, pn) for pn in (510, 520)]
    high = [repository(index_b, pn) for pn in (1500, 1600, 1700)]
    # A repository the node still holds outside its range (a move's leftover), and one
    # not ready: neither is a target.
    repository(index_a, 1800)
    repository(index_b, 1900, state=Repository.State.PENDING)

    response = admin_client.get(routing_url(enabled.root_namespace_id))

    assert response.status_code == 200
    body = response.json()
    root = enabled.root_namespace_id
    assert body["search_enabled"] is True and body["reason"] is None
    assert body["version"] == 2
    assert body["traversal_ids_prefix"] == f"^{root}-"
    assert body["proxy"] == {
        "node_id": second.id,
        "search_base_url": "http://zoekt-b:6070",
        "url": "http://zoekt-b:6070/webserver/api/v2/search",
    }
    assert body["forward_to"] == [
        {
            "endpoint": "http://zoekt-a:6070",
            "node_id": first.id,
            "node_name": "zoekt-a",
            "replica_id": replica.id,
            "project_namespace_id_ranges": [[None, 1000]],
            "projects": 2,
        },
        {
            "endpoint": "http://zoekt-b:6070",
            "node_id": second.id,
            "node_name": "zoekt-b",
            "replica_id": replica.id,
            "project_namespace_id_ranges": [[1001, None]],
            "projects": 3,
        },
    ]
    assert body["targets"] == {
        str(first.id): sorted(r.project_id for r in low),
        str(second.id): sorted(r.project_id for r in high),
    }
    assert body["targets_omitted"] is None


def test_no_target_no_routing(admin_client):
    body = admin_client.get(routing_url(424242)).json()
    assert body["search_enabled"] is False
    assert body["reason"] == "namespace_not_enabled"
    assert body["forward_to"] == [] and body["proxy"] is None and body["targets"] == {}


def test_over_gitlabs_cap_the_targets_map_is_left_out(admin_client, enabled, monkeypatch):  # noqa: F811
    index = ready_replica(enabled, search_node("zoekt-a")).indices.get()
    for pn in range(601, 605):
        repository(index, pn)
    monkeypatch.setattr(search_routing, "MAX_TARGET_PROJECTS", 3)
    body = admin_client.get(routing_url(enabled.root_namespace_id)).json()
    assert body["targets"] is None
    assert body["targets_omitted"] == "more than 3 projects (4)"
    assert body["forward_to"][0]["projects"] == 4


def test_anonymous_callers_are_refused(client):
    assert client.get(routing_url(1)).status_code == 401


def test_the_old_search_plan_path_is_gone(admin_client):
    response = admin_client.get("/api/v1/namespaces/1/search_plan")
    assert response.status_code == 404
    assert list(response.json()["errors"]) == ["path"]
