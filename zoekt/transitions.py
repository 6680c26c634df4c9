"""The one place that writes an index's or a repository's state: each change a named transition.

Every module that moves an ``Index`` or a ``Repository`` from one state to
another calls one of these (``tests/test_state_owners.py`` fails on a write
of ``state`` anywhere else). A row created in its initial state
(``pending``) is born, not moved, and may be created where it is built. A
move's states have their table on the model (``Move.transition``).

Bulk stays bulk: each transition is one ``UPDATE`` of the caller's scope
(the rows it chose, and the states it takes them from: ``Index.objects.
filter(id__in=ids, state=Index.State.READY)``), setting the new state and
``updated_at`` in the same statement, and returns the rows changed. The
scope is the caller's because the rule that picks the rows (GitLab's
scheduling checks, an eviction decision, a move's swap) is the caller's; the
transitions add only the conditions that belong to the state itself (a
repository already on its way out is not marked for deletion again).
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Case, F, QuerySet, Value, When

from zoekt.models import Index, Repository

# ----------------------------------------------------------------------------
# Index: pending → initializing → ready; → orphaned, pending_eviction, evicted,
# pending_deletion on the way out
# ----------------------------------------------------------------------------


def create_ready_index(**fields) -> Index:
    """An index born ``ready``: GitLab's admin API attaches a namespace to a node that
    already holds its data (``PUT .../shards/:node_id/indexed_namespaces/:namespace_id``)."""
    return Index.objects.create(**fields, state=Index.State.READY)


def mark_indices_initializing(rows: QuerySet[Index], *, now: datetime) -> int:
    """Pending indices whose repository rows exist (initial indexing), or ready ones
    whose data a node lost (to be indexed again), become ``initializing``."""
    return rows.update(state=Index.State.INITIALIZING, updated_at=now)


def mark_indices_ready(rows: QuerySet[Index], *, now: datetime) -> int:
    """Initializing indices whose repositories are all finished become ``ready``."""
    return rows.update(state=Index.State.READY, updated_at=now)


def mark_indices_orphaned(rows: QuerySet[Index], *, now: datetime) -> int:
    """Indices without an enabled namespace or a replica become ``orphaned``."""
    return rows.update(state=Index.State.ORPHANED, updated_at=now)


def mark_indices_pending_eviction(rows: QuerySet[Index], *, now: datetime) -> int:
    """The rows not pending eviction already become ``pending_eviction`` (GitLab's
    eviction tail, ``evict_indices``, then evicts their replicas)."""
    return rows.exclude(state=Index.State.PENDING_EVICTION).update(
        state=Index.State.PENDING_EVICTION, updated_at=now
    )


def mark_indices_evicted(
    rows: QuerySet[Index], *, now: datetime, leave_replica: bool = False
) -> int:
    """Indices become ``evicted``: the indices of evicted replicas (their replica rows
    go next, in the caller's transaction), or, ``leave_replica``, one index taken out
    of its replica, which keeps its other indices."""
    if leave_replica:
        return rows.update(state=Index.State.EVICTED, zoekt_replica_id=None, updated_at=now)
    return rows.update(state=Index.State.EVICTED, updated_at=now)


def mark_indices_pending_deletion(rows: QuerySet[Index], *, now: datetime, **fields) -> int:
    """Indices whose repositories must go from their nodes first become
    ``pending_deletion`` (with ``fields``, such as a detached namespace and replica)."""
    return rows.update(**fields, state=Index.State.PENDING_DELETION, updated_at=now)


# ----------------------------------------------------------------------------
# Repository: pending → initializing → ready; failed after its retries;
# orphaned, pending_deletion → deleted on the way out
# ----------------------------------------------------------------------------

#: The states a repository leaves when it is marked for deletion: not these.
LEAVING_STATES = (Repository.State.PENDING_DELETION, Repository.State.DELETED)


def mark_repositories_initializing(rows: QuerySet[Repository], *, now: datetime) -> int:
    """The pending rows of the repositories just given an index task become
    ``initializing``."""
    return rows.filter(state=Repository.State.PENDING).update(
        state=Repository.State.INITIALIZING, updated_at=now
    )


def set_repository_indexed(repository: Repository) -> None:
    """A node indexed it: a pending or initializing repository becomes ``ready`` (set on
    the row in hand; the caller saves it with the rest of the callback's fields)."""
    if repository.state in (Repository.State.PENDING, Repository.State.INITIALIZING):
        repository.state = Repository.State.READY


def mark_repositories_pending(rows: QuerySet[Repository], *, now: datetime) -> int:
    """Repositories to index again (their node lost the data) become ``pending``."""
    return rows.update(state=Repository.State.PENDING, updated_at=now)


def spend_repository_retry(rows: QuerySet[Repository], *, retry_state: int, now: datetime) -> int:
    """A task of theirs failed for good: one retry spent; the repository goes back to
    ``retry_state`` to be tried again, or, on its last retry, becomes ``failed``."""
    return rows.update(
        retries_left=F("retries_left") - 1,
        state=Case(
            When(retries_left__lte=1, then=Value(Repository.State.FAILED)),
            default=Value(retry_state),
        ),
        updated_at=now,
    )


def mark_repositories_orphaned(rows: QuerySet[Repository], *, now: datetime) -> int:
    """Repositories without a project become ``orphaned``."""
    return rows.update(state=Repository.State.ORPHANED, updated_at=now)


def mark_repositories_pending_deletion(rows: QuerySet[Repository], *, now: datetime) -> int:
    """The rows not on their way out already become ``pending_deletion`` (the deletion
    pipeline then sends their nodes delete tasks)."""
    return rows.exclude(state__in=LEAVING_STATES).update(
        state=Repository.State.PENDING_DELETION, updated_at=now
    )


def mark_repositories_deleted(rows: QuerySet[Repository], *, now: datetime) -> int:
    """Repositories just given a delete task become ``deleted``."""
    return rows.update(state=Repository.State.DELETED, updated_at=now)
