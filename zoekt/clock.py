"""The one clock every time-based rule reads.

Online and lost thresholds, debounces, sustain periods and cooldowns all ask
``clock.now()``, never ``timezone.now()`` directly. Tests freeze or step it
(``clock.frozen(t)``, ``clock.advance(seconds)``); a simulation can run the
whole fleet ahead of wall time with the ``ZOEKT_CLOCK_OFFSET_SECONDS`` setting
(read from the environment in ``config/settings.py``; every thread reads the
setting on each call, so a test or a replay can move it while servers run).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_state = threading.local()


def _offset() -> timedelta:
    # Imported here: the clock is imported by pure modules, which load no Django.
    from django.conf import settings

    if not settings.configured:
        return timedelta(0)
    return timedelta(seconds=getattr(settings, "ZOEKT_CLOCK_OFFSET_SECONDS", 0.0))


def now() -> datetime:
    """The current time, timezone-aware (UTC)."""
    frozen = getattr(_state, "frozen", None)
    if frozen is not None:
        return frozen
    return datetime.now(UTC) + _offset()


@contextlib.contextmanager
def frozen(at: datetime) -> Iterator[None]:
    """Stop the clock at ``at`` (aware) for the duration of the block."""
    if at.tzinfo is None:
        raise ValueError("frozen() needs a timezone-aware datetime")
    previous = getattr(_state, "frozen", None)
    _state.frozen = at
    try:
        yield
    finally:
        _state.frozen = previous


def advance(seconds: float) -> datetime:
    """Step a frozen clock forward; returns the new time."""
    current = getattr(_state, "frozen", None)
    if current is None:
        raise RuntimeError("advance() only steps a frozen clock; use frozen() first")
    _state.frozen = current + timedelta(seconds=seconds)
    return _state.frozen
