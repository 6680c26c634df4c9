"""What each scheduling event does: GitLab's event workers (reference 6.4) as plain functions.

Every function reads the database, does one bounded batch of work and
returns a dict of what it found and did, ready for one log line. A result
with ``re_emit`` true asks the calling Celery task (``zoekt.scheduling.events``)
to enqueue the same event again: GitLab re-emits while work remains. Here a
batch re-emits only when it was full *and* work remains, so a run that saw
everything never loops on rows it cannot change (a stale index refreshed at
the same instant, a pending repository with a pending task already).

Each function is safe to run twice at once: the global ones run under an
advisory lock taken by their task; the per-row ones claim their row here
(``initialize_index`` locks its index with ``SKIP LOCKED``, ``delete_lost_node``
locks its node and re-checks it), and every state change is a conditional
update (compare-and-set) that a second run finds already done.

Batch sizes and limits are GitLab's (reference 6.4, 6.5, 6.6, 6.7, 6.9, 4.3).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet

from zoekt import app_settings, clock, shutdowns, transitions
from zoekt.models import EnabledNamespace, Index, Namespace, Node, Repository, Task
from zoekt.reasons import Reason
from zoekt.scheduling.task_creation import create_bulk_tasks

# --- GitLab's numbers (reference 6.4) ---------------------------------------------------------
INITIAL_INDEXING_NAMESPACE_BATCH_SIZE = 1_000
INITIAL_INDEXING_INSERT_LIMIT = 10_000
REPO_TO_INDEX_BATCH_SIZE = 500
REPO_TO_REINDEX_BATCH_SIZE = 1_000
REPO_TO_DELETE_BATCH_SIZE = 500
MAX_LIVE_DELETE_TASKS = 5_000
ORPHANED_REPO_BATCH_SIZE = 1_000
ORPHANED_INDEX_BATCH_SIZE = 1_000
PENDING_EVICTION_BATCH_SIZE = 1_000
MARK_READY_BATCH_SIZE = 1_000
INDEX_TO_DELETE_BATCH_SIZE = 500
INDEX_TO_DELETE_REPOSITORY_BATCH_SIZE = 5_000
UPDATE_USED_STORAGE_BATCH_SIZE = 1_000
FORCE_UPDATE_BATCH_SIZE = 1_000
NEGATIVE_UNCLAIMED_INDEX_LIMIT = 1_000
LOST_NODE_DELETE_BATCH_SIZE = 10_000

Result = dict[str, Any]


def _ids(queryset, limit: int) -> list[int]:
    return list(queryset.order_by("id").values_list("id", flat=True)[:limit])


def id_batches(queryset, size: int) -> Iterator[list[int]]:
    """The ids of ``queryset`` in ascending batches of ``size`` (keyset pagination).

    A short batch is the last: no query is made to find out.
    """
    after = 0
    while True:
        batch = list(
            queryset.filter(id__gt=after).order_by("id").values_list("id", flat=True)[:size]
        )
        if not batch:
            return
        yield batch
        if len(batch) < size:
            return
        after = batch[-1]


def _mark_in_batch(
    model,
    scope: Callable[[QuerySet], QuerySet],
    limit: int,
    mark: Callable[..., int],
) -> int:
    """Apply the transition ``mark`` (``zoekt.transitions``) to up to ``limit`` rows of
    ``scope`` (lowest ids first); returns the count.

    The scope is applied again in the UPDATE, so a row that left it since it
    was picked is not touched.
    """
    ids = _ids(scope(model.objects.all()), limit)
    if not ids:
        return 0
    return mark(scope(model.objects.filter(id__in=ids)), now=clock.now())


# ----------------------------------------------------------------------------
# Initial indexing (reference 6.6)
# ----------------------------------------------------------------------------

_INSERT_REPOSITORIES_SQL = """
INSERT INTO zoekt_repositories (zoekt_index_id, project_id, project_identifier, created_at,
                                updated_at)
SELECT %(index_id)s, p.id, p.id, %(now)s, %(now)s
FROM projects p
WHERE p.project_namespace_id = ANY(%(namespace_ids)s)
  AND NOT EXISTS (
      SELECT 1 FROM zoekt_repositories r
      WHERE r.zoekt_index_id = %(index_id)s AND r.project_identifier = p.id
  )
ORDER BY p.id
ON CONFLICT DO NOTHING
"""


def initialize_index(index_id: int) -> Result:
    """Create the repository rows of one pending index's range, then mark it initializing.

    Project namespaces under the root, restricted to the index's inclusive
    ``project_namespace_id`` range, are walked in id batches of 1,000; the
    projects without a repository row in this index get one (the database
    defaults: state pending, 10 retries, schema version 0). Once 10,000 rows
    or more were inserted the run stops, the index stays pending and the
    event is emitted again. Otherwise the index becomes ``initializing``.

    The index row is locked with ``SKIP LOCKED`` for the run: a second run for
    the same index finds it claimed and does nothing.
    """
    base: Result = {"index_id": index_id}
    now = clock.now()
    with transaction.atomic():
        index = Index.objects.select_for_update(skip_locked=True).filter(pk=index_id).first()
        if index is None:
            claimed = Index.objects.filter(pk=index_id).exists()
            reason = Reason.INDEX_CLAIMED if claimed else Reason.INDEX_NOT_FOUND
            return {**base, "skipped": reason, "re_emit": False}
        if index.state != Index.State.PENDING:
            return {**base, "skipped": Reason.INDEX_NOT_PENDING, "re_emit": False}
        if (
            index.zoekt_enabled_namespace_id is None
            or not EnabledNamespace.objects.filter(pk=index.zoekt_enabled_namespace_id).exists()
        ):
            return {**base, "skipped": Reason.ENABLED_NAMESPACE_NOT_FOUND, "re_emit": False}

        namespaces = Namespace.objects.project_namespaces_under(index.namespace_id)
        start = index.metadata.get("project_namespace_id_from")
        end = index.metadata.get("project_namespace_id_to")
        if start is not None:
            namespaces = namespaces.filter(id__gte=start)
        if end is not None:
            namespaces = namespaces.filter(id__lte=end)

        inserted = 0
        batches = 0
        capped = False
        for batch in id_batches(namespaces, INITIAL_INDEXING_NAMESPACE_BATCH_SIZE):
            batches += 1
            with connection.cursor() as cursor:
                cursor.execute(
                    _INSERT_REPOSITORIES_SQL,
                    {"index_id": index.id, "now": now, "namespace_ids": batch},
                )
                inserted += cursor.rowcount
            if inserted >= INITIAL_INDEXING_INSERT_LIMIT:
                capped = True
                break
        if not capped:
            transitions.mark_indices_initializing(
                Index.objects.filter(pk=index.id, state=Index.State.PENDING), now=now
            )
    return {
        **base,
        "namespace_id": index.namespace_id,
        "node_id": index.zoekt_node_id,
        "namespace_batches": batches,
        "repositories_created": inserted,
        "index_state": "pending" if capped else "initializing",
        "re_emit": capped,
    }


# ----------------------------------------------------------------------------
# Repositories: index, reindex, orphan, delete (reference 6.4, 6.9, 6.10, 7.1)
# ----------------------------------------------------------------------------


def index_repos() -> Result:
    """Index tasks for up to 500 pending repositories (``repo_to_index_check``)."""
    ids = _ids(Repository.objects.should_be_indexed(), REPO_TO_INDEX_BATCH_SIZE)
    created = create_bulk_tasks(Repository.objects.filter(id__in=ids)) if ids else 0
    full = len(ids) == REPO_TO_INDEX_BATCH_SIZE
    remaining = full and Repository.objects.should_be_indexed().exists()
    return {
        "repositories_found": len(ids),
        "tasks_created": created,
        "re_emit": bool(remaining and created),
    }


def reindexable_repositories(node: Node):
    """A node's ready repositories indexed with an older schema than the node builds now.

    GitLab's scope also takes pending and initializing repositories (every new
    row has schema version 0); those are queued or in flight already and will
    be indexed with the node's current schema, so only ``ready`` ones are taken.
    """
    return Repository.objects.filter(
        zoekt_index__zoekt_node_id=node.id,
        state=Repository.State.READY,
        schema_version__lt=node.schema_version,
    )


def reindex_repos(node_id: int) -> Result:
    """Index tasks for up to 1,000 of one node's outdated repositories (reference 6.10)."""
    base: Result = {"node_id": node_id, "re_emit": False}
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return {**base, "skipped": Reason.NODE_NOT_FOUND}
    if not node.is_online():
        return {**base, "skipped": Reason.NODE_OFFLINE}
    ids = _ids(reindexable_repositories(node), REPO_TO_REINDEX_BATCH_SIZE)
    created = create_bulk_tasks(Repository.objects.filter(id__in=ids)) if ids else 0
    return {
        **base,
        "schema_version": node.schema_version,
        "repositories_found": len(ids),
        "tasks_created": created,
    }


def orphan_repos() -> Result:
    """Mark up to 1,000 repositories without a project ``orphaned``; re-emit at exactly 1,000."""
    updated = _mark_in_batch(
        Repository,
        lambda rows: rows.should_be_marked_as_orphaned(),
        ORPHANED_REPO_BATCH_SIZE,
        transitions.mark_repositories_orphaned,
    )
    return {"repositories_marked_orphaned": updated, "re_emit": updated == ORPHANED_REPO_BATCH_SIZE}


def live_delete_task_count(limit: int = MAX_LIVE_DELETE_TASKS) -> int:
    """Pending or processing delete tasks of existing nodes, counted up to ``limit``."""
    return (
        Task.objects.filter(task_type=Task.TaskType.DELETE_REPO)
        .pending_or_processing()
        .join_nodes()[:limit]
        .count()
    )


def delete_repos() -> Result:
    """Delete tasks for up to 500 orphaned or pending-deletion repositories (reference 6.9).

    Runs only while fewer than 5,000 delete tasks of existing nodes are
    pending or processing. The repositories become ``deleted``.
    """
    live = live_delete_task_count()
    if live >= MAX_LIVE_DELETE_TASKS:
        return {
            "live_delete_tasks": live,
            "skipped": Reason.TOO_MANY_DELETE_TASKS,
            "re_emit": False,
        }
    ids = _ids(Repository.objects.should_be_deleted(), REPO_TO_DELETE_BATCH_SIZE)
    created = (
        create_bulk_tasks(Repository.objects.filter(id__in=ids), Task.TaskType.DELETE_REPO)
        if ids
        else 0
    )
    full = len(ids) == REPO_TO_DELETE_BATCH_SIZE
    remaining = full and Repository.objects.should_be_deleted().exists()
    return {
        "live_delete_tasks": live,
        "repositories_found": len(ids),
        "tasks_created": created,
        "re_emit": bool(remaining and created),
    }


# ----------------------------------------------------------------------------
# Indices: orphan, ready, delete (reference 2.1, 6.9; evict, 6.5(b): eviction.actions)
# ----------------------------------------------------------------------------


def orphan_indices() -> Result:
    """Mark up to 1,000 indices without an enabled namespace or replica ``orphaned``."""
    updated = _mark_in_batch(
        Index,
        lambda rows: rows.should_be_marked_as_orphaned(),
        ORPHANED_INDEX_BATCH_SIZE,
        transitions.mark_indices_orphaned,
    )
    return {"indices_marked_orphaned": updated, "re_emit": False}


def mark_indices_ready() -> Result:
    """Up to 1,000 initializing indices whose repositories are all ready or failed become ready.

    The condition is re-checked in the update itself, so a repository added
    meanwhile keeps its index initializing.
    """
    updated = _mark_in_batch(
        Index,
        lambda rows: rows.filter(state=Index.State.INITIALIZING).with_all_finished_repositories(),
        MARK_READY_BATCH_SIZE,
        transitions.mark_indices_ready,
    )
    return {"indices_marked_ready": updated, "re_emit": False}


def delete_indices() -> Result:
    """Up to 500 orphaned or pending-deletion indices: drain their repositories, or destroy them.

    An index with repositories has each of them that has a project and is
    neither pending deletion nor already ``deleted`` marked
    ``pending_deletion`` (walked by project id in batches of 5,000, so rows
    without a project, already orphaned and deletable, are not reached). An
    index without repositories is destroyed.

    GitLab resets ``deleted`` repositories too, which sends a second delete
    task every minute while the first is still in flight; they are left alone.
    """
    now = clock.now()
    ids = _ids(Index.objects.should_be_deleted(), INDEX_TO_DELETE_BATCH_SIZE)
    if not ids:
        return {"indices_found": 0, "repositories_marked": 0, "indices_destroyed": 0}
    has_repositories = Exists(Repository.objects.filter(zoekt_index=OuterRef("pk")))
    with_repositories = list(
        Index.objects.filter(id__in=ids).filter(has_repositories).values_list("id", flat=True)
    )
    marked = 0
    for index_id in with_repositories:
        after = None
        while True:
            scope = Repository.objects.filter(
                zoekt_index_id=index_id, project_id__isnull=False
            ).exclude(state__in=(Repository.State.PENDING_DELETION, Repository.State.DELETED))
            if after is not None:
                scope = scope.filter(project_id__gt=after)
            batch = list(
                scope.order_by("project_id").values_list("project_id", flat=True)[
                    :INDEX_TO_DELETE_REPOSITORY_BATCH_SIZE
                ]
            )
            if not batch:
                break
            after = batch[-1]
            marked += transitions.mark_repositories_pending_deletion(
                Repository.objects.filter(zoekt_index_id=index_id, project_id__in=batch), now=now
            )
            if len(batch) < INDEX_TO_DELETE_REPOSITORY_BATCH_SIZE:
                break
    draining = set(with_repositories)
    empty = [i for i in ids if i not in draining]
    destroyed = 0
    if empty:
        # Still deletable and still empty at delete time.
        _, per_model = (
            Index.objects.filter(id__in=empty, state__in=Index.SHOULD_BE_DELETED_STATES)
            .exclude(has_repositories)
            .delete()
        )
        destroyed = per_model.get(Index._meta.label, 0)
    return {
        "indices_found": len(ids),
        "indices_with_repositories": len(with_repositories),
        "repositories_marked": marked,
        "indices_destroyed": destroyed,
        "re_emit": False,
    }


# ----------------------------------------------------------------------------
# Storage: used bytes, reservations, over-committed nodes (reference 4.3, 6.5(c))
# ----------------------------------------------------------------------------


def update_index_used_storage_bytes() -> Result:
    """Refresh up to 1,000 stale indices, oldest refresh first (reference 4.3).

    The indices of one node are refreshed together, up to ``REFRESH_PER_TRANSACTION`` in
    one short transaction (it locks the node row while it claims bytes).
    """
    ids = list(
        Index.objects.with_stale_used_storage_bytes_updated_at()
        .order_by("used_storage_bytes_updated_at", "id")
        .values_list("id", flat=True)[:UPDATE_USED_STORAGE_BATCH_SIZE]
    )
    refreshed = _refresh(ids, skip_used_storage_bytes=False)
    full = len(ids) == UPDATE_USED_STORAGE_BATCH_SIZE
    remaining = full and Index.objects.with_stale_used_storage_bytes_updated_at().exists()
    return {"indices_refreshed": refreshed, "re_emit": bool(remaining)}


def overprovisioned_indices():
    """Ready, overprovisioned indices whose used bytes are fresh: their reservation can shrink."""
    return Index.objects.filter(
        state=Index.State.READY, watermark_level=Index.WatermarkLevel.OVERPROVISIONED
    ).with_latest_used_storage_bytes_updated_at()


def shrink_overprovisioned_indices() -> Result:
    """Resize up to 1,000 over-provisioned indices without recounting used bytes (4.3)."""
    ids = _ids(overprovisioned_indices(), FORCE_UPDATE_BATCH_SIZE)
    refreshed = _refresh(ids, skip_used_storage_bytes=True)
    full = len(ids) == FORCE_UPDATE_BATCH_SIZE
    remaining = full and overprovisioned_indices().exists()
    return {"indices_resized": refreshed, "re_emit": bool(remaining)}


#: Indices of one node refreshed in one transaction (it holds the node row meanwhile).
REFRESH_PER_TRANSACTION = 50


def _refresh(ids: list[int], *, skip_used_storage_bytes: bool) -> int:
    """Refresh the indices node by node, up to ``REFRESH_PER_TRANSACTION`` at a time, so a
    heartbeat of a node waits for one short transaction at most."""
    by_node: dict[int, list[int]] = {}
    for index_id, node_id in (
        Index.objects.filter(id__in=ids).order_by("id").values_list("id", "zoekt_node_id")
    ):
        by_node.setdefault(node_id, []).append(index_id)
    refreshed = 0
    for node_id, index_ids in sorted(by_node.items()):
        for first in range(0, len(index_ids), REFRESH_PER_TRANSACTION):
            refreshed += Index.refresh_storage_of(
                node_id,
                index_ids[first : first + REFRESH_PER_TRANSACTION],
                skip_used_storage_bytes=skip_used_storage_bytes,
            )
    return refreshed


# ----------------------------------------------------------------------------
# Lost nodes (reference 6.7)
# ----------------------------------------------------------------------------


def delete_node_rows(node_id: int) -> tuple[int, int]:
    """Delete the node's repositories, then its indices, 10,000 at a time, then the node;
    returns (repositories, indices) deleted. Replicas are left alone (a replica left
    without indices is re-created by the rollout). In the caller's transaction, which
    holds the node row's lock: lost-node handling, and an operator's delete
    (``zoekt.node_deletion``)."""
    repositories = 0
    while True:
        ids = list(
            Repository.objects.filter(zoekt_index__zoekt_node_id=node_id).values_list(
                "id", flat=True
            )[:LOST_NODE_DELETE_BATCH_SIZE]
        )
        if not ids:
            break
        repositories += Repository.objects.filter(id__in=ids).delete()[0]
    indices = 0
    while True:
        ids = list(
            Index.objects.filter(zoekt_node_id=node_id).values_list("id", flat=True)[
                :LOST_NODE_DELETE_BATCH_SIZE
            ]
        )
        if not ids:
            break
        indices += Index.objects.filter(id__in=ids).delete()[1].get(Index._meta.label, 0)
    Node.objects.filter(pk=node_id).delete()
    return repositories, indices


def delete_lost_node(node_id: int) -> Result:
    """Delete a lost node with its indices and their repositories, in one transaction.

    Re-checked first: lost-node handling enabled, the node exists (a search
    node), is still lost, and is not being restarted within its allowed delay
    (``Node.objects.in_restart``, docs/operations.md); its shutdown records
    then say it was handled as lost. The node row is locked, its repositories and
    then its indices are deleted 10,000 at a time, then the node. Replicas are
    left alone (a replica left without indices is re-created by the rollout);
    the node's tasks stay in ``zoekt_tasks``, ignored without their node.
    """
    started = time.perf_counter()
    base: Result = {"node_id": node_id, "re_emit": False}
    threshold = app_settings.current().lost_node_threshold_seconds
    if not threshold:
        return {**base, "skipped": Reason.LOST_NODE_HANDLING_DISABLED}
    with transaction.atomic():
        node = Node.objects.for_search().select_for_update().filter(pk=node_id).first()
        if node is None:
            return {**base, "skipped": Reason.NODE_NOT_FOUND}
        if not node.is_lost(threshold):
            return {**base, "skipped": Reason.NODE_NOT_LOST}
        # An operator is restarting it, within the allowed delay: its indices stay.
        now = clock.now()
        if Node.objects.filter(pk=node.id).in_restart(now).exists():
            return {**base, "skipped": Reason.NODE_IN_RESTART}
        shutdowns_closed = shutdowns.close_for_lost_node(node, now)
        repositories, indices = delete_node_rows(node.id)
        name = node.name
        last_seen_at = node.last_seen_at
    return {
        **base,
        "node_name": name,
        "last_seen_at": last_seen_at.isoformat(),
        "repositories_deleted": repositories,
        "indices_deleted": indices,
        "node_deleted": True,
        "shutdowns_closed": shutdowns_closed,
        "transaction_seconds": round(time.perf_counter() - started, 4),
    }
