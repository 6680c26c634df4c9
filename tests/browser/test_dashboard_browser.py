"""An operator logs in through the admin and reads each dashboard page in Chromium.

Every figure checked on screen is read from the database first (see
``conftest``: no ORM call while the browser is open), and each page is
saved as a screenshot under the test's tmp dir; ``docs/screenshots/`` is
written only by ``make screenshots``, and otherwise left as it was.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User

from dashboard import history
from dashboard.models import NodeSample
from eviction import actions as eviction
from eviction.models import EvictionDecision
from planner.models import RolloutPlan
from planner.rollout import RolloutService
from tests.browser.conftest import (
    DOCS_SCREENSHOTS,
    PASSWORD,
    VIEWPORT,
    chromium_page,
    log_in,
    page_width,
    photograph,
    refreshing,
)
from tests.dashboard.builders import build_fleet, unplaced_namespace
from zoekt import app_settings, clock, memory, shutdowns
from zoekt.admin import human_bytes
from zoekt.models import EnabledNamespace, Index, Move, Node, NodeShutdown, Project, Replica
from zoekt.search_targets import dark_namespaces

# Fixed ids and a fixed plan time keep the screenshots the same from run to run.
pytestmark = pytest.mark.django_db(transaction=True, reset_sequences=True)

PLANNED_AT = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
GIB = 1024**3
# Links that lead nowhere: (path, status, the tab it belongs to, what the page says).
DEAD_ENDS = [
    ("/admin/dashboard/namespaces/999999/", 404, "namespaces", "no namespace 999999"),
    ("/admin/dashboard/nodes/999999/", 404, "fleet", "There is no node with id 999999"),
    ("/admin/dashboard/nodes/named/zoekt-99/", 404, "fleet", "No node is called zoekt-99"),
    ("/admin/dashboard/plans/999999/", 404, "plans", "only the last 50 plans are kept"),
    ("/admin/dashboard/namespaces/?filter=bogus", 400, "namespaces", "The filter bogus"),
    ("/admin/dashboard/namespaces/?sort=bogus", 400, "namespaces", "The sort bogus"),
    ("/admin/dashboard/namespaces/?page=999", 404, "namespaces", "There is no page 999"),
    ("/admin/dashboard/namespaces/?page=abc", 400, "namespaces", "The page abc is not"),
    ("/admin/dashboard/namespaces/?page=-1", 400, "namespaces", "The page -1 is not"),
    ("/admin/dashboard/moves/?page=2", 404, "moves", "There is no page 2"),
    ("/admin/dashboard/audit/?via=telnet", 400, "audit", "The via telnet is not known"),
    ("/admin/dashboard/audit/?since=yesterday", 400, "audit", "The since yesterday"),
]
# The Dashboard box on the admin's front page, in the order of the dashboard's tabs.
DASHBOARD_PAGES = [
    "Fleet",
    "Rollout plans",
    "Namespaces",
    "Evictions",
    "Moves",
    "Maintenance",
    "Balance",
    "Capacity",
    "GitLab",
    "Audit",
]


def seed() -> dict:
    """A fleet of 8 nodes (one offline, one unhealthy), 12 namespaces, one dry-run plan,
    and one run of node-level eviction: zoekt-7 (90 %) evicted from at once and cooling
    down, zoekt-5 (78 %, over high for 3 h 12 min) waiting out its sustain period."""
    # Seen an hour ahead: the live server reads the real clock, and the nodes
    # must stay online however long the browser takes.
    ahead = clock.now() + timedelta(hours=1)
    fleet = build_fleet(nodes=8, namespaces=12, seen_at=ahead)
    offline, unhealthy = fleet.nodes[6], fleet.nodes[7]
    Node.objects.filter(pk=offline.pk).update(last_seen_at=clock.now() - timedelta(hours=2))
    metadata = dict(unhealthy.metadata)
    metadata["process_health"]["webserver"]["restarts_15m"] = 5
    Node.objects.filter(pk=unhealthy.pk).update(metadata=metadata)

    fits = unplaced_namespace("newcomer", (300 * 1024**2, 200 * 1024**2))
    too_big = unplaced_namespace("monorepo", (900 * GIB,))
    RolloutService(record_decisions=True).execute(dry_run=True, batch_size=100)
    plan = RolloutPlan.objects.get()
    RolloutPlan.objects.filter(pk=plan.pk).update(created_at=PLANNED_AT)
    plan.refresh_from_db()

    app_settings.update(zoekt_node_level_eviction_enabled=True)
    waiting, hot = fleet.nodes[5], fleet.nodes[7]
    Node.objects.filter(pk=waiting.pk).update(
        used_bytes=78 * GIB, high_watermark_exceeded_at=clock.now() - timedelta(hours=3, minutes=12)
    )
    Node.objects.filter(pk=hot.pk).update(
        high_watermark_exceeded_at=clock.now() - timedelta(minutes=20)
    )
    eviction.run_node_level()
    decisions = list(EvictionDecision.objects.order_by("-last_seen_at", "-id"))
    hot.refresh_from_db()

    # zoekt-7's decision moved its indices (moves are on by default): one in flight.
    move = Move.objects.select_related("source_node", "target_node").live().order_by("id")[0]
    live_moves = Move.objects.live().count()

    # Two days of node history for zoekt-0, disk use rising, RSS swinging around the estimate.
    sampled = fleet.nodes[0]
    last = history.bucket(clock.now())
    steps = 2 * 24 * 3600 // history.SAMPLE_INTERVAL_SECONDS
    NodeSample.objects.bulk_create(
        NodeSample(
            node=sampled,
            sampled_at=last - timedelta(seconds=history.SAMPLE_INTERVAL_SECONDS * (steps - i)),
            used_bytes=(20 + 50 * i // steps) * GIB,
            total_bytes=100 * GIB,
            indexed_bytes=5 * GIB,
            rss_bytes=(2 + (i // 24) % 3) * GIB,
            estimated_memory_bytes=3 * GIB,
            memory_budget_bytes=8 * GIB,
        )
        for i in range(steps + 1)
    )

    # zoekt-6 is offline for a restart its operator announced; zoekt-1 came back from one.
    restart = shutdowns.do_request_node_shutdown(
        offline.id, type="restart", reason="kernel upgrade", requested_by="alice"
    )
    earlier = shutdowns.do_request_node_shutdown(
        fleet.nodes[1].id,
        type="restart",
        reason="indexer upgrade",
        requested_by="bob",
        now=clock.now() - timedelta(hours=5),
    )
    earlier.transition(
        NodeShutdown.Status.COMPLETE,
        clock.now() - timedelta(hours=4, minutes=48),
        status_reason="node_returned",
    )

    user = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))

    nodes = list(Node.objects.order_by("id"))
    searchable = set(Node.objects.searchable().values_list("id", flat=True))
    created = {ns["namespace_id"]: ns for ns in plan.plan["create"]}
    failed = {ns["namespace_id"]: ns for ns in plan.plan["failures"]}
    names = {node.id: node.name for node in nodes}
    placed_on = names[created[fits.root_namespace_id]["replicas"][0]["indices"][0]["node_id"]]
    detail_ns = fleet.namespaces[0]
    detail_indices = list(
        Index.objects.filter(zoekt_enabled_namespace=detail_ns)
        .order_by("id")
        .select_related("zoekt_node")
    )
    return {
        "nodes": [
            {
                "name": node.name,
                "percent": f"{node.used_bytes / node.total_bytes * 100:.1f}%",
                "online": node.is_online(clock.now()),
                "searchable": node.id in searchable,
            }
            for node in nodes
        ],
        "online": sum(1 for node in nodes if node.is_online(clock.now())),
        "searchable": len(searchable),
        "enabled_namespaces": EnabledNamespace.objects.count(),
        "dark": str(sum(len(ids) for ids in dark_namespaces().values())),
        "replicas_ready": Replica.objects.filter(state=Replica.State.READY).count(),
        "plan_id": plan.id,
        "fits": fits.root_namespace_id,
        "fits_node": placed_on,
        "too_big": too_big.root_namespace_id,
        "too_big_error": failed[too_big.root_namespace_id]["errors"][0]["type"],
        "plan_failures": len(plan.plan["failures"]),
        "plan_create": len(plan.plan["create"]),
        "detail_root": detail_ns.root_namespace_id,
        "detail_index_ids": [index.id for index in detail_indices],
        "detail_nodes": sorted({index.zoekt_node.name for index in detail_indices}),
        "over_high": [waiting.name, hot.name],
        "cooling": [hot.name],
        "cooling_until": f"{hot.eviction_cooldown_until:%Y-%m-%d %H:%M} UTC",
        "node_order": sorted((node.name for node in nodes), key=lambda n: int(n.split("-")[1])),
        "split": str(
            len(
                {
                    enabled_id
                    for enabled_id, replica_id in Index.objects.filter(
                        zoekt_replica__isnull=False
                    ).values_list("zoekt_enabled_namespace_id", "zoekt_replica_id")
                    if Index.objects.filter(zoekt_replica_id=replica_id).count() > 1
                }
            )
        ),
        "plan_candidates": list(plan.summary["node_names"].values()),
        "detail_memory_estimate": human_bytes(
            memory.estimate_memory_bytes(
                sum(
                    p.statistics.repository_size
                    for p in Project.objects.filter(namespace_id=detail_ns.root_namespace_id)
                ),
                app_settings.current().memory_ratio,
            )
        ),
        "restart_id": restart.id,
        "restart_node": offline.name,
        "returned_id": earlier.id,
        "move_id": move.id,
        "move_source": move.source_node.name,
        "move_target": move.target_node.name,
        "live_moves": str(live_moves),
        "sampled_node": sampled.name,
        "sampled_node_id": sampled.id,
        "samples": str(steps + 1),
        "decisions": [
            {
                "id": d.id,
                "node": d.node_name,
                "verdict": "applied" if d.applied_at else "skipped",
                "namespaces": str(d.namespaces_affected),
            }
            for d in decisions
        ],
    }


def docs_screenshots() -> dict[str, str]:
    """The tracked screenshots, by name, with a digest of their bytes."""
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(DOCS_SCREENSHOTS.glob("*.png"))
    }


def text(page, selector: str) -> str:
    return " ".join(page.locator(selector).inner_text().split())


def test_operator_reads_every_dashboard_page(browser_ready, live_server, tmp_path):
    tracked = docs_screenshots()
    expected = seed()
    base = live_server.url
    seen: dict[str, str] = {}
    overflow: dict[str, int] = {}
    seen_problems: list[str] = []
    # From here on: strings only, no ORM (Playwright's loop runs in this thread).
    with chromium_page(tmp_path / "profile") as page:
        log_in(page, base, "operator")
        # --- the admin's front page: the Dashboard box lists every page, one line each --
        links = page.locator("#dashboard-module th a")
        assert [link.inner_text() for link in links.all()] == DASHBOARD_PAGES
        for link in links.all():
            box = link.bounding_box()
            assert box is not None and box["height"] < 24, (link.inner_text(), box)
        photograph(page, tmp_path, "admin-index", overflow)
        page.click("#dashboard-module a:has-text('Fleet')")
        page.wait_for_url(f"{base}/admin/dashboard/")

        # --- fleet ---------------------------------------------------------------
        assert page.locator("#nodes tbody tr").count() == len(expected["nodes"])
        order = [
            row.get_attribute("data-node-name")
            for row in page.locator("#nodes tbody tr[data-node-name]").all()
        ]
        assert order == expected["node_order"]
        for name in expected["node_order"]:
            # Every node reports a memory limit: memory use and its watermark are shown.
            used = text(page, f"#nodes tr[data-node-name='{name}'] td.memory-percent")
            assert re.match(r"\d+\.\d% (normal|low|high|critical)", used), used
        assert text(page, "[data-figure=split-namespaces] .value") == expected["split"]
        assert text(page, "[data-figure=dark-namespaces] .value") == expected["dark"]
        mark = f"#nodes tr[data-node-name='{expected['restart_node']}'] td.name .maintenance-mark"
        assert text(page, mark).startswith("restarting: ")
        for node in expected["nodes"]:
            row = f"#nodes tr[data-node-name='{node['name']}']"
            assert text(page, f"{row} td.name a[href*='/nodes/']") == node["name"]
            assert text(page, f"{row} td.disk-percent") == node["percent"]
            assert text(page, f"{row} td.online") == ("yes" if node["online"] else "no")
            assert text(page, f"{row} td.searchable").startswith(
                "yes" if node["searchable"] else "no"
            )
            assert page.locator(f"{row} svg.chart.disk line").count() == 3  # 60/75/85 %
        assert text(page, "[data-figure=online] .value") == str(expected["online"])
        assert text(page, "[data-figure=searchable] .value") == str(expected["searchable"])
        assert text(page, "[data-figure=enabled-namespaces] .value") == str(
            expected["enabled_namespaces"]
        )
        assert text(page, "[data-figure=replicas] .value").startswith(
            f"{expected['replicas_ready']} /"
        )
        photograph(page, tmp_path, "dashboard-fleet", overflow)

        # --- plans ---------------------------------------------------------------
        page.click(".dashboard-tabs a[data-page=plans]")
        page.wait_for_url(f"{base}/admin/dashboard/plans/")
        row = f"#plans tr[data-plan-id='{expected['plan_id']}']"
        assert text(page, f"{row} td.create") == str(expected["plan_create"])
        assert text(page, f"{row} td.failures") == str(expected["plan_failures"])
        assert "disk:" in text(page, f"{row} td.bounds")
        photograph(page, tmp_path, "dashboard-plans", overflow)
        page.click(f"{row} a")
        page.wait_for_url(f"{base}/admin/dashboard/plans/{expected['plan_id']}/")
        fits = f"#plan-namespaces tr[data-namespace-id='{expected['fits']}']"
        assert text(page, f"{fits} td.action") == "create"
        assert text(page, f"{fits} td.verdict") == "ok"
        assert f"{expected['fits_node']}: took index 1 of planned replica 1" in text(
            page, f"{fits} td.candidates"
        )
        too_big = f"#plan-namespaces tr[data-namespace-id='{expected['too_big']}']"
        verdict = text(page, f"{too_big} td.verdict")
        assert verdict.startswith("failed")
        assert expected["too_big_error"].replace("_", " ") in verdict
        seen["too_big_candidates"] = text(page, f"{too_big} td.candidates")
        listed = [
            row.get_attribute("data-plan-node")
            for row in page.locator("#plan-nodes tr[data-plan-node]").all()
        ]
        assert sorted(listed) == sorted(expected["plan_candidates"])
        assert text(page, "[data-figure=nodes] .value") == str(len(listed))
        photograph(page, tmp_path, "dashboard-plan", overflow)

        # --- namespaces ------------------------------------------------------------
        page.click(".dashboard-tabs a[data-page=namespaces]")
        page.wait_for_url(f"{base}/admin/dashboard/namespaces/")
        assert page.locator("#namespaces tbody tr").count() == expected["enabled_namespaces"]
        photograph(page, tmp_path, "dashboard-namespaces", overflow)
        page.click("#namespace-filters a:has-text('split over nodes')")
        page.wait_for_url(f"{base}/admin/dashboard/namespaces/?filter=split")
        assert page.locator("#namespaces tbody tr").count() == int(expected["split"])
        page.click("#namespace-sorts a:has-text('memory estimate')")
        page.wait_for_url(f"{base}/admin/dashboard/namespaces/?filter=split&sort=memory")
        assert page.locator("#namespaces tbody tr td.memory").count() == int(expected["split"])
        page.click(f"#namespaces tr[data-namespace-id='{expected['detail_root']}'] a")
        page.wait_for_url(f"{base}/admin/dashboard/namespaces/{expected['detail_root']}/")
        shown = [
            int(row.get_attribute("data-index-id"))
            for row in page.locator("#replicas tr[data-index-id]").all()
        ]
        assert shown == expected["detail_index_ids"]
        seen["targets"] = text(page, "#targets tbody")
        seen["search"] = text(page, "[data-figure=targets] .value")
        seen["memory_estimate"] = text(page, "[data-figure=memory-estimate] .value")
        seen["placed_by"] = text(page, "[data-figure=placed-by]")
        photograph(page, tmp_path, "dashboard-namespace", overflow)

        # --- evictions -------------------------------------------------------------
        page.click(".dashboard-tabs a[data-page=evictions]")
        page.wait_for_url(f"{base}/admin/dashboard/evictions/")
        shown = [
            row.get_attribute("data-node-name")
            for row in page.locator("#over-high tbody tr[data-node-name]").all()
        ]
        assert shown == expected["over_high"]
        seen["waiting_clock"] = text(
            page, f"#over-high tr[data-node-name='{expected['over_high'][0]}'] td.over-high"
        )
        cooling = [
            row.get_attribute("data-node-name")
            for row in page.locator("#cooling tbody tr[data-node-name]").all()
        ]
        assert cooling == expected["cooling"]
        assert text(page, "#cooling tbody td.until") == expected["cooling_until"]
        rows = page.locator("#decisions tbody tr[data-decision-id]")
        assert rows.count() == len(expected["decisions"])
        for decision in expected["decisions"]:
            row = f"#decisions tr[data-decision-id='{decision['id']}']"
            assert text(page, f"{row} td.node") == decision["node"]
            assert text(page, f"{row} td.verdict") == decision["verdict"]
            assert text(page, f"{row} td.namespaces") == decision["namespaces"]
        photograph(page, tmp_path, "dashboard-evictions", overflow)

        # --- moves -------------------------------------------------------------------
        page.click(".dashboard-tabs a[data-page=moves]")
        page.wait_for_url(f"{base}/admin/dashboard/moves/")
        row = f"#moves-live tr[data-move-id='{expected['move_id']}']"
        assert text(page, f"{row} td.source") == expected["move_source"]
        assert text(page, f"{row} td.target") == expected["move_target"]
        assert text(page, f"{row} td.state") == "building"
        assert text(page, "[data-figure=in-flight] .value") == expected["live_moves"]
        photograph(page, tmp_path, "dashboard-moves", overflow)

        # --- maintenance -----------------------------------------------------------
        page.click(".dashboard-tabs a[data-page=maintenance]")
        page.wait_for_url(f"{base}/admin/dashboard/maintenance/")
        row = f"#shutdowns-live tr[data-shutdown-id='{expected['restart_id']}']"
        assert text(page, f"{row} td.node") == f"{expected['restart_node']} offline"
        assert text(page, f"{row} td.left").endswith("of the delay")
        row = f"#shutdowns-recent tr[data-shutdown-id='{expected['returned_id']}']"
        assert text(page, f"{row} td.status") == "complete node returned"
        assert text(page, "[data-figure=live] .value") == "1"
        photograph(page, tmp_path, "dashboard-maintenance", overflow)

        # --- one node's history ----------------------------------------------------
        page.click(".dashboard-tabs a[data-page=fleet]")
        page.wait_for_url(f"{base}/admin/dashboard/")
        row = f"#nodes tr[data-node-name='{expected['sampled_node']}']"
        assert page.locator(f"{row} svg.chart.sparkline path").count() == 1
        page.click(f"{row} td.name a")
        page.wait_for_url(f"{base}/admin/dashboard/nodes/{expected['sampled_node_id']}/")
        assert text(page, "[data-figure=samples] .value") == expected["samples"]
        assert text(page, "[data-figure=disk] .value") == "70.0%"
        assert page.locator("#disk-history svg path[data-series='disk used']").count() == 1
        for series in ("RSS", "estimated", "budget"):
            assert page.locator(f"#memory-history svg path[data-series='{series}']").count() == 1
        assert page.locator("#days tbody tr").count() == 3
        photograph(page, tmp_path, "dashboard-node", overflow)

        # --- the pages with nothing checked here but their width ------------------
        for key in ("balance", "capacity", "gitlab", "audit"):
            page.click(f".dashboard-tabs a[data-page={key}]")
            page.wait_for_url(f"{base}/admin/dashboard/{key}/")
            photograph(page, tmp_path, f"dashboard-{key}", overflow)

        # --- dead ends: each answers in the dashboard's frame and links back ---------
        plan_url = f"/admin/dashboard/plans/{expected['plan_id']}/"
        for path, status, tab, words in [
            *DEAD_ENDS,
            (f"{plan_url}?filter=bogus", 400, "plans", "The filter bogus is not known"),
            (f"{plan_url}?page=5", 404, "plans", "There is no page 5"),
        ]:
            response = page.goto(f"{base}{path}")
            assert response is not None and response.status == status, path
            assert page.locator(".dashboard-tabs a.active").get_attribute("data-page") == tab
            assert words in text(page, "#dashboard-problem"), path
            assert page_width(page) <= VIEWPORT["width"], path
            seen_problems.append(path)
        # The way back leads back: the last dead end's link to its tab.
        page.goto(f"{base}/admin/dashboard/namespaces/?page=abc")
        photograph(page, tmp_path, "dashboard-problem", overflow)
        page.click("#dashboard-problem-links a.back")
        page.wait_for_url(f"{base}/admin/dashboard/namespaces/")

    # Every page fits both windows: no sideways scrolling of the page itself.
    assert overflow == {}
    assert len(seen_problems) == len(DEAD_ENDS) + 2

    # Every candidate was too small for the monorepo: each is named with its reason.
    assert "insufficient unclaimed storage" in seen["too_big_candidates"]
    for name in expected["detail_nodes"]:
        assert name in seen["targets"]
    assert seen["search"] == "searchable"
    assert seen["memory_estimate"] == " ".join(expected["detail_memory_estimate"].split())
    # The detail namespace was built in place, not by a rollout: no plan placed it.
    assert "not among the last 50" in seen["placed_by"]
    # Set 3 h 12 min before the seed; the browser reads it a few seconds or minutes later.
    assert seen["waiting_clock"].startswith("3 h 1")
    for name in (
        "admin-index",
        "fleet",
        "plans",
        "plan",
        "namespaces",
        "namespace",
        "evictions",
        "moves",
        "maintenance",
        "node",
        "balance",
        "capacity",
        "gitlab",
        "audit",
        "problem",
    ):
        shot = name if name.startswith("admin") else f"dashboard-{name}"
        for suffix in ("", "-1024"):
            assert (tmp_path / f"{shot}{suffix}.png").stat().st_size > 10_000
    # A test run leaves the checkout as it was; `make screenshots` refreshes the docs.
    if not refreshing():
        assert docs_screenshots() == tracked
