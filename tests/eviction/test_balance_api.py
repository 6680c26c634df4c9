"""``GET /api/v1/balance`` and the balance metrics: the fleet's convergence to its desired
balance as data (the same report as ``zoekt_balance --json``), staff only, in a fixed number
of queries, and read-only."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from eviction import rebalance
from tests.api.test_operator_api import make_user
from tests.dashboard.test_metrics import scrape
from tests.eviction.test_balance_data import full_fleet, run
from tests.eviction.test_manual_moves import snapshot
from tests.eviction.test_rebalance import one_index_on
from tests.factories import GIB, NodeFactory
from zoekt import app_settings
from zoekt.models import Node
from zoekt.reasons import Reason

pytestmark = pytest.mark.django_db

URL = "/api/v1/balance"


def assert_fixed(count) -> None:
    """``count()`` (the queries of one read) on a joining fleet with two moves in flight,
    and again with four more nodes of three indices each: the same."""
    full_fleet()
    rebalance.run_rebalance()
    count()  # the settings, once cached
    small = count()
    for k in range(4):
        holder = NodeFactory(total_bytes=100 * GIB, used_bytes=(20 + 10 * k) * GIB)
        for _ in range(3):
            one_index_on(holder, 5)
    assert count() == small


def test_the_balance_reports_per_node_figures_the_moves_and_the_reconciler(api):
    nodes = full_fleet()
    before = snapshot()

    response = api.get(URL)

    assert response.status_code == 200
    body = response.json()
    assert snapshot() == before
    assert body["converged"] is False
    assert body["misplaced_count"] == len(body["misplaced_index_ids"]) == 8
    assert body["bytes_to_move"] == 80 * GIB
    assert body["busiest_over_lower_bound"]["now"]["ratio"] == pytest.approx(70 / 42, rel=1e-3)
    assert body["busiest_over_lower_bound"]["desired"]["ratio"] == pytest.approx(50 / 42, rel=1e-3)
    by_node = {entry["node_id"]: entry for entry in body["nodes"]}
    assert by_node[nodes[0].id]["now"]["index_count"] == 7
    assert by_node[nodes[0].id]["desired"]["index_count"] == 4
    assert by_node[nodes[3].id]["now"]["disk_share"] == 0.0
    assert by_node[nodes[3].id]["desired"]["disk_share"] == pytest.approx(0.4)
    assert body["moves"][0]["reason"] == Reason.REBALANCE_BUSIEST_NODE
    assert body["reconciler"] == {
        "enabled": True,
        "margin": 0.05,
        "max_moves": 2,
        "standing_aside": False,
        "standing_aside_reason": None,
        "standing_aside_for": None,
        "moves_in_flight": 0,
        "moves_building": 0,
        "move_ids_in_flight": [],
        "settling_node_ids": [],
    }
    assert body["last_24_hours"]["moves"] == 0
    assert body["last_24_hours"]["redundant_moves"] == 0
    # One function: the command's JSON is the same report.
    assert json.loads(run("--json")) == body


def test_the_report_follows_the_reconciler_as_it_moves_and_stands_aside(api):
    nodes = full_fleet()
    started = rebalance.run_rebalance()["started"]

    body = api.get(URL).json()

    assert body["reconciler"]["moves_in_flight"] == 2
    assert body["reconciler"]["moves_building"] == 2
    assert body["reconciler"]["move_ids_in_flight"] == started
    assert body["last_24_hours"]["moves"] == 2
    assert body["last_24_hours"]["moves_by_state"] == {"building": 2}
    Node.objects.filter(pk=nodes[1].pk).update(used_bytes=90 * GIB)
    aside = api.get(URL).json()["reconciler"]
    assert aside["standing_aside"] is True
    assert aside["standing_aside_reason"] == Reason.REBALANCE_NODE_OVER_HIGH_WATERMARK
    assert aside["standing_aside_for"]["node_ids"] == [nodes[1].id]


def test_with_the_reconciler_off_the_report_says_so(api):
    full_fleet()
    app_settings.update(zoekt_rebalance_enabled=False)

    reconciler = api.get(URL).json()["reconciler"]

    assert reconciler["enabled"] is False and reconciler["standing_aside"] is False


def test_without_credentials_it_is_401_and_for_a_non_staff_user_403(now):
    full_fleet()
    assert APIClient().get(URL).status_code == 401
    member = APIClient()
    token = Token.objects.create(user=make_user("dev", staff=False))
    member.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    response = member.get(URL)
    assert response.status_code == 403
    assert "error" in response.json()


def test_the_report_is_read_in_a_fixed_number_of_queries(api):
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert api.get(URL).status_code == 200
        return len(queries)

    assert_fixed(count)


@pytest.mark.usefixtures("prometheus_on_loopback")
def test_the_balance_metrics_are_the_reports_figures(client, now):
    full_fleet()
    rebalance.run_rebalance()
    report = rebalance.balance_report()[2]

    samples = scrape(client)

    def value(name: str, **labels) -> float:
        return samples[name][tuple(sorted(labels.items()))]

    assert value("zoekt_control_balance_converged") == 0
    assert value("zoekt_control_balance_indices_misplaced") == report["misplaced_count"]
    assert value("zoekt_control_balance_bytes_to_move") == report["bytes_to_move"]
    bounds = report["busiest_over_lower_bound"]
    assert value("zoekt_control_balance_busiest_over_lower_bound", when="now") == pytest.approx(
        bounds["now"]["ratio"]
    )
    assert value(
        "zoekt_control_balance_busiest_over_lower_bound", when="converged"
    ) == pytest.approx(bounds["desired"]["ratio"])
    assert value("zoekt_control_rebalance_enabled") == 1
    assert value("zoekt_control_rebalance_moves_in_flight") == 2
    assert value("zoekt_control_rebalance_moves_last_24h") == 2
    assert value("zoekt_control_rebalance_redundant_moves_last_24h") == 0
    assert "zoekt_control_rebalance_standing_aside" not in samples


@pytest.mark.usefixtures("prometheus_on_loopback")
def test_the_metrics_say_why_the_reconciler_stands_aside(client, now):
    nodes = full_fleet()
    Node.objects.filter(pk=nodes[0].pk).update(used_bytes=80 * GIB)

    samples = scrape(client)

    reason = (("reason", Reason.REBALANCE_NODE_OVER_HIGH_WATERMARK.value),)
    assert samples["zoekt_control_rebalance_standing_aside"] == {reason: 1}


@pytest.mark.usefixtures("prometheus_on_loopback")
def test_the_scrape_reads_the_balance_in_a_fixed_number_of_queries(client, now):
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(reverse("metrics")).status_code == 200
        return len(queries)

    assert_fixed(count)


# --- the dashboard's Balance page ------------------------------------------------------------


def test_the_balance_page_shows_the_reports_figures(admin_client, now):
    nodes = full_fleet()
    rebalance.run_rebalance()
    report = rebalance.balance_report()[2]

    html = admin_client.get(reverse("dashboard-balance")).content.decode()

    assert 'data-figure="converged"><span class="value"><span class="warn">no</span>' in html
    assert f'data-figure="misplaced"><span class="value">{report["misplaced_count"]}<' in html
    ratio = report["busiest_over_lower_bound"]["desired"]["ratio"]
    assert f"{ratio:.2f}×" in html
    assert 'data-enabled="true" data-standing-aside=""' in html
    assert "2 rebalance moves in flight (2 building" in html
    first = report["moves"][0]
    assert f'<tr data-index-id="{first["index_id"]}">' in html
    row = html.split(f'<tr data-node-id="{nodes[3].id}">')[1].split("</tr>")[0]
    # A joining node: one replacement building on it, four indices when converged.
    assert '<td class="num indices">1 → 4</td>' in row


def test_the_balance_page_says_why_the_reconciler_stands_aside(admin_client, now):
    nodes = full_fleet()
    Node.objects.filter(pk=nodes[2].pk).update(used_bytes=80 * GIB)

    html = admin_client.get(reverse("dashboard-balance")).content.decode()

    assert 'data-standing-aside="rebalance_node_over_high_watermark"' in html
    assert f"rebalance node over high watermark (nodes {nodes[2].id})" in html


def test_a_converged_fleet_has_no_move_left_on_the_page(admin_client, now):
    for used in (40, 41, 42):
        one_index_on(NodeFactory(total_bytes=100 * GIB, used_bytes=used * GIB), used)

    html = admin_client.get(reverse("dashboard-balance")).content.decode()

    assert 'data-figure="converged"><span class="value"><span class="ok">yes</span>' in html
    assert "No move is needed: the fleet is at its desired balance." in html
