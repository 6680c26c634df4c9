"""An operator reads the OpenAPI schema's page (``/api/schema/ui/``) in Chromium: Swagger UI
draws the operations from ``/api/schema/``, and every request the page makes goes to this
server (its scripts and styles are ``drf-spectacular-sidecar``'s static files, no CDN)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User

from tests.browser.conftest import PASSWORD, chromium_page, log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_operator_reads_the_schema_page_served_from_this_server(
    browser_ready, live_server, tmp_path, settings
):
    settings.DEBUG = False
    User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    base = live_server.url
    hosts: set[str] = set()
    # From here on: strings only, no ORM (Playwright's loop runs in this thread).
    with chromium_page(tmp_path / "profile") as page:
        page.on("request", lambda request: hosts.add(urlsplit(request.url).netloc))
        log_in(page, base, "operator")
        page.goto(f"{base}/api/schema/ui/")
        operation = page.locator("#operations-v1-zoekt_namespace_search_targets")
        operation.wait_for()
        assert "/api/v1/namespaces/{root_namespace_id}/search_targets" in operation.inner_text()
        page.screenshot(path=str(tmp_path / "schema-ui.png"))
    assert hosts == {urlsplit(base).netloc}
