"""``manage.py zoekt_capacity`` and ``GET /api/v1/capacity``: the provisioning status from
the node history and a what-if on a copy, read-only, bad input a 400 naming the field."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from dashboard.models import NodeSample
from tests.api.test_operator_api import make_user
from tests.eviction.test_balance_data import full_fleet
from tests.eviction.test_manual_moves import snapshot
from tests.factories import GIB, ProjectFactory
from zoekt.models import EnabledNamespace, Index

pytestmark = pytest.mark.django_db

URL = "/api/v1/capacity"


@pytest.fixture
def api(now) -> APIClient:
    client = APIClient()
    user = make_user("ops-alice", staff=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def grew(nodes, now, *, per_day_gib: float, days: int = 6) -> None:
    """A day's sample of every node for the last ``days`` days, the fleet growing
    ``per_day_gib`` a day (spread over the nodes holding data) up to what they hold now."""
    holding = [node for node in nodes if node.used_bytes > 0]
    for d in range(days + 1):
        for node in nodes:
            behind = per_day_gib * (days - d) / len(holding) if node in holding else 0
            used = node.used_bytes - int(behind * GIB)
            NodeSample.objects.create(
                node=node,
                sampled_at=now - timedelta(days=days - d),
                used_bytes=used,
                total_bytes=node.total_bytes,
                indexed_bytes=used,
            )


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("zoekt_capacity", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_status_forecast_and_crossing_come_from_the_history(now):
    nodes = full_fleet()  # 210 GiB on 5 × 100 GiB
    grew(nodes, now, per_day_gib=3)
    before = snapshot()
    report = json.loads(run("--json"))
    assert snapshot() == before
    assert report["fleet"]["nodes"] == 5
    assert report["growth"]["used_bytes_per_day"] == pytest.approx(3 * GIB, rel=1e-3)
    by_days = {h["days"]: h for h in report["horizons"]}
    assert by_days[0]["nodes_needed"] == 4  # 210 ÷ 60
    # One node fewer still holds 210 GiB + 10 % under the low watermark.
    assert by_days[0]["status"] == "OVER_PROVISIONED"
    assert by_days[0]["recommendation"].startswith("1 node of 100 GiB disk could be removed")
    assert by_days[30]["nodes_needed"] == 5  # 300 ÷ 60
    assert by_days[30]["status"] == "RIGHT_SIZED"
    assert by_days[90]["status"] == "UNDER_PROVISIONED"  # 480 ÷ 60 = 8
    assert by_days[90]["nodes_needed"] == 8
    assert report["low_watermark"][0]["days"] == pytest.approx(30.0, rel=1e-3)
    text = run()
    assert "Provisioning: OVER_PROVISIONED" in text
    assert "UNDER_PROVISIONED" in text and "add 3 nodes" in text
    assert "Low watermark (60%) on disk: now 42.0%, in 30.0 days" in text


def test_the_what_if_runs_on_a_copy_and_writes_nothing(now):
    nodes = full_fleet()
    before = snapshot()
    report = json.loads(run("--json", "--add-nodes", "2"))
    assert snapshot() == before
    w = report["what_if"]
    assert w["change"]["add_nodes"] == 2
    assert len(w["nodes"]) == 7
    added = [n for n in w["nodes"] if n["before"] is None]
    assert len(added) == 2 and all(n["after"]["index_count"] > 0 for n in added)
    assert w["bytes_to_move"] == sum(m["bytes"] for m in w["moves"]) > 0
    assert w["provisioning_after"]["fleet"]["nodes"] == 7
    text = run("--add-nodes", "2")
    assert "What if: add 2 nodes. Nothing was written." in text
    # Removing a node: its indices go elsewhere.
    gone = json.loads(run("--json", "--remove", str(nodes[0].id)))["what_if"]
    moved = [m for m in gone["moves"] if m["reason"] == "what_if_node_removed"]
    assert len(moved) + len(gone["unplaced"]) == 7
    assert len({m["index_id"] for m in gone["moves"]}) == len(gone["moves"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--add-nodes", "-1"], "--add-nodes: must be at least 0"),
        (["--replicas", "0"], "--replicas: must be at least 1"),
        (["--add-nodes", "1", "--disk-gib", "0"], "--disk-gib: must be above 0"),
        (["--remove", "99999"], "remove[0]: node 99999 is not in the fleet"),
    ],
)
def test_the_command_refuses_bad_options(now, args, message):
    full_fleet()
    with pytest.raises(CommandError, match=message.replace("[", r"\[").replace("]", r"\]")):
        run(*args)


def test_the_api_serves_the_same_report_and_a_what_if(api, now):
    nodes = full_fleet()
    grew(nodes, now, per_day_gib=3)
    before = snapshot()
    response = api.get(URL)
    assert response.status_code == 200
    assert snapshot() == before
    assert response.json()["horizons"] == json.loads(run("--json"))["horizons"]
    assert response.json()["what_if"] is None
    what_if = api.get(URL, {"add_nodes": 2, "disk_gib": 200, "remove": [nodes[4].id]})
    assert what_if.status_code == 200
    body = what_if.json()["what_if"]
    assert body["change"] == {
        "add_nodes": 2,
        "disk_bytes": 200 * GIB,
        "memory_budget_bytes": None,
        "remove_node_ids": [nodes[4].id],
        "replicas": None,
    }
    assert len(body["nodes"]) == 7


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"add_nodes": "two"}, "add_nodes"),
        ({"add_nodes": -1}, "add_nodes"),
        ({"replicas": 0}, "replicas"),
        ({"disk_gib": "x", "add_nodes": 1}, "disk_gib"),
        ({"window_days": 0}, "window_days"),
        ({"remove": "abc"}, "remove"),
        ({"remove": 99999}, "remove"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(api, now, query, field):
    full_fleet()
    before = snapshot()
    response = api.get(URL, query)
    # A node to remove that does not exist is a 404 (the schema cannot know the ids).
    assert response.status_code == (404 if query == {"remove": 99999} else 400)
    assert field in json.dumps(response.json()["errors"])
    assert snapshot() == before


def test_the_capacity_is_for_staff_only(now):
    assert APIClient().get(URL).status_code == 401


def test_the_capacity_page_shows_the_status_the_horizons_and_the_forecast_chart(admin_client, now):
    nodes = full_fleet()
    grew(nodes, now, per_day_gib=3)
    response = admin_client.get(reverse("dashboard-capacity"))
    assert response.status_code == 200
    text = response.content.decode()
    assert 'data-figure="status"' in text and "OVER_PROVISIONED" in text
    assert 'data-days="90"' in text and "add 3 nodes of 100 GiB disk" in text
    assert "30.0 days" in text  # to the low watermark
    assert 'data-series="forecast"' in text
    assert 'data-series="disk used ÷ disk"' in text
    assert "low watermark 60%" in text


def test_more_replicas_run_the_rollouts_planner_on_a_copy(now):
    nodes = full_fleet()
    for enabled in EnabledNamespace.objects.select_related("root_namespace"):
        ProjectFactory(namespace=enabled.root_namespace, repository_size=2 * GIB)
    before = snapshot()
    w = json.loads(run("--json", "--replicas", "2", "--add-nodes", "2"))["what_if"]
    assert snapshot() == before
    assert len(w["builds"]) == 21
    assert not w["failed_namespaces"]
    # Each new copy holds what the namespace's copy holds, never beside it.
    assert {b["bytes"] for b in w["builds"]} == {10 * GIB}
    holder = dict(Index.objects.values_list("zoekt_enabled_namespace_id", "zoekt_node_id"))
    assert all(b["node_id"] != holder[b["enabled_namespace_id"]] for b in w["builds"])
    after = {n["node_id"]: n["after"] for n in w["nodes"]}
    assert sum(a["used_bytes"] for a in after.values()) == 2 * 210 * GIB
    assert w["provisioning_after"]["fleet"]["replicas"] == 2
    assert {n.id for n in nodes} < set(after)
