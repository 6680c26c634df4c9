"""Fixtures of the scheduling tests: settings, a recording dispatcher and the service; for
the end-to-end ones, jobs run in the live server's thread and a clock every thread reads."""

from __future__ import annotations

import pytest

from config.celery import app as celery_app
from zoekt import app_settings
from zoekt.scheduling.service import SchedulingService

set_setting = app_settings.update


@pytest.fixture
def indexing_enabled(db):
    set_setting(zoekt_indexing_enabled=True)


class Dispatched(list):
    """Events a service dispatched, as (event, args) pairs."""

    def __call__(self, event: str, args: tuple) -> None:
        self.append((event, args))

    @property
    def names(self) -> list[str]:
        return [event for event, _ in self]


@pytest.fixture
def dispatched() -> Dispatched:
    return Dispatched()


@pytest.fixture
def service(dispatched, now):
    """A service factory recording its events instead of enqueueing them."""

    def make(**kwargs) -> SchedulingService:
        kwargs.setdefault("dispatch", dispatched)
        return SchedulingService(**kwargs)

    return make


@pytest.fixture
def eager_celery(monkeypatch):
    """Jobs run where they are enqueued (the live server's thread), not through the broker."""
    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)


@pytest.fixture
def clock_offset(settings):
    """Move every thread's clock (the live server's too) to ``seconds`` ahead of wall time."""

    def set_offset(seconds: float) -> None:
        settings.ZOEKT_CLOCK_OFFSET_SECONDS = float(seconds)

    settings.ZOEKT_CLOCK_OFFSET_SECONDS = 0.0
    return set_offset
