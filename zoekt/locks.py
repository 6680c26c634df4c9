"""PostgreSQL advisory locks for jobs that must not run twice at once.

Keys live in one IntEnum and are never renumbered: a deployment mid-upgrade
runs old and new code against the same keys. Add new keys at the end.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator

from django.db import connection, transaction

# A namespace for this project's keys, so they do not collide with another
# application's advisory locks in a shared database ("zoek" in ASCII).
_KEY_SPACE = 0x7A6F656B


class LockKey(enum.IntEnum):
    UPDATE_REPLICA_STATES = 1
    REFRESH_BUFFER_FACTOR = 2
    CATALOG_UPSERT = 3
    ROLLOUT = 4


@contextlib.contextmanager
def try_advisory_lock(key: LockKey) -> Iterator[bool]:
    """Hold a transaction-scoped advisory lock if it is free; yields whether it was taken.

    The body runs inside one transaction either way; when the lock is held
    elsewhere the caller should skip its work and say so.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_KEY_SPACE, int(key)])
            (acquired,) = cursor.fetchone()
        yield bool(acquired)


def advisory_xact_lock(key: LockKey) -> None:
    """Wait for a transaction-scoped advisory lock; call inside ``transaction.atomic``."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_KEY_SPACE, int(key)])
