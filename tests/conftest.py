"""Shared fixtures: a clean Redis cache per test and a frozen clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.core.cache import cache

from zoekt import app_settings, clock

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clean_cache():
    cache.clear()
    app_settings.invalidate()
    yield
    cache.clear()
    app_settings.invalidate()


@pytest.fixture
def now():
    """The clock frozen at a fixed instant; step it with ``clock.advance``."""
    with clock.frozen(NOW):
        yield NOW
