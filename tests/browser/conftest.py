"""Browser tests: Playwright's sync API driving Debian's Chromium against ``live_server``.

Playwright never downloads a browser here: ``chromium_page`` launches
``/usr/bin/chromium`` (``.ci/run`` installs Debian's package when it is
missing) with the flags this machine needs and a fresh profile directory.
Without Chromium or the ``playwright`` package the tests are skipped, except
under CI (``CI`` set), where that is a failure.

Why the database is never touched while a browser is open: Playwright's sync
API runs an asyncio event loop in the test's thread (in a greenlet), so
Django sees a running loop and refuses ORM calls there
(``SynchronousOnlyOperation``). Rather than switch that safety off with
``DJANGO_ALLOW_ASYNC_UNSAFE``, each test seeds the fleet and reads every
figure it will check *before* it opens the browser, and only compares
strings while the browser is open. The live server answers from its own
thread, which has no event loop, and reads the rows the test committed
(``live_server`` makes the test transactional).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
VIEWPORT = {"width": 1500, "height": 900}
PASSWORD = "dashboard-operator-password"


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    return None


@pytest.fixture
def browser_ready() -> None:
    reason = _missing()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run under CI: {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def chromium_page(profile: Path) -> Iterator:
    """A Playwright page in a fresh Chromium profile; no ORM call while it is open."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport=VIEWPORT,
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            context.close()


def log_in(page, base_url: str, username: str, password: str = PASSWORD) -> None:
    """Through the admin's own login form, as an operator would."""
    page.goto(f"{base_url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}/admin/")


def screenshot(page, tmp_path: Path, name: str) -> Path:
    """Save a full-page PNG under the test's tmp dir and copy it to docs/screenshots/."""
    path = tmp_path / f"{name}.png"
    page.mouse.move(0, 0)  # no hover highlight: the same page gives the same picture
    page.screenshot(path=str(path), full_page=True, animations="disabled", caret="hide")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, SCREENSHOTS / path.name)
    return path
