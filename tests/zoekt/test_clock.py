"""zoekt.clock: real time, a frozen and stepped clock, and a clock run ahead of wall time."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from zoekt import clock

AT = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)


def test_real_time_is_aware_utc_and_moves():
    first = clock.now()
    assert first.tzinfo is not None
    assert abs((first - datetime.now(UTC)).total_seconds()) < 5
    assert clock.now() >= first


def test_frozen_stops_the_clock_and_advance_steps_it():
    with clock.frozen(AT):
        assert clock.now() == AT
        assert clock.now() == AT
        assert clock.advance(90) == AT + timedelta(seconds=90)
        assert clock.now() == AT + timedelta(seconds=90)
    assert abs((clock.now() - datetime.now(UTC)).total_seconds()) < 5


def test_frozen_blocks_nest_and_restore_the_outer_time():
    with clock.frozen(AT):
        with clock.frozen(AT + timedelta(hours=3)):
            assert clock.now() == AT + timedelta(hours=3)
        assert clock.now() == AT


def test_a_frozen_clock_belongs_to_its_thread():
    seen = []
    with clock.frozen(AT):
        thread = threading.Thread(target=lambda: seen.append(clock.now()))
        thread.start()
        thread.join()
    assert seen[0] != AT


def test_advance_needs_a_frozen_clock():
    with pytest.raises(RuntimeError):
        clock.advance(1)


def test_frozen_needs_an_aware_time():
    with pytest.raises(ValueError), clock.frozen(datetime(2026, 5, 1)):
        pass


def test_the_offset_runs_every_thread_ahead_of_wall_time(settings):
    settings.ZOEKT_CLOCK_OFFSET_SECONDS = 12 * 3600
    ahead = (clock.now() - datetime.now(UTC)).total_seconds()
    assert 12 * 3600 - 5 < ahead < 12 * 3600 + 5
    seen = []
    thread = threading.Thread(target=lambda: seen.append(clock.now()))
    thread.start()
    thread.join()
    assert (seen[0] - datetime.now(UTC)).total_seconds() > 12 * 3600 - 5
