"""Shared fixtures: a clean Redis cache per test and a frozen clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.core.cache import cache

from zoekt import app_settings, clock

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def clean_cache() -> Iterator[None]:
    """The Redis cache and the settings row's cache, emptied before and after a test."""
    cache.clear()
    app_settings.invalidate()
    yield
    cache.clear()
    app_settings.invalidate()


@pytest.fixture(autouse=True)
def _clean_cache():
    yield from clean_cache()


@pytest.fixture
def now():
    """The clock frozen at a fixed instant; step it with ``clock.advance``."""
    with clock.frozen(NOW):
        yield NOW


@pytest.fixture
def make_fake_node(live_server, tmp_path):
    """Fake nodes talking to the live server with its shared secret: ``make(name,
    **config)`` starts one (seeded by the order made), and all are stopped after."""
    from django.conf import settings

    from simulator.fakenode import FakeNode, FakeNodeConfig

    secret_file = tmp_path / "gitlab_shell_secret"
    secret_file.write_text(settings.GITLAB_SHELL_SECRETS[0] + "\n")
    nodes: list[FakeNode] = []

    def make(name: str, **config) -> FakeNode:
        options = {
            "base_url": live_server.url,
            "secret_file": secret_file,
            "state_dir": tmp_path / "nodes",
            "name": name,
            "seed": len(nodes),
            **config,
        }
        node = FakeNode(FakeNodeConfig(**options))
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.stop()


@pytest.fixture
def prometheus_on_loopback(settings):
    """``/metrics`` scraped as a Prometheus its address lets in: the test client's
    ``127.0.0.1`` in ``ZOEKT_METRICS_ALLOWED_NETWORKS`` (the tests run in production mode)."""
    settings.ZOEKT_METRICS_ALLOWED_NETWORKS = ["127.0.0.1/32"]
