"""Browser tests: Playwright's sync API driving Debian's Chromium against ``live_server``.

Playwright never downloads a browser here: ``chromium_page`` launches
``/usr/bin/chromium`` (``.ci/run`` installs Debian's package when it is
missing) with the flags this machine needs and a fresh profile directory.
Without Chromium or the ``playwright`` package the tests are skipped, and the
end of the run says why and how to install what is missing; under CI (``CI``
set), or when refreshing the screenshots, that is a failure instead.

Screenshots go to each test's tmp dir, so a test run leaves the checkout as it
was. The copies in ``docs/screenshots/`` are refreshed on purpose only:
``make screenshots`` (``ZOEKT_REFRESH_SCREENSHOTS=1``) copies them there.

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
# The tracked copies the docs show; written only when refreshing on purpose.
DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
REFRESH_ENV = "ZOEKT_REFRESH_SCREENSHOTS"
INSTALL_CHROMIUM = "apt-get install chromium"
INSTALL_PLAYWRIGHT = "pip install -e '.[dev]'"
# Every page is photographed at both widths and must fit each without sideways scrolling
# of the page (a wide table may scroll inside its own box).
WIDTHS = (1440, 1024)
VIEWPORT = {"width": WIDTHS[0], "height": 900}
PASSWORD = "dashboard-operator-password"

# reason -> the browser tests skipped for it, reported at the end of the run.
SKIPPED = pytest.StashKey[dict[str, list[str]]]()


def refreshing() -> bool:
    """Whether this run refreshes ``docs/screenshots/`` (``make screenshots``)."""
    return os.environ.get(REFRESH_ENV, "").strip() not in ("", "0")


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"the playwright package is not installed ({INSTALL_PLAYWRIGHT})"
    if not CHROMIUM.exists():
        return f"Chromium is missing: {CHROMIUM} not found ({INSTALL_CHROMIUM})"
    return None


@pytest.fixture
def browser_ready(request) -> None:
    reason = _missing()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run under CI: {reason}")
    if refreshing():
        pytest.fail(f"cannot refresh {DOCS_SCREENSHOTS}: {reason}")
    request.config.stash.setdefault(SKIPPED, {}).setdefault(reason, []).append(request.node.nodeid)
    pytest.skip(reason)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Say at the end of the run that browser tests were skipped, why, and the fix."""
    skipped = config.stash.get(SKIPPED, {})
    if not skipped:
        return
    terminalreporter.write_sep("=", "browser tests skipped", yellow=True, bold=True)
    for reason, nodeids in skipped.items():
        terminalreporter.write_line(f"{len(nodeids)} browser test(s) skipped: {reason}")
        if reason.startswith("Chromium"):
            terminalreporter.write_line(
                f"Install Chromium with `{INSTALL_CHROMIUM}` (as root, as .ci/run does), "
                "then run `make test` again."
            )
        else:
            terminalreporter.write_line(
                f"Install it with `{INSTALL_PLAYWRIGHT}`, then run `make test` again."
            )


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
    """Save a full-page PNG under the test's tmp dir; copy it to docs/ when refreshing."""
    path = tmp_path / f"{name}.png"
    page.mouse.move(0, 0)  # no hover highlight: the same page gives the same picture
    page.screenshot(path=str(path), full_page=True, animations="disabled", caret="hide")
    if refreshing():
        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_SCREENSHOTS / path.name)
    return path


def page_width(page) -> int:
    """How wide the page lays out: wider than the window means sideways scrolling."""
    return page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
    )


def photograph(page, tmp_path: Path, name: str, overflow: dict[str, int]) -> None:
    """Screenshot the page at each of ``WIDTHS`` (``name.png`` at the first, ``name-1024.png``
    ...), recording in ``overflow`` every width the page does not fit."""
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": VIEWPORT["height"]})
        laid_out = page_width(page)
        if laid_out > width:
            overflow[f"{name} at {width}"] = laid_out
        screenshot(page, tmp_path, name if width == WIDTHS[0] else f"{name}-{width}")
    page.set_viewport_size(VIEWPORT)
