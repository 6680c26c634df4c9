"""The browser tests' harness: no tracked file written by a test run, and a skip said out loud.

These run without Chromium: a stand-in page writes the PNG, and a copy of
the conftest with Chromium pointed at a path that does not exist runs in a
pytest of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.browser import conftest

CONFTEST = Path(conftest.__file__)


class FakePage:
    """What ``screenshot`` calls on a Playwright page, writing a few bytes."""

    mouse = SimpleNamespace(move=lambda x, y: None)

    def screenshot(self, *, path: str, **_options) -> None:
        Path(path).write_bytes(b"\x89PNG fake")


@pytest.fixture
def docs_dir(tmp_path, monkeypatch) -> Path:
    """docs/screenshots/ stood in by a tmp dir, so no test here can write the real one."""
    docs = tmp_path / "docs" / "screenshots"
    monkeypatch.setattr(conftest, "DOCS_SCREENSHOTS", docs)
    return docs


def test_screenshots_stay_in_the_tests_tmp_dir(docs_dir, tmp_path, monkeypatch):
    monkeypatch.delenv(conftest.REFRESH_ENV, raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    path = conftest.screenshot(FakePage(), run_dir, "dashboard-fleet")

    assert path == run_dir / "dashboard-fleet.png"
    assert path.read_bytes() == b"\x89PNG fake"
    assert not docs_dir.exists()


def test_the_real_docs_copies_are_only_written_when_refreshing(monkeypatch):
    monkeypatch.delenv(conftest.REFRESH_ENV, raising=False)
    assert not conftest.refreshing()
    monkeypatch.setenv(conftest.REFRESH_ENV, "0")
    assert not conftest.refreshing()
    monkeypatch.setenv(conftest.REFRESH_ENV, "1")
    assert conftest.refreshing()
    # The refresh writes the folder the docs show.
    docs = CONFTEST.parents[2] / "docs" / "screenshots"
    assert docs == conftest.DOCS_SCREENSHOTS


def test_refreshing_copies_the_screenshot_into_docs(docs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(conftest.REFRESH_ENV, "1")
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    conftest.screenshot(FakePage(), run_dir, "dashboard-plans")

    assert (docs_dir / "dashboard-plans.png").read_bytes() == b"\x89PNG fake"


def run_copy_without_chromium(tmp_path: Path, *, refresh: bool = False):
    """The browser conftest in a tests/browser/ of its own, Chromium nowhere to be found."""
    browser = tmp_path / "tests" / "browser"
    browser.mkdir(parents=True)
    (browser / "conftest.py").write_text(
        CONFTEST.read_text() + '\nCHROMIUM = Path("/nonexistent/bin/chromium")\n'
    )
    (browser / "test_page.py").write_text("def test_page(browser_ready):\n    pass\n")
    (tmp_path / "tests" / "test_other.py").write_text("def test_other():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", conftest.REFRESH_ENV)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if refresh:
        env[conftest.REFRESH_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:django", "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_end_of_the_run_says_chromium_is_missing_and_how_to_install_it(tmp_path):
    result = run_copy_without_chromium(tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "1 passed, 1 skipped" in out
    summary = out[out.index("browser tests skipped") :]
    assert "1 browser test(s) skipped: Chromium is missing" in summary
    assert "/nonexistent/bin/chromium" in summary
    assert "`apt-get install chromium`" in summary
    # Said after the tests ran, in the closing summary.
    assert out.index("browser tests skipped") > out.index("test_page.py")


def test_refreshing_without_chromium_fails_instead_of_skipping(tmp_path):
    result = run_copy_without_chromium(tmp_path, refresh=True)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "cannot refresh" in result.stdout
    assert "browser tests skipped" not in result.stdout
