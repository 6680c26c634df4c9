"""A link that leads nowhere answers one way on every dashboard page: a page in the
dashboard's frame (its tabs and breadcrumbs) that names the problem, gives the reason the
view knows, and links back, with a 404 for what does not exist and a 400 for what cannot
be read. Nothing is listed under it, and nothing is silently shown instead."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from dashboard import views
from tests.dashboard.builders import build_fleet
from tests.dashboard.test_pages import page_text
from tests.factories import GroupFactory
from zoekt.models import EnabledNamespace

pytestmark = pytest.mark.django_db


def links(response) -> list[str]:
    """The hrefs of the problem's links, in order (the way back last)."""
    block = re.search(
        r'<ul id="dashboard-problem-links">(.*?)</ul>', response.content.decode(), re.S
    )
    assert block, "no links under the problem"
    return [html.unescape(href) for href in re.findall(r'href="([^"]*)"', block.group(1))]


def assert_framed_problem(response, status: int, tab: str, *reason: str) -> str:
    assert response.status_code == status
    body = response.content.decode()
    # In the dashboard's frame: its tabs, the tab the link belongs to marked, crumbs home.
    assert 'class="dashboard-tabs"' in body
    assert re.search(rf'class="active" data-page="{tab}"', body)
    assert f'data-status="{status}"' in body
    text = page_text(response)
    for words in reason:
        assert words in text, (words, text)
    assert links(response)[-1] == reverse(f"dashboard-{tab}")
    return text


# --- unknown ids --------------------------------------------------------------------------


def test_a_namespace_missing_from_the_catalog_says_so(admin_client):
    response = admin_client.get(reverse("dashboard-namespace", args=[123_456]))
    assert_framed_problem(
        response, 404, "namespaces", "There is no namespace 123456 in the catalog"
    )


def test_a_root_namespace_that_is_not_enabled_says_it_is_not_enabled_for_zoekt(admin_client):
    root = GroupFactory(name="acme")
    response = admin_client.get(reverse("dashboard-namespace", args=[root.id]))
    assert_framed_problem(
        response, 404, "namespaces", f"The root namespace acme ({root.id}) is not enabled for Zoekt"
    )
    assert not EnabledNamespace.objects.exists()


def test_a_subgroup_links_to_its_root_namespace(admin_client):
    root = GroupFactory(name="acme")
    child = GroupFactory(name="tools", parent=root)
    response = admin_client.get(reverse("dashboard-namespace", args=[child.id]))
    assert_framed_problem(response, 404, "namespaces", "is not a root namespace")
    assert links(response)[0] == reverse("dashboard-namespace", args=[root.id])


def test_an_unknown_node_says_how_a_node_appears(admin_client):
    response = admin_client.get(reverse("dashboard-node", args=[10**9]))
    assert_framed_problem(
        response, 404, "fleet", f"There is no node with id {10**9}", "first heartbeat"
    )


def test_a_plan_that_is_not_kept_says_only_the_last_50_are(admin_client):
    response = admin_client.get(reverse("dashboard-plan", args=[999_999]))
    assert_framed_problem(
        response, 404, "plans", "Rollout plan 999999 is not kept", "only the last 50 plans"
    )


# --- unknown filters and sorts: the same page on every list ---------------------------


@pytest.mark.parametrize(
    ("url", "query", "tab", "field"),
    [
        pytest.param("dashboard-namespaces", "filter=splt", "namespaces", "filter", id="ns-filter"),
        pytest.param("dashboard-namespaces", "sort=size", "namespaces", "sort", id="ns-sort"),
        pytest.param("dashboard-audit", "via=telnet", "audit", "via", id="audit-via"),
    ],
)
def test_an_unknown_choice_names_it_lists_the_choices_and_shows_nothing(
    admin_client, url, query, tab, field
):
    build_fleet(2, 2)
    response = admin_client.get(f"{reverse(url)}?{query}")
    value = query.split("=")[1]
    assert_framed_problem(response, 400, tab, f"The {field} {value} is not known")
    assert "<tr data-" not in response.content.decode()
    # The first link drops the bad value; each choice after it is a link of its own.
    assert links(response)[0] == reverse(url)
    assert all(f"{field}=" in href for href in links(response)[1:-1])


def test_an_unknown_plan_filter_is_the_same_page_as_everywhere_else(admin_client, dry_run_plan):
    build_fleet(2, 0)
    plan = dry_run_plan((10**6,))
    response = admin_client.get(reverse("dashboard-plan", args=[plan.id]), {"filter": "x"})
    assert_framed_problem(response, 400, "plans", "The filter x is not known")
    assert "<tr data-namespace-id=" not in response.content.decode()


def test_an_unreadable_time_names_the_field(admin_client):
    response = admin_client.get(reverse("dashboard-audit"), {"since": "yesterday"})
    assert_framed_problem(response, 400, "audit", "The since yesterday is not a date")


# --- page numbers that are no page --------------------------------------------------------


LISTS = ["namespaces", "evictions", "moves", "maintenance", "audit"]


@pytest.mark.parametrize("tab", LISTS)
@pytest.mark.parametrize(
    ("page", "status", "reason"),
    [
        pytest.param("999", 404, "There is no page 999: the list has 1 page.", id="past-the-end"),
        pytest.param("abc", 400, "The page abc is not a page number", id="not-a-number"),
        pytest.param("-1", 400, "The page -1 is not a page number", id="negative"),
        pytest.param("0", 400, "The page 0 is not a page number", id="zero"),
    ],
)
def test_a_page_number_that_is_no_page_says_so_and_links_to_the_first_and_last(
    admin_client, tab, page, status, reason
):
    url = reverse(f"dashboard-{tab}")
    response = admin_client.get(url, {"page": page})
    assert_framed_problem(response, status, tab, reason)
    assert links(response)[:2] == [url, f"{url}?page=1"]


def test_a_bad_page_keeps_the_other_parameters_in_its_links(admin_client):
    build_fleet(2, 3)
    url = reverse("dashboard-namespaces")
    response = admin_client.get(url, {"filter": "split", "q": "ns", "page": "7"})
    assert response.status_code == 404
    first, last = links(response)[:2]
    assert first == f"{url}?filter=split&q=ns"
    assert last == f"{url}?filter=split&q=ns&page=1"


def test_the_pages_that_exist_still_answer(admin_client):
    build_fleet(2, 3)
    for tab in LISTS:
        assert admin_client.get(reverse(f"dashboard-{tab}"), {"page": "1"}).status_code == 200


# --- the admin's front page ------------------------------------------------------------


def test_the_admins_front_page_links_every_dashboard_page_in_tab_order(admin_client):
    body = admin_client.get(reverse("admin:index")).content.decode()
    box = re.search(r'<div class="module" id="dashboard-module">(.*?)</div>', body, re.S)
    assert box
    listed = re.findall(r'<th scope="row"><a href="([^"]+)">([^<]+)</a></th>', box.group(1))
    assert listed == [(reverse(f"dashboard-{key}"), label) for key, label in views.PAGES]


# --- node names link to the node page ---------------------------------------------------


def test_a_node_named_in_a_plan_or_a_move_links_to_its_page(admin_client, now):
    node = build_fleet(2, 0).nodes[1]
    response = admin_client.get(reverse("dashboard-node-named", args=[node.name]))
    assert response.status_code == 302
    assert response.url == reverse("dashboard-node", args=[node.id])


def test_a_name_no_node_has_now_is_a_framed_404(admin_client):
    response = admin_client.get(reverse("dashboard-node-named", args=["zoekt-gone"]))
    assert_framed_problem(response, 404, "fleet", "No node is called zoekt-gone now")


def test_every_node_name_on_the_plan_and_namespace_pages_links_to_the_node_page(
    admin_client, now, dry_run_plan
):
    fleet = build_fleet(3, 1)
    plan = dry_run_plan((10**6,))
    for url in (
        reverse("dashboard-plan", args=[plan.id]),
        reverse("dashboard-namespace", args=[fleet.namespaces[0].root_namespace_id]),
    ):
        body = admin_client.get(url).content.decode()
        linked = set(re.findall(r'<a class="node-name" href="[^"]+">([^<]+)</a>', body))
        assert linked, url
        assert linked <= {node.name for node in fleet.nodes}
    # The plan's candidate nodes are listed by name, placed or not.
    body = admin_client.get(reverse("dashboard-plan", args=[plan.id])).content.decode()
    listed = re.findall(r'<tr data-plan-node="([^"]+)"', body)
    assert listed == sorted(listed, key=lambda name: int(name.split("-")[1]))
