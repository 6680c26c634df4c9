"""Fixtures of the scheduling tests: settings, a recording dispatcher and the service."""

from __future__ import annotations

import pytest

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
