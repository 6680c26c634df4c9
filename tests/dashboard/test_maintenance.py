"""Node maintenance on the operator's surfaces: the fleet page marks nodes being restarted
or drained, the Maintenance page lists the shutdown records live and recent, ``/metrics``
counts them and the bytes left to drain, and ``zoekt_info`` has a section."""

from __future__ import annotations

import io
import json
import math
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard.templatetags.zoekt_dashboard import duration
from tests.dashboard.builders import GIB, build_fleet
from tests.dashboard.test_pages import cell, page_text, row_html
from zoekt import clock
from zoekt.admin import human_bytes
from zoekt.models import Index, Move, NodeShutdown

pytestmark = pytest.mark.django_db

Status = NodeShutdown.Status


def shutdown(node, type_="restart", **fields) -> NodeShutdown:
    now = clock.now()
    values = {
        "node": node,
        "node_ref": node.id,
        "node_name": node.name,
        "type": type_,
        "reason": "kernel upgrade",
        "requested_by": "alice",
        "requested_at": now - timedelta(minutes=5),
        **fields,
    }
    if type_ == "restart":
        values.setdefault("allowed_delay_seconds", 1800)
        values.setdefault("delay_expires_at", values["requested_at"] + timedelta(seconds=1800))
    return NodeShutdown.objects.create(**values)


def drain_scene(now):
    """Three nodes: zoekt-0 restarting (25 minutes of its delay left), zoekt-1 draining
    with one move in flight off it, zoekt-2 in service; and two ended records."""
    fleet = build_fleet(3, 3)
    restarting, draining, spare = sorted(fleet.nodes, key=lambda node: node.name)
    restart = shutdown(restarting)
    drain = shutdown(draining, "remove", reason="decommission", requested_by="bob")
    held = list(Index.objects.filter(zoekt_node=draining).order_by("id"))
    moving = held[0]
    Move.objects.create(
        trigger="drain",
        state=Move.State.BUILDING,
        zoekt_enabled_namespace=moving.zoekt_enabled_namespace,
        namespace_id=moving.namespace_id,
        source_node=draining,
        target_node=spare,
        source_index_ref=moving.id,
        bytes=moving.used_storage_bytes,
        details={"shutdown_id": drain.id},
        building_at=now - timedelta(hours=1),
    )
    # One move of this drain is done: 1 GiB in the hour since its first move started.
    Move.objects.create(
        trigger="drain",
        state=Move.State.DONE,
        zoekt_enabled_namespace=moving.zoekt_enabled_namespace,
        namespace_id=moving.namespace_id,
        source_node=draining,
        target_node=spare,
        source_index_ref=10**9,
        bytes=GIB,
        details={"shutdown_id": drain.id},
        building_at=now - timedelta(minutes=50),
        done_at=now - timedelta(minutes=10),
    )
    done = shutdown(spare, requested_at=now - timedelta(hours=3))
    done.transition(Status.COMPLETE, now - timedelta(hours=2), status_reason="node_returned")
    cancelled = shutdown(spare, requested_at=now - timedelta(hours=1))
    cancelled.transition(Status.CANCELLED, now - timedelta(minutes=50), cancelled_by="carol")
    return {
        "nodes": (restarting, draining, spare),
        "records": (restart, drain, done, cancelled),
        "held": held,
    }


def test_the_fleet_page_marks_nodes_in_maintenance_with_what_is_left(admin_client, now):
    scene = drain_scene(now)
    restarting, draining, spare = scene["nodes"]
    held_bytes = sum(index.used_storage_bytes for index in scene["held"])
    response = admin_client.get(reverse("dashboard-fleet"))
    assert response.status_code == 200

    assert cell(row_html(response, "data-node-id", restarting.id), "name") == (
        f"{restarting.name} restarting: 25 min left"
    )
    assert cell(row_html(response, "data-node-id", draining.id), "name") == (
        f"{draining.name} draining: {len(scene['held'])} indices, "
        f"{' '.join(_size(held_bytes).split())} left"
    )
    assert cell(row_html(response, "data-node-id", spare.id), "name") == spare.name
    figure = re.search(
        r'data-figure="in-maintenance"><span class="value">(.*?)</span>', _html(response)
    )
    assert re.sub(r"<[^>]+>", "", figure.group(1)) == "2"


def test_the_maintenance_page_lists_live_records_then_recent_ones(admin_client, now):
    scene = drain_scene(now)
    restart, drain, done, cancelled = scene["records"]
    response = admin_client.get(reverse("dashboard-maintenance"))
    assert response.status_code == 200
    html = _html(response)

    restart_row = row_html(response, "data-shutdown-id", restart.id)
    assert cell(restart_row, "type") == "restart"
    assert cell(restart_row, "left") == "25 min of the delay"
    assert cell(restart_row, "duration") == "5 min"
    drain_row = row_html(response, "data-shutdown-id", drain.id)
    held_bytes = sum(index.used_storage_bytes for index in scene["held"])
    # 1 GiB moved in the hour since the first move started: the bytes left at that rate.
    eta = math.ceil(held_bytes / (GIB / 3600))
    assert cell(drain_row, "left").endswith(
        f"; 1 move in flight; about {duration(eta)} to go at the rate so far"
    )
    assert cell(drain_row, "left").startswith(f"{len(scene['held'])} indices, ")
    done_row = row_html(response, "data-shutdown-id", done.id)
    assert cell(done_row, "status") == "complete node returned"
    assert cell(done_row, "duration") == "1 h"
    assert cell(row_html(response, "data-shutdown-id", cancelled.id), "status") == (
        "cancelled by carol"
    )
    # Live first (oldest request first), then the ended ones, newest first.
    order = [int(i) for i in re.findall(r'data-shutdown-id="(\d+)"', html)]
    assert order == [restart.id, drain.id, cancelled.id, done.id]
    assert html.index("shutdowns-live") < html.index("shutdowns-recent")
    assert "restart, in progress" in page_text(response)


def test_the_maintenance_page_with_no_record(admin_client, now):
    response = admin_client.get(reverse("dashboard-maintenance"))
    assert response.status_code == 200
    text = page_text(response)
    assert "No node is in maintenance." in text
    assert "No shutdown record has ended yet." in text


def test_metrics_count_nodes_in_shutdown_and_the_bytes_left_to_drain(admin_client, now):
    scene = drain_scene(now)
    _restarting, draining, _spare = scene["nodes"]
    metrics = admin_client.get(reverse("metrics")).content.decode()

    def value(line: str) -> float:
        match = re.search(rf"^{re.escape(line)} (\S+)$", metrics, flags=re.M)
        assert match, line
        return float(match.group(1))

    assert value('zoekt_control_nodes_in_shutdown{status="in_progress",type="restart"}') == 1
    assert value('zoekt_control_nodes_in_shutdown{status="in_progress",type="remove"}') == 1
    assert value('zoekt_control_nodes_in_shutdown{status="stalled",type="replace"}') == 0
    labels = f'{{zoekt_node_id="{draining.id}",zoekt_node_name="{draining.name}"}}'
    held = scene["held"]
    assert value(f"zoekt_control_node_drain_bytes_left{labels}") == sum(
        index.used_storage_bytes for index in held
    )
    assert value(f"zoekt_control_node_drain_indices_left{labels}") == len(held)
    assert value(f"zoekt_control_node_drain_moves_in_flight{labels}") == 1
    # Only draining nodes have a drain series.
    assert metrics.count("zoekt_control_node_drain_bytes_left{") == 1


def test_zoekt_info_has_a_node_maintenance_section(now):
    scene = drain_scene(now)
    restarting, draining, _spare = scene["nodes"]
    out = io.StringIO()
    call_command("zoekt_info", "--no-extended", stdout=out, no_color=True)
    text = out.getvalue()
    section = " ".join(text[text.index("Node maintenance") : text.index("GitLab")].split())
    assert "Nodes in maintenance: 2" in section
    assert f"{restarting.name}: restart, in progress: 25 min of the delay left" in section
    assert f"{draining.name}: remove, in progress: {len(scene['held'])} indices, " in section
    assert ", 1 move in flight (record " in section

    out = io.StringIO()
    call_command("zoekt_info", "--json", "--no-extended", stdout=out)
    data = json.loads(out.getvalue())["node_maintenance"]
    assert data["nodes_in_maintenance"] == 2
    by_type = {record["type"]: record for record in data["live"]}
    assert by_type["restart"]["delay_seconds_left"] == 25 * 60
    assert by_type["restart"]["left_bytes"] is None
    assert by_type["remove"]["left_bytes"] == sum(i.used_storage_bytes for i in scene["held"])
    assert by_type["remove"]["moves_in_flight"] == 1
    assert by_type["remove"]["eta_seconds"] == math.ceil(
        by_type["remove"]["left_bytes"] / (GIB / 3600)
    )
    assert by_type["remove"]["requested_at"] == (now - timedelta(minutes=5)).isoformat()


def test_maintenance_queries_do_not_grow_with_the_records(admin_client, now):
    def queries(url: str) -> int:
        admin_client.get(url)
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(url).status_code == 200
        return len(captured)

    def count() -> tuple[int, int]:
        return queries(reverse("dashboard-maintenance")), queries(reverse("dashboard-fleet"))

    def records(nodes) -> None:
        for i, node in enumerate(nodes):
            old = shutdown(node, requested_at=now - timedelta(hours=2))
            old.transition(Status.CANCELLED, now - timedelta(hours=1), cancelled_by="ops")
            shutdown(node, "remove" if i % 2 else "restart")

    small = build_fleet(2, 2)
    records([small.nodes[0], small.nodes[1]])
    before = count()
    large = build_fleet(30, 30)
    records(large.nodes)
    assert count() == before


def _html(response) -> str:
    return response.content.decode()


def _size(value: int) -> str:
    return human_bytes(value)


def test_a_drain_mark_needs_no_target(admin_client, now):
    fleet = build_fleet(2, 1)
    node = fleet.nodes[0]
    shutdown(node, "replace", target_node=fleet.nodes[1], status=Status.STALLED)
    row = row_html(admin_client.get(reverse("dashboard-fleet")), "data-node-id", node.id)
    assert cell(row, "name").startswith(f"{node.name} draining to {fleet.nodes[1].name}: ")
    assert cell(row, "name").endswith("left (stalled)")
