"""The dashboard pages: staff only, inside the admin, showing what the database holds."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.dashboard.builders import GIB, build_fleet, unplaced_namespace
from zoekt import app_settings, memory
from zoekt.admin import human_bytes
from zoekt.models import EnabledNamespace, Index, Node
from zoekt.units import binary_size_in, binary_unit

pytestmark = pytest.mark.django_db


def page_text(response) -> str:
    """The visible text of a page, whitespace collapsed (SVG and style left out)."""
    html = response.content.decode()
    html = re.sub(r"<(svg|style)\b.*?</\1>", " ", html, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", html)
    return " ".join(text.replace("&nbsp;", " ").split())


def row_html(response, attribute: str, value: object) -> str:
    html = response.content.decode()
    match = re.search(rf'<tr [^>]*\b{attribute}="{value}".*?</tr>', html, flags=re.S)
    assert match, f"no row with {attribute}={value}"
    return match.group(0)


def cell(row: str, css_class: str) -> str:
    match = re.search(rf'<td class="[^"]*\b{css_class}\b[^"]*"[^>]*>(.*?)</td>', row, flags=re.S)
    assert match, f"no cell {css_class}"
    return " ".join(re.sub(r"<[^>]+>", " ", match.group(1)).split())


def size(value: int | None) -> str:
    """``human_bytes`` as a page shows it once whitespace is collapsed."""
    return " ".join(human_bytes(value).split())


# --- access ---------------------------------------------------------------------------


PAGES = [
    "dashboard-fleet",
    "dashboard-plans",
    "dashboard-namespaces",
    "dashboard-evictions",
    "dashboard-moves",
    "dashboard-maintenance",
    "dashboard-balance",
    "dashboard-capacity",
    "dashboard-audit",
]


@pytest.mark.parametrize("name", PAGES)
def test_anonymous_visitors_are_sent_to_the_admin_login(client, name):
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


@pytest.mark.parametrize("name", PAGES)
def test_users_who_are_not_staff_are_sent_to_the_admin_login(client, name):
    user = User.objects.create_user("visitor", password="pw-123456789")
    client.force_login(user)
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_staff_without_model_permissions_may_read_the_dashboard(client, now):
    build_fleet(2, 2)
    client.force_login(User.objects.create_user("op", password="pw-123456789", is_staff=True))
    for name in PAGES:
        assert client.get(reverse(name)).status_code == 200


def test_the_admin_index_links_to_every_dashboard_page(admin_client):
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert 'id="dashboard-module"' in html
    for name in PAGES:
        assert f'href="{reverse(name)}"' in html


def test_pages_sit_inside_the_admin_chrome(admin_client, now):
    html = admin_client.get(reverse("dashboard-fleet")).content.decode()
    assert "zoekt-control" in html  # the admin's site header
    assert 'class="breadcrumbs"' in html
    assert "admin/css/base.css" in html
    # Server-side charts: everything the page loads comes from this server.
    loaded = re.findall(r'\b(?:src|href)="([^"]*)"', html)
    assert loaded
    assert all(url.startswith(("/", "?", "#")) for url in loaded), loaded
    assert "<svg" in html


# --- fleet ---------------------------------------------------------------------------


def test_fleet_page_shows_each_nodes_disk_memory_and_health(admin_client, now):
    fleet = build_fleet(3, 3)
    Node.objects.filter(pk=fleet.nodes[2].pk).update(last_seen_at=now.replace(year=2025))
    response = admin_client.get(reverse("dashboard-fleet"))
    assert response.status_code == 200
    report = {row.node_id: row for row in memory.node_memory_report()}
    searchable = set(Node.objects.searchable().values_list("id", flat=True))
    for node in Node.objects.with_unclaimed_storage_bytes():
        row = row_html(response, "data-node-id", node.id)
        assert cell(row, "name") == node.name
        assert cell(row, "disk-percent") == f"{node.storage_percent_used * 100:.1f}%"
        assert cell(row, "reserved") == size(node.reserved_storage_bytes)
        assert cell(row, "unclaimed") == size(node.unclaimed_storage_bytes)
        assert cell(row, "total") == size(node.total_bytes)
        assert cell(row, "online") == ("yes" if node.is_online() else "no")
        assert cell(row, "searchable").startswith("yes" if node.id in searchable else "no")
        # The memory sizes of a row share the unit of its largest (binary_size_in).
        m = report[node.id]
        unit = binary_unit(max(m.estimated_memory_bytes, m.rss_bytes, m.memory_budget_bytes or 0))
        assert cell(row, "estimated") == " ".join(
            binary_size_in(m.estimated_memory_bytes, unit).split()
        )
        assert cell(row, "rss") == " ".join(binary_size_in(m.rss_bytes, unit).split())
        assert cell(row, "shards") == str(report[node.id].shards_loaded)
        assert cell(row, "indices") == str(Index.objects.filter(zoekt_node=node).count())
        assert row.count("<line ") >= 3  # watermark lines at 60/75/85 %
    text = page_text(response)
    assert "memory budget per node (setting)" in text
    assert "not configured" in text


def test_fleet_page_draws_the_watermark_lines_at_60_75_and_85_percent(admin_client, now):
    build_fleet(1, 1)
    row = row_html(admin_client.get(reverse("dashboard-fleet")), "data-node-name", "zoekt-0")
    svg = re.search(r'<svg[^>]*class="chart disk".*?</svg>', row, flags=re.S).group(0)
    width = float(re.search(r'width="(\d+)"', svg).group(1))
    xs = [float(x) for x in re.findall(r'<line x1="([\d.]+)"', svg)]
    assert xs == pytest.approx([0.60 * width, 0.75 * width, 0.85 * width], abs=0.1)


def test_fleet_page_shows_the_configured_memory_budget(admin_client, now):
    row = app_settings.load_row()
    row.zoekt_node_memory_budget_bytes = 16 * GIB
    row.save()
    node = build_fleet(1, 1).nodes[0]
    metadata = {**node.metadata, "process_health": {"webserver": {"rss_bytes": GIB}}}
    Node.objects.filter(pk=node.pk).update(metadata=metadata)
    response = admin_client.get(reverse("dashboard-fleet"))
    assert cell(row_html(response, "data-node-id", node.id), "budget").startswith("16.0 GiB")
    assert "16.0 GiB memory budget per node (setting)" in page_text(response)


def test_fleet_page_says_not_reported_for_a_node_without_process_health(admin_client, now):
    node = build_fleet(1, 1).nodes[0]
    Node.objects.filter(pk=node.pk).update(metadata={"name": "quiet"})
    row = row_html(admin_client.get(reverse("dashboard-fleet")), "data-node-id", node.id)
    assert cell(row, "rss") == "not reported"
    assert cell(row, "budget") == "not configured"


def row_of_figure(response, name: str) -> str:
    """The HTML of one of the fleet page's figures at the top."""
    html = response.content.decode()
    match = re.search(rf'<div class="figure" data-figure="{name}".*?</div>', html, flags=re.S)
    assert match, f"no figure {name}"
    return match.group(0)


def figure(response, name: str) -> str:
    """The visible text of one of the fleet page's figures at the top."""
    return " ".join(re.sub(r"<[^>]+>", " ", row_of_figure(response, name)).split())


def test_fleet_page_counts_the_namespaces_dark_to_search_by_reason(admin_client, now):
    fleet = build_fleet(3, 3)
    assert figure(admin_client.get(reverse("dashboard-fleet")), "dark-namespaces") == (
        "0 namespaces dark ( no ready replica 0 · no searchable replica 0 )"
    )
    # Each namespace has an index on node i and on node i + 1: two hold one on node 2.
    Node.objects.filter(pk=fleet.nodes[2].pk).update(last_seen_at=now.replace(year=2025))
    Index.objects.filter(pk=fleet.indices[0].pk).update(state=Index.State.PENDING)
    response = admin_client.get(reverse("dashboard-fleet"))
    assert figure(response, "dark-namespaces") == (
        "3 namespaces dark ( no ready replica 1 · no searchable replica 2 ) "
        + " , ".join(str(e.root_namespace_id) for e in fleet.namespaces)
    )
    for enabled in fleet.namespaces:  # each links to its page, which says why
        url = reverse("dashboard-namespace", args=[enabled.root_namespace_id])
        assert f'href="{url}"' in row_of_figure(response, "dark-namespaces")


def test_fleet_page_links_only_the_first_five_dark_namespaces(admin_client, now):
    fleet = build_fleet(1, 7)
    Node.objects.filter(pk=fleet.nodes[0].pk).update(last_seen_at=now.replace(year=2025))
    text = figure(admin_client.get(reverse("dashboard-fleet")), "dark-namespaces")
    first = " , ".join(str(e.root_namespace_id) for e in fleet.namespaces[:5])
    assert text.endswith(f"{first} , …")
    assert str(fleet.namespaces[5].root_namespace_id) not in text


def test_fleet_page_with_no_nodes(admin_client, now):
    assert "No node has sent a heartbeat yet." in page_text(
        admin_client.get(reverse("dashboard-fleet"))
    )


# --- plans ------------------------------------------------------------------------------


def test_plans_page_lists_each_plan_with_its_counts_and_bound(admin_client, now, dry_run_plan):
    build_fleet(3, 0)
    first = dry_run_plan((10**6,))
    second = dry_run_plan((10**6,), (10**15,))
    response = admin_client.get(reverse("dashboard-plans"))
    html = response.content.decode()
    assert html.index(f'data-plan-id="{second.id}"') < html.index(f'data-plan-id="{first.id}"')
    row = row_html(response, "data-plan-id", second.id)
    assert cell(row, "create") == str(len(second.plan["create"]))
    assert cell(row, "failures") == "1"
    ratio = second.summary["bounds"]["disk"]["ratio"]
    assert f"= {ratio:.2f}" in cell(row, "bounds")


def test_plan_page_shows_each_namespaces_decision_and_each_candidates_reason(
    admin_client, now, dry_run_plan
):
    fleet = build_fleet(3, 0)
    plan = dry_run_plan((10**6,), (10**15,))
    fits, too_big = (EnabledNamespace.objects.order_by("id")[i].root_namespace_id for i in (0, 1))
    response = admin_client.get(reverse("dashboard-plan", args=[plan.id]))
    assert response.status_code == 200
    ok_row = row_html(response, "data-namespace-id", fits)
    taken = plan.plan["create"][0]["replicas"][0]["indices"][0]["node_id"]
    taken_name = next(node.name for node in fleet.nodes if node.id == taken)
    assert cell(ok_row, "action") == "create"
    assert cell(ok_row, "verdict") == "ok"
    assert f"{taken_name} : took index 1 of planned replica 1" in cell(ok_row, "candidates")
    failed_row = row_html(response, "data-namespace-id", too_big)
    assert cell(failed_row, "verdict").startswith("failed node unavailable (planned replica 1)")
    candidates = cell(failed_row, "candidates")
    for node in fleet.nodes:
        assert f"{node.name} : passed over: insufficient unclaimed storage" in candidates


def test_plan_page_shows_the_placement_and_each_balanced_choices_score(
    admin_client, now, dry_run_plan
):
    fleet = build_fleet(3, 0)
    plan = dry_run_plan((10**6,))
    assert plan.summary["placement"] == {
        "strategy": "balanced",
        "order": "largest_first",
        "max_index_storage_fraction": 0.25,
    }
    response = admin_client.get(reverse("dashboard-plan", args=[plan.id]))
    text = page_text(response)
    assert "balanced placement, largest first, an index at most 25.0% of its node" in text
    (decision,) = plan.explanation[0]["decisions"]
    taken = next(node.name for node in fleet.nodes if node.id == decision["node_id"])
    others = sorted(node.name for node in fleet.nodes if node.id != decision["node_id"])
    row = row_html(response, "data-namespace-id", plan.explanation[0]["namespace_id"])
    line = f"index 1 of planned replica 1: {taken} scored {decision['score']:.3f}; next "
    assert line in cell(row, "candidates")
    for name in others:
        assert name in cell(row, "candidates").split(line)[1]


def test_plan_page_filters_and_pages_namespaces(admin_client, now, dry_run_plan):
    build_fleet(3, 0)
    plan = dry_run_plan(*[(10**6,)] * 3, (10**15,))
    url = reverse("dashboard-plan", args=[plan.id])
    failed = admin_client.get(url, {"filter": "failed"}).content.decode()
    assert failed.count("<tr data-namespace-id=") == 1
    created = admin_client.get(url, {"filter": "create"}).content.decode()
    assert created.count("<tr data-namespace-id=") == 3
    # An unknown filter is not silently "all": 400, the error names it and the choices,
    # and nothing is listed, as on every page (tests/dashboard/test_dead_ends.py).
    wrong = admin_client.get(url, {"filter": "nonsense"})
    assert wrong.status_code == 400
    text = wrong.content.decode()
    assert "The filter nonsense is not known" in text
    assert "failed, warnings, create" in text
    assert text.count("<tr data-namespace-id=") == 0


def test_plan_page_for_a_pruned_plan_is_404(admin_client):
    assert admin_client.get(reverse("dashboard-plan", args=[999_999])).status_code == 404


def test_plans_page_with_no_plan(admin_client):
    assert "No rollout has planned anything yet." in page_text(
        admin_client.get(reverse("dashboard-plans"))
    )


# --- namespaces ---------------------------------------------------------------------------


def test_namespaces_page_lists_replicas_indices_and_searchability(admin_client, now):
    fleet = build_fleet(3, 3)
    unplaced = unplaced_namespace("waiting", (10**6,))
    response = admin_client.get(reverse("dashboard-namespaces"))
    for enabled in fleet.namespaces:
        row = row_html(response, "data-namespace-id", enabled.root_namespace_id)
        assert cell(row, "replicas") == "1 / 1 / 1"
        assert cell(row, "indices") == "ready 2"
        assert cell(row, "nodes") == "2"
        assert cell(row, "searchable") == "yes"
    row = row_html(response, "data-namespace-id", unplaced.root_namespace_id)
    assert cell(row, "replicas") == "0 / 0 / 1"
    assert cell(row, "searchable") == "no"


def test_namespaces_page_searches_by_id_and_path_and_filters(admin_client, now):
    fleet = build_fleet(2, 3)
    url = reverse("dashboard-namespaces")
    target = fleet.namespaces[1].root_namespace_id
    by_id = admin_client.get(url, {"q": str(target)}).content.decode()
    assert f'data-namespace-id="{target}"' in by_id
    assert by_id.count("<tr data-namespace-id=") == 1
    by_path = admin_client.get(url, {"q": "group-002"}).content.decode()
    assert by_path.count("<tr data-namespace-id=") == 1
    EnabledNamespace.objects.filter(pk=fleet.namespaces[0].pk).update(search=False)
    disabled = admin_client.get(url, {"filter": "search_disabled"}).content.decode()
    assert disabled.count("<tr data-namespace-id=") == 1


def test_namespaces_page_pages_by_fifty(admin_client, now):
    build_fleet(1, 0)
    for i in range(55):
        unplaced_namespace(f"many-{i:02d}", ())
    url = reverse("dashboard-namespaces")
    assert admin_client.get(url).content.decode().count("<tr data-namespace-id=") == 50
    second = admin_client.get(url, {"page": 2})
    assert second.content.decode().count("<tr data-namespace-id=") == 5
    assert "page 2 of 2 (55 in all)" in page_text(second)


def test_namespace_page_shows_replicas_indices_ranges_and_search_targets(admin_client, now):
    fleet = build_fleet(3, 2)
    enabled = fleet.namespaces[0]
    response = admin_client.get(reverse("dashboard-namespace", args=[enabled.root_namespace_id]))
    assert response.status_code == 200
    html = response.content.decode()
    indices = list(Index.objects.filter(zoekt_enabled_namespace=enabled).order_by("id"))
    shown = [int(i) for i in re.findall(r'<tr data-index-id="(\d+)"', html)]
    assert shown == [index.id for index in indices]
    first, second = indices
    split = first.metadata["project_namespace_id_to"]
    assert cell(row_html(response, "data-index-id", first.id), "range") == f"up to {split}"
    assert cell(row_html(response, "data-index-id", second.id), "range") == f"from {split + 1}"
    assert "…" not in html
    targets = re.findall(r'<tr data-node-id="(\d+)"', html)
    assert [int(t) for t in targets] == sorted(index.zoekt_node_id for index in indices)
    assert "searchable" in page_text(response)


def test_namespace_page_says_why_there_is_no_search_target(admin_client, now):
    fleet = build_fleet(2, 1)
    Index.objects.update(state=Index.State.INITIALIZING)
    root = fleet.namespaces[0].root_namespace_id
    text = page_text(admin_client.get(reverse("dashboard-namespace", args=[root])))
    assert "No search target: no ready replica." in text


def test_namespace_page_says_a_namespace_without_project_statistics_waits_for_them(
    admin_client, now
):
    build_fleet(2, 1)
    waiting = unplaced_namespace("stats-less", (None, None))
    response = admin_client.get(reverse("dashboard-namespace", args=[waiting.root_namespace_id]))
    assert response.status_code == 200
    assert 'data-figure="rollout-waiting"' in response.content.decode()
    assert (
        "waiting for project statistics none of its projects has statistics yet, so the "
        "rollout leaves it out of its batches until one does (waiting_for_project_statistics)"
    ) in page_text(response)


def test_plan_page_names_a_namespace_skipped_while_it_waits_for_statistics(
    admin_client, now, dry_run_plan
):
    build_fleet(2, 1)
    plan = dry_run_plan((10**6,), (None, None))
    (skipped,) = plan.summary["namespaces_skipped"]
    response = admin_client.get(reverse("dashboard-plan", args=[plan.id]))
    row = row_html(response, "data-skipped-namespace-id", skipped["namespace_id"])
    assert "waiting for project statistics: none of its projects has statistics yet" in row
    assert "more than" not in row


def test_namespace_page_of_a_placed_namespace_shows_no_wait(admin_client, now):
    fleet = build_fleet(2, 1)
    root = fleet.namespaces[0].root_namespace_id
    response = admin_client.get(reverse("dashboard-namespace", args=[root]))
    assert 'data-figure="rollout-waiting"' not in response.content.decode()


def test_namespace_page_for_a_namespace_that_is_not_enabled_is_404(admin_client):
    assert admin_client.get(reverse("dashboard-namespace", args=[123_456])).status_code == 404


# --- the number of queries does not grow with the fleet ------------------------------------


def queries(client, url: str) -> int:
    client.get(url)  # warm: settings cache, session
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured)


def test_page_queries_do_not_grow_with_the_fleet(admin_client, now, dry_run_plan):
    def pages() -> dict[str, int]:
        plan = dry_run_plan(*[(10**6,)] * len(fleets[-1].namespaces), (10**15,))
        root = fleets[-1].namespaces[-1].root_namespace_id
        urls = {
            "fleet": reverse("dashboard-fleet"),
            "plans": reverse("dashboard-plans"),
            "plan": reverse("dashboard-plan", args=[plan.id]),
            "namespaces": reverse("dashboard-namespaces"),
            "namespace": reverse("dashboard-namespace", args=[root]),
            "evictions": reverse("dashboard-evictions"),
            "balance": reverse("dashboard-balance"),
            "capacity": reverse("dashboard-capacity"),
            "metrics": reverse("metrics"),
        }
        return {name: queries(admin_client, url) for name, url in urls.items()}

    fleets = [build_fleet(3, 3)]
    small = pages()
    fleets.append(build_fleet(30, 30))
    large = pages()
    assert large == small
