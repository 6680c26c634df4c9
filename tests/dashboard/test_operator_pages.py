"""What an operator tripped on in the dashboard (issue: the fleet, namespaces, namespace and
plan pages): node order, memory use and its watermarks, split namespaces, memory estimates,
the plan that placed a namespace, and filters that do not silently show everything."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.urls import reverse

from planner.models import RolloutPlan
from planner.rollout import RolloutService
from tests.dashboard.builders import GIB, build_fleet, unplaced_namespace
from tests.dashboard.test_pages import cell, page_text, row_html, size
from tests.factories import NamespaceRootStorageStatisticsFactory, NodeFactory
from zoekt import app_settings, clock, memory
from zoekt.models import EnabledNamespace, Index, Node

pytestmark = pytest.mark.django_db


def _rows(html: str, attribute: str) -> list[str]:
    return re.findall(rf'<tr [^>]*\b{attribute}="([^"]+)"', html)


# --- fleet ---------------------------------------------------------------------------


def test_fleet_rows_are_ordered_by_name_with_digits_compared_as_numbers(admin_client, now):
    for name in ("zoekt-10", "zoekt-2", "zoekt-0", "alpha", "zoekt-1"):
        NodeFactory(metadata={"name": name}, last_seen_at=now)
    html = admin_client.get(reverse("dashboard-fleet")).content.decode()
    assert _rows(html, "data-node-name") == ["alpha", "zoekt-0", "zoekt-1", "zoekt-2", "zoekt-10"]


def _with_budget(budget: int) -> None:
    row = app_settings.load_row()
    row.zoekt_node_memory_budget_bytes = budget
    row.save()


def test_fleet_shows_memory_used_with_its_watermark_and_draws_the_watermarks(admin_client, now):
    _with_budget(16 * GIB)
    fleet = build_fleet(2, 1)
    hot, calm = fleet.nodes
    for node, rss in ((hot, 13 * GIB), (calm, 4 * GIB)):
        # No memory limit reported: the configured budget (source A) applies.
        health = {**node.metadata["process_health"]["webserver"], "rss_bytes": rss}
        del health["memory_limit_bytes"]
        Node.objects.filter(pk=node.pk).update(
            metadata={**node.metadata, "process_health": {"webserver": health}}
        )
    response = admin_client.get(reverse("dashboard-fleet"))
    hot_row = row_html(response, "data-node-id", hot.id)
    # 13 GiB of the 16 GiB budget: 81.2 %, over the high memory watermark (75 %).
    assert cell(hot_row, "memory-percent") == "81.2% high, takes no new index"
    assert "memory-percent wm-high" in hot_row
    assert cell(row_html(response, "data-node-id", calm.id), "memory-percent") == "25.0% normal"
    # The three memory watermarks as dashed marks at their share of the budget, on the
    # page's common scale (the largest figure drawn: the 16 GiB budget here).
    svg = re.search(r'<svg[^>]*class="chart memory".*?</svg>', hot_row, flags=re.S).group(0)
    width = float(re.search(r'width="(\d+)"', svg).group(1))
    marks = re.findall(r'<line x1="([\d.]+)"[^>]*stroke-dasharray', svg)
    scale = max(16 * GIB, 13 * GIB) / width  # the budget, the largest RSS
    expected = [limit * 16 * GIB / scale for limit in memory.memory_watermark_limits()]
    assert [float(x) for x in marks] == pytest.approx(expected, abs=0.1)
    assert "memory watermarks 60% / 75% / 85% of the budget" in page_text(response)


def test_fleet_without_a_budget_draws_no_memory_watermark(admin_client, now):
    node = build_fleet(1, 1).nodes[0]
    health = {**node.metadata["process_health"]["webserver"]}
    del health["memory_limit_bytes"]  # neither a setting (A) nor a reported limit (B)
    Node.objects.filter(pk=node.pk).update(
        metadata={**node.metadata, "process_health": {"webserver": health}}
    )
    row = row_html(admin_client.get(reverse("dashboard-fleet")), "data-node-id", node.id)
    assert cell(row, "memory-percent") == "no budget"
    svg = re.search(r'<svg[^>]*class="chart memory".*?</svg>', row, flags=re.S).group(0)
    assert "stroke-dasharray" not in svg


def test_fleet_names_the_observed_ratios_as_zoekt_info_does(admin_client, now):
    node = build_fleet(2, 2).nodes[0]
    report = {row.node_id: row for row in memory.node_memory_report()}[node.id]
    row = row_html(admin_client.get(reverse("dashboard-fleet")), "data-node-id", node.id)
    # The main figure is the one the header names (RSS per repository byte, what the
    # memory ratio setting estimates); RSS ÷ used storage is the smaller line under it.
    per_repo = re.search(r'<span class="rss-per-repository-byte"[^>]*>([\d.]+)<', row)
    shown = re.search(r'class="quiet observed-memory-ratio"[^>]*>([\d.]+) ÷ used<', row).group(1)
    assert "RSS per repo byte" in page_text(admin_client.get(reverse("dashboard-fleet")))
    assert shown == f"{report.observed_memory_ratio:.3f}"
    assert per_repo.group(1) == f"{report.rss_per_repository_byte:.3f}"
    assert report.observed_memory_ratio != pytest.approx(report.rss_per_repository_byte)
    out = io.StringIO()
    call_command("zoekt_info", stdout=out)
    text = out.getvalue()
    assert f"{shown} (RSS / used storage of ready indices" in text
    assert f"{per_repo.group(1)} (RSS / repository of ready indices" in text


def test_fleet_counts_split_namespaces_and_links_to_them(admin_client, now):
    build_fleet(2, 3)  # each namespace: one replica of two indices on two nodes
    whole = build_fleet(1, 1).namespaces[0]  # one index
    assert Index.objects.filter(zoekt_enabled_namespace=whole).count() == 1
    response = admin_client.get(reverse("dashboard-fleet"))
    figure = re.search(r'data-figure="split-namespaces">(.*?)</div>', response.content.decode())
    assert "?filter=split" in figure.group(1)
    assert re.search(r">3</a>", figure.group(1))


# --- namespaces ----------------------------------------------------------------------------


def test_namespaces_split_filter_sorts_and_memory_estimate(admin_client, now):
    split = build_fleet(2, 2).namespaces
    whole = build_fleet(1, 1).namespaces[0]
    for enabled, repository_size in ((split[0], 3 * GIB), (split[1], 9 * GIB), (whole, GIB)):
        NamespaceRootStorageStatisticsFactory(
            namespace_id=enabled.root_namespace_id, repository_size=repository_size
        )
    no_statistics = unplaced_namespace("no-statistics", ())
    url = reverse("dashboard-namespaces")
    ratio = app_settings.current().memory_ratio

    response = admin_client.get(url)
    row = row_html(response, "data-namespace-id", split[1].root_namespace_id)
    assert cell(row, "memory") == size(memory.estimate_memory_bytes(9 * GIB, ratio))
    assert cell(row, "per-replica") == "2 (split)"
    assert (
        cell(row_html(response, "data-namespace-id", whole.root_namespace_id), "per-replica") == "1"
    )
    row = row_html(response, "data-namespace-id", no_statistics.root_namespace_id)
    assert cell(row, "memory") == "no statistics"

    only_split = _rows(
        admin_client.get(url, {"filter": "split"}).content.decode(), "data-namespace-id"
    )
    assert only_split == [str(e.root_namespace_id) for e in split]

    by_memory = _rows(
        admin_client.get(url, {"sort": "memory"}).content.decode(), "data-namespace-id"
    )
    assert by_memory == [
        str(e.root_namespace_id) for e in (split[1], split[0], whole, no_statistics)
    ]
    by_split = _rows(admin_client.get(url, {"sort": "split"}).content.decode(), "data-namespace-id")
    assert by_split[:2] == [str(e.root_namespace_id) for e in split]
    # Sort and filter together, and the pager keeps both.
    both = admin_client.get(url, {"sort": "memory", "filter": "split"}).content.decode()
    assert _rows(both, "data-namespace-id") == [
        str(split[1].root_namespace_id),
        str(split[0].root_namespace_id),
    ]


def test_namespaces_sort_by_used_storage_takes_the_largest_replica(admin_client, now):
    fleet = build_fleet(2, 3)
    Index.objects.filter(zoekt_enabled_namespace=fleet.namespaces[2]).update(
        used_storage_bytes=50 * GIB
    )
    order = _rows(
        admin_client.get(reverse("dashboard-namespaces"), {"sort": "used"}).content.decode(),
        "data-namespace-id",
    )
    assert order[0] == str(fleet.namespaces[2].root_namespace_id)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"filter": "splt"}, "filter"),
        ({"sort": "size"}, "sort"),
        ({"filter": "split", "sort": "x"}, "sort"),
    ],
)
def test_an_unknown_filter_or_sort_is_a_400_that_names_it(admin_client, now, params, field):
    build_fleet(2, 2)
    response = admin_client.get(reverse("dashboard-namespaces"), params)
    assert response.status_code == 400
    text = page_text(response)
    assert f"The {field} {params[field]} is not known" in text
    assert "<tr data-namespace-id=" not in response.content.decode()


# --- namespace -----------------------------------------------------------------------------


def test_namespace_page_shows_its_memory_estimate_and_the_plan_that_placed_it(admin_client, now):
    build_fleet(2, 0)
    enabled = unplaced_namespace("placed", (2 * GIB, 3 * GIB))
    RolloutService().execute(dry_run=True, batch_size=10)  # a dry run places nothing
    RolloutService().execute(dry_run=False, batch_size=10)
    plan = RolloutPlan.objects.filter(dry_run=False).order_by("-id").first()
    response = admin_client.get(reverse("dashboard-namespace", args=[enabled.root_namespace_id]))
    html = response.content.decode()
    placed = re.search(r'data-figure="placed-by">(.*?)</div>', html, flags=re.S).group(1)
    assert f'href="{reverse("dashboard-plan", args=[plan.id])}"' in placed
    assert f"plan #{plan.id}" in placed
    ratio = app_settings.current().memory_ratio
    estimate = re.search(r'data-figure="memory-estimate">(.*?)</div>', html, flags=re.S).group(1)
    assert size(memory.estimate_memory_bytes(5 * GIB, ratio)) in " ".join(
        re.sub(r"<[^>]+>", " ", estimate).split()
    )
    # Per index: the repository bytes of the projects in its range × the ratio.
    index = Index.objects.get(zoekt_enabled_namespace=enabled)
    row = row_html(response, "data-index-id", index.id)
    assert cell(row, "memory") == size(memory.estimate_memory_bytes(5 * GIB, ratio))


def test_namespace_page_says_when_the_placing_plan_is_no_longer_kept(admin_client, now):
    enabled = build_fleet(2, 1).namespaces[0]  # placed without a rollout
    text = page_text(
        admin_client.get(reverse("dashboard-namespace", args=[enabled.root_namespace_id]))
    )
    assert "the plan that placed it is not among the last 50" in text


# --- plan ----------------------------------------------------------------------------------


def test_plan_page_lists_every_candidate_and_memory_beside_disk(admin_client, now):
    _with_budget(64 * GIB)
    fleet = build_fleet(3, 0)
    unplaced_namespace("small", (GIB,))
    RolloutService(record_decisions=True).execute(dry_run=True, batch_size=10)
    plan = RolloutPlan.objects.order_by("-id").first()
    assert plan.summary["memory"] is True
    response = admin_client.get(reverse("dashboard-plan", args=[plan.id]))
    html = response.content.decode()
    listed = _rows(html, "data-plan-node")
    assert sorted(listed) == sorted(node.name for node in fleet.nodes)
    assert len(listed) == plan.summary["nodes_available"] == 3
    placed = [node for node in plan.plan["nodes"]]
    assert len(placed) == 1
    row = row_html(response, "data-plan-node", placed[0]["name"])
    assert "disk-utilisation" in row and "memory-utilisation" in row
    before = placed[0]["unclaimed_memory_bytes_before"]
    claimed = before - placed[0]["unclaimed_memory_bytes_after"]
    assert cell(row, "memory-utilisation") == f"{claimed / before * 100:.1f}%"
    others = [name for name in listed if name != placed[0]["name"]]
    for name in others:
        assert "no index placed on it in this plan" in row_html(response, "data-plan-node", name)
    assert "1 of 3 receive indices" in page_text(response)


def test_plan_page_without_memory_shows_disk_only_and_names_cooling_nodes(admin_client, now):
    fleet = build_fleet(3, 0)
    cooling = fleet.nodes[2]
    Node.objects.filter(pk=cooling.pk).update(
        eviction_cooldown_until=clock.now() + timedelta(hours=3)
    )
    unplaced_namespace("small", (GIB,))
    RolloutService(record_decisions=True).execute(dry_run=True, batch_size=10)
    plan = RolloutPlan.objects.order_by("-id").first()
    response = admin_client.get(reverse("dashboard-plan", args=[plan.id]))
    html = response.content.decode()
    assert "memory-utilisation" not in html
    assert cooling.name not in _rows(html, "data-plan-node")
    note = re.search(r'<p id="plan-cooling">(.*?)</p>', html, flags=re.S).group(1)
    assert cooling.name in note
    assert EnabledNamespace.objects.count() == 1


# --- moves -----------------------------------------------------------------------------


def test_moves_page_lists_moves_in_flight_and_recent_with_their_durations(admin_client, now):
    from zoekt.models import Move

    fleet = build_fleet(2, 2)
    source, target = fleet.nodes
    live = Move.objects.create(
        trigger="node_level",
        state=Move.State.BUILDING,
        zoekt_enabled_namespace=fleet.namespaces[0],
        namespace_id=fleet.namespaces[0].root_namespace_id,
        source_node=source,
        target_node=target,
        source_index_ref=fleet.indices[0].id,
        bytes=3 * GIB,
        created_at=clock.now() - timedelta(minutes=42),
    )
    parked = Move.objects.create(
        trigger="negative_unclaimed",
        state=Move.State.PARKED,
        reason="move_deadline_passed",
        zoekt_enabled_namespace=fleet.namespaces[1],
        namespace_id=fleet.namespaces[1].root_namespace_id,
        source_node=target,
        source_index_ref=fleet.indices[2].id,
        bytes=GIB,
        created_at=clock.now() - timedelta(hours=5),
        parked_at=clock.now() - timedelta(hours=1),
    )
    response = admin_client.get(reverse("dashboard-moves"))
    assert response.status_code == 200
    live_row = row_html(response, "data-move-id", live.id)
    assert cell(live_row, "duration") == "42 min"
    assert (cell(live_row, "source"), cell(live_row, "target")) == (source.name, target.name)
    parked_row = row_html(response, "data-move-id", parked.id)
    assert cell(parked_row, "state") == "parked move deadline passed"
    assert cell(parked_row, "duration") == "4 h"
    html = response.content.decode()
    assert (
        html.index("moves-live")
        < html.index(f'data-move-id="{live.id}"')
        < html.index("moves-recent")
        < html.index(f'data-move-id="{parked.id}"')
    )
    metrics = admin_client.get(reverse("metrics")).content.decode()
    assert 'zoekt_control_moves{state="building"} 1.0' in metrics
    assert 'zoekt_control_moves{reason="move_deadline_passed",state="parked"} 1.0' in metrics
    moving = re.search(r"^zoekt_control_moving_bytes (\S+)$", metrics, flags=re.M)
    assert float(moving.group(1)) == 3 * GIB


def test_move_durations_are_a_histogram_by_trigger(admin_client, now):
    from zoekt.models import Move

    fleet = build_fleet(1, 3)
    for minutes, enabled, index in zip((20, 50, 300), fleet.namespaces, fleet.indices, strict=True):
        Move.objects.create(
            trigger="node_level",
            state=Move.State.DONE,
            zoekt_enabled_namespace=enabled,
            namespace_id=enabled.root_namespace_id,
            source_index_ref=index.id,
            created_at=clock.now() - timedelta(minutes=minutes),
            done_at=clock.now(),
        )
    metrics = admin_client.get(reverse("metrics")).content.decode()

    def bucket(le: str) -> float:
        name = "zoekt_control_move_duration_seconds_bucket"
        labels = f'{{le="{re.escape(le)}",trigger="node_level"}}'
        line = re.search(rf"^{name}{labels} (\S+)$", metrics, flags=re.M)
        return float(line.group(1))

    assert (bucket("600.0"), bucket("1800.0"), bucket("3600.0"), bucket("14400.0")) == (0, 1, 2, 2)
    assert bucket("28800.0") == bucket("+Inf") == 3
    total = re.search(
        r'^zoekt_control_move_duration_seconds_sum{trigger="node_level"} (\S+)$', metrics, re.M
    )
    assert float(total.group(1)) == (20 + 50 + 300) * 60


def test_sizes_on_one_fleet_row_share_one_unit(admin_client, now):
    # The estimate is a few hundred MiB, RSS and the budget are GiB: on one row, all in GiB.
    node = build_fleet(1, 1).nodes[0]
    report = {row.node_id: row for row in memory.node_memory_report()}[node.id]
    assert report.estimated_memory_bytes < GIB <= report.rss_bytes
    row = row_html(admin_client.get(reverse("dashboard-fleet")), "data-node-id", node.id)
    for column in ("estimated", "rss", "budget", "reserved", "unclaimed", "total"):
        assert cell(row, column).split()[1] == "GiB", (column, cell(row, column))
    assert cell(row, "estimated").startswith(f"{report.estimated_memory_bytes / GIB:.1f}")


def test_every_time_a_page_shows_says_it_is_utc(admin_client, now, dry_run_plan):
    fleet = build_fleet(3, 2)
    plan = dry_run_plan((10**6,))
    Node.objects.filter(pk=fleet.nodes[0].pk).update(
        high_watermark_exceeded_at=now, eviction_cooldown_until=now + timedelta(hours=2)
    )
    EnabledNamespace.objects.update(last_rollout_failed_at=now)
    pages = [
        reverse("dashboard-fleet"),
        reverse("dashboard-plans"),
        reverse("dashboard-plan", args=[plan.id]),
        reverse("dashboard-namespaces"),
        reverse("dashboard-namespace", args=[fleet.namespaces[0].root_namespace_id]),
        reverse("dashboard-evictions"),
        reverse("dashboard-node", args=[fleet.nodes[0].id]),
    ]
    stamped = 0
    for url in pages:
        text = page_text(admin_client.get(url))
        bare = re.findall(r"\b\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d)?(?![:\d]| UTC)", text)
        assert bare == [], (url, bare)
        stamped += len(re.findall(r"\d\d:\d\d(?::\d\d)? UTC", text))
    assert stamped >= len(pages)


def test_used_over_reserved_on_an_index_row_shares_one_unit(admin_client, now):
    fleet = build_fleet(2, 1)
    index = Index.objects.filter(zoekt_enabled_namespace=fleet.namespaces[0]).order_by("id")[0]
    Index.objects.filter(pk=index.pk).update(
        used_storage_bytes=300 * 1024**2, reserved_storage_bytes=GIB
    )
    for url in (
        reverse("dashboard-namespace", args=[fleet.namespaces[0].root_namespace_id]),
        reverse("dashboard-node", args=[index.zoekt_node_id]),
    ):
        row = row_html(admin_client.get(url), "data-index-id", index.id)
        assert "0.3 GiB / 1.0 GiB" in " ".join(re.sub(r"<[^>]+>", " ", row).split()), url
