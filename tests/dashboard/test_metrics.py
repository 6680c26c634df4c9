"""Prometheus /metrics: GitLab's names where GitLab has them, ours otherwise, read at scrape."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from tests.dashboard.builders import build_fleet
from zoekt import memory
from zoekt.models import Index, Node, Replica, Repository, Task

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("prometheus_on_loopback")]


def scrape(client, **headers) -> dict[str, dict[tuple, float]]:
    response = client.get(reverse("metrics"), **headers)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def by_node(samples: dict[tuple, float], key: str = "zoekt_node_id") -> dict[int, float]:
    return {int(dict(labels)[key]): value for labels, value in samples.items()}


def test_node_metrics_match_the_database(client, now):
    fleet = build_fleet(3, 3)
    Node.objects.filter(pk=fleet.nodes[2].pk).update(last_seen_at=now.replace(year=2025))
    metrics = scrape(client)
    nodes = {node.id: node for node in Node.objects.with_unclaimed_storage_bytes()}
    assert by_node(metrics["search_zoekt_nodes_status"]) == {
        node_id: (1.0 if node.is_online() else 0.0) for node_id, node in nodes.items()
    }
    assert by_node(metrics["search_zoekt_node_storage_percent_used"]) == {
        node_id: node.storage_percent_used for node_id, node in nodes.items()
    }
    assert by_node(metrics["search_zoekt_node_unclaimed_storage_bytes"]) == {
        node_id: node.unclaimed_storage_bytes for node_id, node in nodes.items()
    }
    searchable = set(Node.objects.searchable().values_list("id", flat=True))
    assert by_node(metrics["zoekt_control_node_searchable"]) == {
        node_id: (1.0 if node_id in searchable else 0.0) for node_id in nodes
    }
    report = {row.node_id: row for row in memory.node_memory_report()}
    assert by_node(metrics["zoekt_control_node_estimated_memory_bytes"]) == {
        node_id: row.estimated_memory_bytes for node_id, row in report.items()
    }
    assert by_node(metrics["zoekt_control_node_observed_memory_bytes"]) == {
        node_id: row.rss_bytes for node_id, row in report.items()
    }
    assert by_node(metrics["zoekt_control_node_shards_loaded"]) == {
        node_id: row.shards_loaded for node_id, row in report.items()
    }
    labels = dict(next(iter(metrics["search_zoekt_nodes_status"])))
    assert set(labels) == {"zoekt_node_id", "zoekt_node_name"}


def test_counts_by_state_match_the_database(client, now):
    build_fleet(3, 4)
    Index.objects.filter(pk=Index.objects.order_by("id").first().pk).update(
        state=Index.State.PENDING
    )
    metrics = scrape(client)

    def states(name: str) -> dict[str, float]:
        return {dict(labels)["state"]: value for labels, value in metrics[name].items()}

    assert states("search_zoekt_indices_states")["pending"] == 1
    assert states("search_zoekt_indices_states")["ready"] == Index.objects.count() - 1
    assert states("search_zoekt_repositories_states_total")["ready"] == Repository.objects.count()
    assert states("zoekt_control_replicas_states") == {
        "pending": 0,
        "ready": Replica.objects.count(),
    }
    assert states("zoekt_control_tasks_states")["pending"] == Task.objects.count()
    per_node_tasks = sum(
        value
        for labels, value in metrics["search_zoekt_node_tasks"].items()
        if dict(labels)["state"] == "pending"
    )
    assert per_node_tasks == Task.objects.count()
    assert sum(metrics["search_zoekt_task_processing_queue_size"].values()) == Task.objects.count()
    assert by_node(metrics["search_zoekt_node_enabled_namespaces"], "node_id") == {
        node.id: Index.objects.filter(zoekt_node=node).values("zoekt_enabled_namespace").count()
        for node in Node.objects.all()
    }


def test_namespaces_dark_to_search_are_counted_by_reason(client, now):
    fleet = build_fleet(3, 3)
    assert scrape(client)["zoekt_control_namespaces_dark"] == {
        (("reason", "no_ready_replica"),): 0.0,
        (("reason", "no_searchable_replica"),): 0.0,
    }
    Node.objects.filter(pk=fleet.nodes[2].pk).update(last_seen_at=now.replace(year=2025))
    Index.objects.filter(pk=fleet.indices[0].pk).update(state=Index.State.PENDING)
    assert scrape(client)["zoekt_control_namespaces_dark"] == {
        (("reason", "no_ready_replica"),): 1.0,
        (("reason", "no_searchable_replica"),): 2.0,
    }


def test_repositories_behind_their_nodes_schema_version_are_counted(client, now):
    fleet = build_fleet(2, 2)
    Node.objects.filter(pk=fleet.nodes[0].pk).update(schema_version=3)
    metrics = scrape(client)
    behind = Repository.objects.filter(zoekt_index__zoekt_node=fleet.nodes[0]).count()
    (labels, value), *_ = metrics["search_zoekt_repositories_schema_version_count"].items()
    assert dict(labels)["target_schema_version"] == "3"
    assert dict(labels)["zoekt_node_id"] == str(fleet.nodes[0].id)
    assert value == behind


# --- who may scrape: closed in production, open in development ---------------------------------


@pytest.fixture
def closed(settings):
    """Production mode with neither a token nor an allowed network configured."""
    settings.DEBUG = False
    settings.ZOEKT_METRICS_TOKEN = None
    settings.ZOEKT_METRICS_ALLOWED_NETWORKS = []
    return settings


def refusal(response, status: int, field: str) -> None:
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    assert list(response.json()["errors"]) == [field]
    assert b"search_zoekt" not in response.content


def test_metrics_are_open_in_development(client, closed, now):
    closed.DEBUG = True
    assert scrape(client)


def test_metrics_refuse_an_anonymous_scrape_in_production_with_403_when_no_token_could_help(
    client, closed, now
):
    refusal(client.get(reverse("metrics")), 403, "client")


def test_metrics_need_the_bearer_token_when_one_is_set(client, closed, now):
    closed.ZOEKT_METRICS_TOKEN = "s3cret-token"
    url = reverse("metrics")
    refused = client.get(url)
    refusal(refused, 401, "authorization")
    assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    refusal(client.get(url, HTTP_AUTHORIZATION="Bearer wrong"), 401, "authorization")
    refusal(client.get(url, HTTP_AUTHORIZATION="Basic s3cret-token"), 401, "authorization")
    assert scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-token")


def test_a_token_set_in_development_is_still_needed(client, closed, now):
    closed.DEBUG = True
    closed.ZOEKT_METRICS_TOKEN = "s3cret-token"
    refusal(client.get(reverse("metrics")), 401, "authorization")
    assert scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-token")


@pytest.mark.parametrize(
    "address",
    ["10.1.2.3", "fd00::7"],
    ids=["ipv4", "ipv6"],
)
def test_metrics_answer_a_scrape_from_an_allowed_network(client, closed, now, address):
    closed.ZOEKT_METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8", "fd00::/8"]
    assert scrape(client, REMOTE_ADDR=address)


def test_a_forwarded_address_does_not_let_a_scrape_in(client, closed, now):
    closed.ZOEKT_METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    response = client.get(
        reverse("metrics"),
        REMOTE_ADDR="203.0.113.9",
        HTTP_X_FORWARDED_FOR="10.1.2.3",
        HTTP_FORWARDED="for=10.1.2.3",
    )
    refusal(response, 403, "client")


def test_metrics_answer_a_staff_session_and_refuse_another_user(client, closed, now):
    user = get_user_model().objects.create_user("viewer", password="pw-12345678")
    client.force_login(user)
    refusal(client.get(reverse("metrics")), 403, "client")
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    assert scrape(client)


def test_metrics_only_answer_get(client):
    assert client.post(reverse("metrics")).status_code == 405
