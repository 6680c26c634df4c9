"""Holding a job's advisory lock from elsewhere, to test that the job skips."""

from __future__ import annotations

import contextlib
import threading

from django.db import connection, transaction

from zoekt.locks import LockKey, advisory_xact_lock


@contextlib.contextmanager
def advisory_lock_held_elsewhere(key: LockKey):
    """Hold the job's advisory lock from a second database connection, in another thread."""
    taken, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                advisory_xact_lock(key)
                taken.set()
                release.wait(timeout=30)
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)
        finally:
            taken.set()
            connection.close()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert taken.wait(timeout=30), "the holder never took the lock"
        assert not errors, errors
        yield
    finally:
        release.set()
        holder.join(timeout=30)
    assert not errors, errors
