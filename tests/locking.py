"""Holding a job's advisory lock from elsewhere, to test that the job skips."""

from __future__ import annotations

import contextlib
import threading

import psycopg
from django.db import connection, transaction

from zoekt.locks import _KEY_SPACE, LockKey, advisory_xact_lock


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


def database_conninfo() -> str:
    """The test database's libpq connection string, for a connection Django does not own."""
    db = connection.settings_dict
    parts = {
        "dbname": db["NAME"],
        "user": db["USER"],
        "password": db["PASSWORD"],
        "host": db["HOST"],
        "port": db["PORT"],
    }
    return " ".join(f"{key}={value}" for key, value in parts.items() if value)


@contextlib.contextmanager
def session_lock_held_elsewhere(key: LockKey):
    """Hold a session-level advisory lock from another connection, as another process would.

    The lock is released explicitly on the way out: a closed connection's
    backend can hold it for a moment after the client has gone, which made a
    test that ran the job straight afterwards fail now and then.
    """
    with psycopg.connect(database_conninfo(), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", [_KEY_SPACE, int(key)])
        try:
            yield
        finally:
            other.execute("SELECT pg_advisory_unlock(%s, %s)", [_KEY_SPACE, int(key)])
