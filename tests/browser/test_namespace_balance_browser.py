"""An operator reads one index's explain on the namespace page in Chromium, 1024 px wide:
where the desired balance wants it, and, unfolded, every other node's decision; the page
stays within the window's width."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from tests.browser.conftest import PASSWORD, chromium_page, log_in, screenshot
from tests.eviction.test_balance_data import full_fleet
from zoekt import clock
from zoekt.models import Node

pytestmark = pytest.mark.django_db(transaction=True, reset_sequences=True)

WIDTH = 1024


def test_the_namespace_page_shows_the_balance_of_an_index_within_1024_px(
    browser_ready, live_server, tmp_path
):
    User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    nodes = full_fleet()
    # Seen an hour ahead: the live server reads the real clock.
    Node.objects.update(last_seen_at=clock.now() + timedelta(hours=1))
    index = nodes[0].indices.order_by("id").first()
    root = index.zoekt_enabled_namespace.root_namespace_id
    expected = {
        "index": str(index.id),
        "desired": f"→ {nodes[3].name} move 1 of 8",
        "decisions": [(str(n.id), "yes" if k >= 2 else "no") for k, n in enumerate(nodes[1:])],
    }
    base = live_server.url
    # From here on: strings only, no ORM (Playwright's loop runs in this thread).
    with chromium_page(tmp_path / "profile") as page:
        page.set_viewport_size({"width": WIDTH, "height": 800})
        log_in(page, base, "operator")
        page.goto(f"{base}/admin/dashboard/namespaces/{root}/")
        row = page.locator(f"#index-balance tr[data-balance-index-id='{expected['index']}']")
        assert " ".join(row.locator("td.desired").inner_text().split()) == expected["desired"]
        assert " ".join(row.locator("td.candidates").inner_text().split()) == "2 of 4"
        folded = page.locator(f"tr[data-decisions-index-id='{expected['index']}']")
        decisions = folded.locator("tr[data-decision-node-id]")
        assert not decisions.first.is_visible()
        folded.locator("summary").click()
        assert decisions.first.is_visible()
        shown = [
            (d.get_attribute("data-decision-node-id"), d.get_attribute("data-decision"))
            for d in decisions.all()
        ]
        assert shown == expected["decisions"]
        screenshot(page, tmp_path, "namespace-balance")
        widths = page.evaluate(
            """() => ({
                page: document.documentElement.scrollWidth,
                table: document.querySelector('#index-balance').getBoundingClientRect().right,
            })"""
        )
    assert widths["page"] <= WIDTH, widths
    assert widths["table"] <= WIDTH, widths
