"""Node history: sampled once per node per interval, pruned past the retention, drawn per node."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from config.celery import BEAT_SCHEDULE
from dashboard import charts, history, views
from dashboard.beat import DASHBOARD_BEAT
from dashboard.models import NodeSample
from dashboard.tasks import record_node_history_task
from tests.dashboard.builders import GIB, build_fleet
from tests.factories import NodeFactory
from zoekt import app_settings, clock, memory
from zoekt.models import Node

pytestmark = pytest.mark.django_db

INTERVAL = history.SAMPLE_INTERVAL_SECONDS


def sample(node: Node, at: datetime, **figures) -> NodeSample:
    values = {"used_bytes": 10 * GIB, "total_bytes": 100 * GIB, "indexed_bytes": 5 * GIB}
    values.update(figures)
    return NodeSample.objects.create(node=node, sampled_at=history.bucket(at), **values)


def statements(function, **kwargs) -> tuple[object, int]:
    with CaptureQueriesContext(connection) as captured:
        result = function(**kwargs)
    return result, len(captured)


# --- buckets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "expected"),
    [
        (datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC), datetime(2026, 3, 1, 12, 0, tzinfo=UTC)),
        (datetime(2026, 3, 1, 12, 4, 59, tzinfo=UTC), datetime(2026, 3, 1, 12, 0, tzinfo=UTC)),
        (datetime(2026, 3, 1, 12, 5, 0, tzinfo=UTC), datetime(2026, 3, 1, 12, 5, tzinfo=UTC)),
    ],
    ids=["on the boundary", "just before the next", "the next"],
)
def test_a_sample_is_stamped_with_the_start_of_its_interval(at, expected):
    assert history.bucket(at) == expected


# --- sampling ---------------------------------------------------------------------------


def test_sampling_writes_one_row_per_node_with_its_disk_and_memory(now):
    fleet = build_fleet(3, 3)
    assert history.sample_nodes() == 3
    report = {row.node_id: row for row in memory.node_memory_report()}
    rows = {row.node_id: row for row in NodeSample.objects.all()}
    assert set(rows) == {node.id for node in fleet.nodes}
    for node in fleet.nodes:
        row, m = rows[node.id], report[node.id]
        assert row.sampled_at == history.bucket(now)
        assert (row.used_bytes, row.total_bytes, row.indexed_bytes) == (
            node.used_bytes,
            node.total_bytes,
            node.indexed_bytes,
        )
        assert row.rss_bytes == node.metadata["process_health"]["webserver"]["rss_bytes"]
        assert row.estimated_memory_bytes == m.estimated_memory_bytes > 0
        assert row.memory_budget_bytes == m.memory_budget_bytes == 8 * GIB


def test_a_second_run_in_the_same_interval_writes_nothing_more(now):
    (node,) = build_fleet(1, 1).nodes
    history.sample_nodes()
    Node.objects.filter(id=node.id).update(used_bytes=90 * GIB)
    clock.advance(INTERVAL - 1)
    assert history.sample_nodes() == 1
    (row,) = NodeSample.objects.all()
    assert (row.sampled_at, row.used_bytes) == (history.bucket(now), node.used_bytes)

    Node.objects.filter(id=node.id).update(last_seen_at=clock.advance(1))
    history.sample_nodes()
    assert list(NodeSample.objects.order_by("sampled_at").values_list("used_bytes", flat=True)) == [
        node.used_bytes,
        90 * GIB,
    ]


def test_a_node_not_seen_within_the_interval_is_not_sampled(now):
    fleet = build_fleet(2, 1)
    Node.objects.filter(id=fleet.nodes[1].id).update(last_seen_at=now - timedelta(seconds=INTERVAL))
    history.sample_nodes()
    assert list(NodeSample.objects.values_list("node_id", flat=True)) == [fleet.nodes[0].id]


def test_a_node_that_is_not_a_search_node_is_sampled_without_memory(now):
    node = NodeFactory(services=[], used_bytes=30 * GIB)
    history.sample_nodes()
    (row,) = NodeSample.objects.filter(node=node)
    assert row.used_bytes == 30 * GIB
    assert (row.rss_bytes, row.estimated_memory_bytes, row.memory_budget_bytes) == (
        None,
        None,
        None,
    )


def test_sampling_with_no_node_seen_writes_nothing(now):
    app_settings.current()  # warm: the settings cache
    assert statements(history.sample_nodes) == (0, 1)
    assert not NodeSample.objects.exists()


def test_sampling_takes_the_same_statements_for_3_and_for_30_nodes(now):
    build_fleet(3, 3)
    app_settings.current()  # warm: the settings cache
    _, small = statements(history.sample_nodes)
    Node.objects.update(last_seen_at=clock.advance(INTERVAL))
    build_fleet(27, 27)
    sampled, large = statements(history.sample_nodes)
    assert sampled == 30
    # the nodes, their memory (three), one insert
    assert small == large == 5
    assert NodeSample.objects.count() == 33


def test_deleting_a_node_deletes_its_samples(now):
    fleet = build_fleet(2, 0)
    history.sample_nodes()
    fleet.nodes[0].delete()
    assert list(NodeSample.objects.values_list("node_id", flat=True)) == [fleet.nodes[1].id]


# --- pruning ----------------------------------------------------------------------------


def test_pruning_drops_the_samples_older_than_the_retention_in_one_statement(now):
    node = NodeFactory()
    retention = timedelta(seconds=history.RETENTION_SECONDS)
    old = sample(node, now - retention - timedelta(seconds=INTERVAL))
    kept = [sample(node, now - retention), sample(node, now)]
    assert statements(history.prune_samples) == (1, 1)
    assert list(NodeSample.objects.order_by("sampled_at").values_list("sampled_at", flat=True)) == [
        row.sampled_at for row in kept
    ]
    assert old.sampled_at < now - retention


def test_pruning_with_nothing_to_prune_deletes_nothing(now):
    node = NodeFactory()
    sample(node, now)
    assert history.prune_samples() == 0
    assert NodeSample.objects.count() == 1


# --- the job and its beat entry ---------------------------------------------------------


def test_the_beat_entry_runs_the_job_every_interval_and_expires_after_it():
    assert BEAT_SCHEDULE["record-node-history"] == DASHBOARD_BEAT["record-node-history"]
    assert BEAT_SCHEDULE["record-node-history"] == {
        "task": "dashboard.record_node_history",
        "schedule": 300.0,
        "options": {"expires": 300},
    }
    assert record_node_history_task.name == "dashboard.record_node_history"


def test_the_job_samples_and_prunes(now):
    fleet = build_fleet(2, 1)
    sample(fleet.nodes[0], now - timedelta(days=30))
    assert record_node_history_task() == {"nodes_sampled": 2, "samples_pruned": 1}
    assert NodeSample.objects.filter(sampled_at=history.bucket(now)).count() == 2
    assert NodeSample.objects.count() == 2


# --- the node page ----------------------------------------------------------------------


def fill(node: Node, now: datetime, hours: int, **figures) -> None:
    """Samples every interval over the last ``hours``, disk use rising."""
    steps = hours * 3600 // INTERVAL
    NodeSample.objects.bulk_create(
        NodeSample(
            node=node,
            sampled_at=history.bucket(now) - timedelta(seconds=INTERVAL * (steps - i)),
            used_bytes=(20 + 60 * i // steps) * GIB,
            total_bytes=100 * GIB,
            indexed_bytes=5 * GIB,
            rss_bytes=(2 + i % 3) * GIB,
            estimated_memory_bytes=3 * GIB,
            memory_budget_bytes=8 * GIB,
            **figures,
        )
        for i in range(steps + 1)
    )


def test_the_node_page_draws_disk_and_memory_over_the_retained_period(admin_client, now):
    (node,) = build_fleet(1, 1).nodes
    fill(node, now, hours=48)
    response = admin_client.get(reverse("dashboard-node", args=[node.id]))
    assert response.status_code == 200
    html = response.content.decode()
    disk = re.search(r'<div id="disk-history">(.*?)</div>', html, re.S).group(1)
    mem = re.search(r'<div id="memory-history">(.*?)</div>', html, re.S).group(1)
    assert disk.count('data-series="disk used"') == 1
    assert disk.count('stroke-dasharray="3,2"') == 3  # the watermarks
    assert "disk used: last 80% (03-01 12:00), peak 80%" in disk
    assert disk.count("<circle") == 0  # one unbroken line
    assert re.search(r'<path d="M[^M"]+"[^>]*data-series="disk used"', disk)
    for name in ("RSS", "estimated", "budget"):
        assert f'data-series="{name}"' in mem
    assert "estimated: last 3.0\u00a0GiB" in mem
    # the figures beside the chart: the latest sample and one row per day
    assert "80.0%" in re.search(r'data-figure="disk".*?</div>', html, re.S).group(0)
    assert len(re.findall(r'<tr data-day="', html)) == 3
    assert f'href="{reverse("admin:zoekt_node_change", args=[node.id])}"' in html


def test_the_node_page_keeps_only_one_point_per_pixel(admin_client, now):
    (node,) = build_fleet(1, 1).nodes
    fill(node, now, hours=21 * 24)
    html = admin_client.get(reverse("dashboard-node", args=[node.id])).content.decode()
    path = re.search(r'<path d="([^"]+)"[^>]*data-series="disk used"', html).group(1)
    assert NodeSample.objects.count() == 21 * 24 * 12 + 1
    assert len(path.split()) <= views.NODE_CHART_WIDTH


def test_the_node_page_breaks_the_line_where_no_sample_came(now):
    start = now - timedelta(hours=2)
    points = [(start + timedelta(minutes=5 * i), 0.5) for i in range(5)]
    points += [(now - timedelta(minutes=5 * i), 0.6) for i in range(3, -1, -1)]
    svg = charts.time_series(
        [("disk used", charts.INDEXED, points)],
        start=start,
        end=now,
        y_max=1.0,
        y_label=lambda value: f"{value:.0%}",
        gap_seconds=2.5 * INTERVAL,
        label="disk",
    )
    path = re.search(r'<path d="([^"]+)"', svg).group(1)
    assert path.count("M") == 2


def test_the_node_page_without_samples_says_so(admin_client, now):
    node = NodeFactory()
    response = admin_client.get(reverse("dashboard-node", args=[node.id]))
    assert response.status_code == 200
    assert 'id="no-history"' in response.content.decode()
    assert 'id="disk-history"' not in response.content.decode()


def test_the_node_page_for_an_unknown_node_is_404(admin_client):
    assert admin_client.get(reverse("dashboard-node", args=[10**9])).status_code == 404


def test_the_node_page_is_for_staff_only(client):
    response = client.get(reverse("dashboard-node", args=[1]))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_the_node_page_takes_the_same_statements_for_a_day_and_for_three_weeks(admin_client, now):
    fleet = build_fleet(3, 3)
    fill(fleet.nodes[0], now, hours=24)
    fill(fleet.nodes[1], now, hours=21 * 24)

    def count(node: Node) -> int:
        url = reverse("dashboard-node", args=[node.id])
        admin_client.get(url)  # warm: settings cache, session
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(url).status_code == 200
        return len(captured)

    # the session and user (3), the node, its samples, its row of the fleet page
    # (fleet_overview: 19), its indices with their namespaces (1)
    assert count(fleet.nodes[0]) == count(fleet.nodes[1]) == count(fleet.nodes[2]) == 25


# --- the fleet page ---------------------------------------------------------------------


def fleet_row(response, node: Node) -> str:
    html = response.content.decode()
    return re.search(rf'<tr data-node-id="{node.id}".*?</tr>', html, re.S).group(0)


def test_the_fleet_page_links_each_node_name_to_its_history(admin_client, now):
    fleet = build_fleet(2, 1)
    response = admin_client.get(reverse("dashboard-fleet"))
    for node in fleet.nodes:
        href = reverse("dashboard-node", args=[node.id])
        assert re.search(
            rf'<td class="name"><a href="{href}"[^>]*>{node.name}</a>', fleet_row(response, node)
        )


def test_the_fleet_page_draws_a_days_disk_sparkline_for_each_sampled_node(admin_client, now):
    sampled, unsampled = build_fleet(2, 1).nodes
    fill(sampled, now, hours=30)
    response = admin_client.get(reverse("dashboard-fleet"))
    spark = fleet_row(response, sampled)
    assert spark.count('class="chart sparkline"') == 1
    # one point per hour of the last day, peak of each hour: 80% in the last
    path = re.search(r'<path d="([^"]+)"', spark.split('class="chart sparkline"')[1]).group(1)
    assert path.startswith("M") and path.count("M") == 1
    assert 24 <= len(path.split()) <= 25
    assert "last 80.0%" in spark
    assert 'class="chart sparkline"' not in fleet_row(response, unsampled)


def test_the_fleet_pages_statements_do_not_grow_with_the_samples(admin_client, now):
    fleet = build_fleet(3, 3)
    url = reverse("dashboard-fleet")

    def count() -> int:
        admin_client.get(url)
        with CaptureQueriesContext(connection) as captured:
            admin_client.get(url)
        return len(captured)

    before = count()
    for node in fleet.nodes:
        fill(node, now, hours=24)
    assert count() == before


# --- a node that just registered, and what its page shows -------------------------------


def test_a_node_is_sampled_when_it_registers(
    client, now, monkeypatch, django_capture_on_commit_callbacks
):
    from dashboard.tasks import sample_node_task
    from eviction.tasks import rebalance_fleet_task
    from tests.api.helpers import NodeAPI

    monkeypatch.setattr(rebalance_fleet_task, "apply_async", lambda *args, **kwargs: None)
    monkeypatch.setattr(
        sample_node_task, "apply_async", lambda args, **kwargs: sample_node_task.run(*args)
    )
    api = NodeAPI(client)
    with django_capture_on_commit_callbacks(execute=True):
        assert api.heartbeat("3f0c51e4-5a8a-4e4f-9a35-53f1a1e8b0c1").status_code == 200
    node = Node.objects.get()
    assert list(NodeSample.objects.values_list("node_id", "sampled_at")) == [
        (node.id, history.bucket(now))
    ]
    html = admin_client_page(client, node)
    assert "No sample" not in html
    # One sample is a dot that can be seen, not a 2 px speck.
    assert re.search(r'<circle [^>]*r="3.5"[^>]*data-series="disk used"', html)


def admin_client_page(client, node: Node) -> str:
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("root", password="x"))
    return client.get(reverse("dashboard-node", args=[node.id])).content.decode()


def test_the_node_page_shows_state_indices_namespaces_and_tasks(admin_client, now):
    fleet = build_fleet(3, 3)
    node = fleet.nodes[0]
    Node.objects.filter(pk=node.pk).update(
        high_watermark_exceeded_at=now - timedelta(hours=1, minutes=5)
    )
    html = admin_client.get(reverse("dashboard-node", args=[node.id])).content.decode()
    text = " ".join(re.sub(r"<[^>]+>", " ", re.sub(r"<svg.*?</svg>", "", html, flags=re.S)).split())
    held = list(node.indices.order_by("id").values_list("id", flat=True))
    assert held
    shown = sorted(int(i) for i in re.findall(r'<tr data-index-id="(\d+)"', html))
    assert shown == held
    assert "online" in text and "searchable" in text
    assert "over high 1 h 5 min" in text
    assert "tasks pending / processing / failed" in text
    roots = {i.zoekt_enabled_namespace.root_namespace_id for i in node.indices.all()}
    for root in roots:
        assert reverse("dashboard-namespace", args=[root]) in html
