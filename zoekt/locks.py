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
    # Scheduling (zoekt.scheduling): one key per scheduled task of GitLab's SchedulingService.
    # ``update_replica_states`` shares UPDATE_REPLICA_STATES with its standalone beat job.
    SCHEDULING_AUTO_INDEX_SELF_MANAGED = 5
    SCHEDULING_EVICTION = 6
    SCHEDULING_FORCE_UPDATE_OVERPROVISIONED_INDEX = 7
    SCHEDULING_INDEX_MISMATCHED_WATERMARK_CHECK = 8
    SCHEDULING_INDEX_SHOULD_BE_MARKED_AS_ORPHANED_CHECK = 9
    SCHEDULING_INDEX_SHOULD_BE_MARKED_AS_PENDING_EVICTION_CHECK = 10
    SCHEDULING_INDEX_TO_DELETE_CHECK = 11
    SCHEDULING_INDICES_TO_EVICT_CHECK = 12
    SCHEDULING_INITIAL_INDEXING = 13
    SCHEDULING_LOST_NODES_CHECK = 14
    SCHEDULING_MARK_INDICES_AS_READY = 15
    SCHEDULING_NODE_WITH_NEGATIVE_UNCLAIMED_STORAGE_BYTES_CHECK = 16
    SCHEDULING_REPO_SHOULD_BE_MARKED_AS_ORPHANED_CHECK = 17
    SCHEDULING_REPO_TO_INDEX_CHECK = 18
    SCHEDULING_REPO_TO_REINDEX_CHECK = 19
    SCHEDULING_REPO_TO_DELETE_CHECK = 20
    SCHEDULING_UPDATE_INDEX_USED_BYTES = 21
    SCHEDULING_UPDATE_INDEX_USED_STORAGE_BYTES = 22
    # Scheduling events (zoekt.scheduling.events): one key per event job that works on a
    # global scope. Per-row events claim their row instead (see the module).
    EVENT_INDEX_REPOS = 23
    EVENT_REINDEX_REPOS = 24
    EVENT_DELETE_REPOS = 25
    EVENT_ORPHAN_REPOS = 26
    EVENT_ORPHAN_INDICES = 27
    EVENT_MARK_INDICES_PENDING_EVICTION = 28
    EVENT_EVICT_INDICES = 29
    EVENT_MARK_INDICES_READY = 30
    EVENT_DELETE_INDICES = 31
    EVENT_UPDATE_INDEX_USED_STORAGE_BYTES = 32
    EVENT_SHRINK_OVERPROVISIONED_INDICES = 33
    EVENT_EVICT_OVERCOMMITTED_NODES = 34
    # Memory (zoekt.memory): the hourly auto-calibration of memory_ratio.
    CALIBRATE_MEMORY_RATIO = 35
    # Eviction (eviction.tasks): node-level decisions, one run at a time.
    EVICTION_NODE_LEVEL = 36
    # Eviction (eviction.memory_pressure): memory-pressure moves, one run at a time.
    EVICTION_MEMORY_PRESSURE = 37
    # Following GitLab (gitlab_sync.sweep): one sweep at a time, full or delta.
    GITLAB_SWEEP = 38
    # Node maintenance (zoekt.shutdowns): the settle job of the restart records.
    SETTLE_NODE_SHUTDOWNS = 39
    # The rebalance reconciler (eviction.rebalance): one run at a time.
    REBALANCE_FLEET = 40


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


@contextlib.contextmanager
def try_advisory_session_lock(key: LockKey) -> Iterator[bool]:
    """Hold a session-level advisory lock if it is free, without opening a transaction.

    For jobs made of many short transactions (each one locking a node row, say),
    where one transaction around the whole job would hold those row locks for
    its whole length. The lock is released when the block ends, and by
    PostgreSQL if the connection goes away first.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_KEY_SPACE, int(key)])
        (acquired,) = cursor.fetchone()
    try:
        yield bool(acquired)
    finally:
        if acquired:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_KEY_SPACE, int(key)])


# Per-index locks: the used-bytes refresh of one index against the callbacks that
# change what it counts. They have their own first key; the second is the index id
# reduced to 31 bits, so two indices whose ids share those bits may, rarely, wait
# for each other, which costs a few milliseconds and nothing else.
_INDEX_KEY_SPACE = 0x7A6F6569  # "zoei"


def index_used_bytes_lock(index_id: int, *, shared: bool) -> None:
    """Wait for an index's used-bytes lock until the transaction ends; call inside one.

    The refresh takes it exclusively before it sums the index's repository
    sizes; a callback takes it shared before it decides whether to mark the
    index stale. So a callback committing during a refresh either is counted
    by it or sees it and marks the index stale again. Callbacks do not wait
    for each other, and the lock lives in memory: it writes no row.
    """
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s, %s)", [_INDEX_KEY_SPACE, int(index_id) & 0x7FFFFFFF])
