"""The fleet's state changes that the node API, the operators and the jobs ask for by
name, each a ``do_*`` function: heartbeats, callbacks, failed tasks, replica states,
evictions.

Each returns plain data describing what it did, so the Celery task that
calls it can log one line. Not every write of the domain is here: the
scheduling jobs (``zoekt.scheduling``), the catalog (``zoekt.catalog_rows``),
the operator actions (``zoekt.operator_actions``), the planner's apply and
eviction make their own. An index's or a repository's state, whoever changes
it, changes only through a named transition of ``zoekt.transitions`` (a
move's through ``Move.transition``).
"""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import DateTimeField, Exists, F, OuterRef, Q, Value
from django.db.models.functions import Greatest

from zoekt import (
    admission,
    app_settings,
    capacity,
    clock,
    hooks,
    locks,
    memory,
    restarts,
    transitions,
)
from zoekt.logging import get_logger
from zoekt.models import HandledTaskFailure, Index, Move, Node, Replica, Repository, Task

log = get_logger(__name__)


def do_update_replica_states() -> dict[str, int]:
    """Recompute replica states in bulk (reference 2.3).

    A pending replica whose indices are all ready becomes ready; a ready
    replica with any index that is not ready goes back to pending. A replica
    without indices stays pending. Running it twice changes nothing more.
    """
    with transaction.atomic():
        promoted = (
            Replica.objects.filter(state=Replica.State.PENDING)
            .with_all_ready_indices()
            .update(state=Replica.State.READY)
        )
        demoted = (
            Replica.objects.filter(state=Replica.State.READY)
            .with_non_ready_indices()
            .update(state=Replica.State.PENDING)
        )
    return {"replicas_marked_ready": promoted, "replicas_marked_pending": demoted}


# ----------------------------------------------------------------------------
# Node protocol: heartbeat and callback
# ----------------------------------------------------------------------------

_UPSERT_NODE_SQL = """
INSERT INTO zoekt_nodes AS n (
    uuid, index_base_url, search_base_url, last_seen_at, total_bytes, used_bytes,
    indexed_bytes, usable_storage_bytes, schema_version, services, metadata,
    webserver_last_seen_at, high_watermark_exceeded_at, created_at, updated_at
) VALUES (
    %(uuid)s, %(index_base_url)s, %(search_base_url)s, %(now)s, %(total)s, %(used)s,
    COALESCE(%(indexed)s, 0), %(total)s - %(used)s + COALESCE(%(indexed)s, 0),
    COALESCE(%(schema_version)s, 0), COALESCE(%(services)s::smallint[], '{0}'),
    %(metadata)s::jsonb, CASE WHEN %(webserver_seen)s THEN %(now)s::timestamptz END,
    CASE WHEN %(total)s > 0 AND %(used)s >= %(total)s * %(high)s THEN %(now)s::timestamptz END,
    %(now)s, %(now)s
)
ON CONFLICT (uuid) DO UPDATE SET
    index_base_url = EXCLUDED.index_base_url,
    search_base_url = EXCLUDED.search_base_url,
    last_seen_at = EXCLUDED.last_seen_at,
    total_bytes = EXCLUDED.total_bytes,
    used_bytes = EXCLUDED.used_bytes,
    indexed_bytes = COALESCE(%(indexed)s, n.indexed_bytes),
    schema_version = COALESCE(%(schema_version)s, n.schema_version),
    services = COALESCE(%(services)s::smallint[], n.services),
    metadata = n.metadata || EXCLUDED.metadata,
    webserver_last_seen_at = COALESCE(EXCLUDED.webserver_last_seen_at, n.webserver_last_seen_at),
    -- The eviction sustain clock: started on a crossing of the high watermark,
    -- kept through dips into the hysteresis band, reset below it.
    high_watermark_exceeded_at = CASE
        WHEN EXCLUDED.total_bytes > 0 AND EXCLUDED.used_bytes >= EXCLUDED.total_bytes * %(high)s
            THEN COALESCE(n.high_watermark_exceeded_at, EXCLUDED.last_seen_at)
        WHEN EXCLUDED.total_bytes <= 0
            OR EXCLUDED.used_bytes < EXCLUDED.total_bytes * %(reset_below)s THEN NULL
        ELSE n.high_watermark_exceeded_at
    END,
    usable_storage_bytes = CASE
        WHEN n.usable_storage_bytes_locked_until > %(now)s THEN n.usable_storage_bytes
        ELSE EXCLUDED.total_bytes - EXCLUDED.used_bytes + COALESCE(%(indexed)s, n.indexed_bytes)
    END,
    usable_storage_bytes_locked_until = CASE
        WHEN n.usable_storage_bytes_locked_until > %(now)s THEN n.usable_storage_bytes_locked_until
    END,
    updated_at = EXCLUDED.updated_at
WHERE n.updated_at <= %(debounce_before)s
RETURNING id, (xmax = 0) AS inserted, schema_version, metadata
"""


@dataclasses.dataclass(frozen=True)
class HeartbeatResult:
    node_id: int
    registered: bool
    saved: bool
    schema_version: int
    metadata: dict


def do_record_heartbeat(node_uuid: uuid.UUID, data: dict) -> HeartbeatResult:
    """Upsert the node from a validated heartbeat, in one statement.

    A new node is inserted (``registered``). An existing row is rewritten
    unless it was written less than 5 s ago (GitLab's save debounce), in which
    case nothing is written (``saved`` is false) and the stored values stand.
    """
    now = clock.now()
    high = capacity.watermark_limits(app_settings.development_watermarks())[1]
    metadata = {"name": data["node.name"]}
    for key in ("task_count", "concurrency", "version"):
        if f"node.{key}" in data:
            metadata[key] = data[f"node.{key}"]
    # GitLab stamps webserver_last_seen_at when the heartbeat relays the webserver's health.
    webserver_seen = False
    if "process_health" in data:
        metadata["process_health"] = data["process_health"]
        webserver_seen = "webserver" in data["process_health"]
    services = None
    if "node.services" in data:
        labels = {label: value for value, label in Node.Service.choices}
        services = [labels[name] for name in data["node.services"] if name in labels]
    params = {
        "uuid": node_uuid,
        "index_base_url": data["node.url"],
        "search_base_url": data.get("node.search_url") or data["node.url"],
        "now": now,
        "total": data["disk.all"],
        "used": data["disk.used"],
        "indexed": data.get("disk.indexed"),
        "schema_version": data.get("node.schema_version"),
        "services": services,
        "metadata": json.dumps(metadata),
        "webserver_seen": webserver_seen,
        "debounce_before": now - timedelta(seconds=capacity.DEBOUNCE_DELAY_SECONDS),
        "high": high,
        "reset_below": capacity.hysteresis_floor(high),
    }
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT_NODE_SQL, params)
        row = cursor.fetchone()
        if row is not None:
            node_id, inserted, schema_version, stored_metadata = row
            return HeartbeatResult(
                node_id, bool(inserted), True, schema_version, _json_value(stored_metadata)
            )
        cursor.execute(
            "SELECT id, schema_version, metadata FROM zoekt_nodes WHERE uuid = %s", [node_uuid]
        )
        node_id, schema_version, stored_metadata = cursor.fetchone()
    return HeartbeatResult(
        node_id, False, False, schema_version, {**_json_value(stored_metadata), **metadata}
    )


def _json_value(value) -> dict:
    return json.loads(value) if isinstance(value, str) else (value or {})


@dataclasses.dataclass(frozen=True)
class HeartbeatReply:
    id: int
    truncate: bool
    tasks: list[dict]
    pull_frequency: str
    stop_indexing: bool

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def do_heartbeat(node_uuid: uuid.UUID, data: dict) -> HeartbeatReply:
    """Record a heartbeat and hand the node its tasks (reference 3.2, 7.2)."""
    from zoekt import protocol

    settings_now = app_settings.current()
    # A node being restarted: read its previous heartbeat before this one is written, so
    # the record can tell that it went away and came back (zoekt.restarts).
    restarting = restarts.live_restart_before_heartbeat(node_uuid)
    result = do_record_heartbeat(node_uuid, data)
    if result.registered:
        # A node joined: the reconciler may move indices onto it (docs/balance.md), and
        # its history starts now (docs/dashboard.md, "History").
        hooks.rebalance_fleet_on_commit()
        hooks.sample_node_on_commit(result.node_id)
    if restarting is not None:
        restarts.do_observe_node_heartbeat(*restarting)
    limit = capacity.concurrency_limit(
        result.metadata.get("concurrency"),
        result.metadata.get("concurrency_override"),
        settings_now.cpu_to_tasks_ratio,
    )
    development = app_settings.development_watermarks()
    percent = capacity.storage_percent_used(data["disk.used"], data["disk.all"])
    critical = capacity.node_watermark(percent, development) == capacity.NodeWatermark.CRITICAL
    tasks: list[dict] = []
    backlog = None
    if not settings_now.indexing_paused:
        if critical:
            log.warning(
                "heartbeat_critical_watermark",
                node_id=result.node_id,
                storage_percent_used=round(percent, 4),
            )
        if settings_now.indexing_admission == admission.MODE_GITLAB:
            handed = protocol.hand_out_tasks(result.node_id, limit, only_delete=critical)
        else:
            low, high, _critical = capacity.watermark_limits(development)
            room = admission.NodeRoom(
                slots=limit,
                total_bytes=data["disk.all"],
                used_bytes=data["disk.used"],
                low_watermark=low,
                high_watermark=high,
                memory_critical=settings_now.node_memory_budget_bytes is not None
                and memory.critical_memory_watermark_exceeded(
                    result.metadata, settings_now.node_memory_budget_bytes
                ),
            )
            handed, _decided = protocol.hand_out_admitted(
                result.node_id,
                room,
                only_delete=critical,
                temporary_space_factor=settings_now.indexing_temporary_space_factor,
            )
        backlog = handed.backlog
        tasks = protocol.serialize_tasks(
            handed.tasks, node_schema_version=result.schema_version, zoekt_settings=settings_now
        )
    return HeartbeatReply(
        id=result.node_id,
        truncate=result.registered,
        tasks=tasks,
        pull_frequency=protocol.task_pull_frequency(
            protocol.pending_backlog(result.node_id, limit) if backlog is None else backlog, limit
        ),
        stop_indexing=settings_now.indexing_paused or critical,
    )


@dataclasses.dataclass(frozen=True)
class CallbackOutcome:
    """What a callback did, as data: ``action`` is a stable code."""

    action: str
    task_id: int | None = None


INDEX_DEBOUNCE_SECONDS = 30
# Tasks are kept for 7 days after their partition's newest row (reference 1.6); a
# failed task older than that is no longer swept, and its handled mark can go.
TASK_FAILED_KEPT_SECONDS = 8 * 24 * 3600
# A failed task not handled this long after it failed lost its message: swept.
TASK_FAILED_SWEEP_AFTER_SECONDS = 5 * 60
TASK_FAILED_SWEEP_BATCH = 1000


def do_apply_callback(node: Node, data: dict) -> CallbackOutcome:
    """Apply a node's report on one of its tasks (reference 7.5). Safe to repeat.

    ``payload`` is free JSON; one without a ``task_id`` names no task and is
    ignored, as GitLab ignores a task it cannot find.
    """
    task_id = data["payload"].get("task_id")
    if task_id is None:
        return CallbackOutcome("ignored_unknown_task", None)
    now = clock.now()
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(id=task_id, zoekt_node_id=node.id).first()
        if task is None:
            return CallbackOutcome("ignored_unknown_task", task_id)
        if data["success"]:
            return _apply_success(task, node, data, now)
        return _apply_failure(task, now)


def _apply_success(task: Task, node: Node, data: dict, now) -> CallbackOutcome:
    if task.state == Task.State.DONE:
        return CallbackOutcome("ignored_already_done", task.id)
    if task.task_type == Task.TaskType.DELETE_REPO:
        repository = Repository.objects.filter(id=task.zoekt_repository_id)
        index_id = repository.values_list("zoekt_index_id", flat=True).first()
        repository.delete()
        if index_id is not None:
            # Its size leaves the index's used bytes (GitLab leaves them until a later index).
            _mark_index_stale(index_id, now)
    else:
        repo = Repository.objects.select_for_update().filter(id=task.zoekt_repository_id).first()
        if repo is not None:
            _record_indexed(repo, node, data, now)
    Task.objects.filter(id=task.id).update(state=Task.State.DONE, updated_at=now)
    return CallbackOutcome("done", task.id)


def _record_indexed(repo: Repository, node: Node, data: dict, now) -> None:
    repo.indexed_at = now
    transitions.set_repository_indexed(repo)
    stats = (data.get("additional_payload") or {}).get("repo_stats") or {}
    if "size_in_bytes" in stats:
        repo.size_bytes = stats["size_in_bytes"]
    if "index_file_count" in stats:
        repo.index_file_count = stats["index_file_count"]
    repo.retries_left = Repository.DB_DEFAULT_RETRIES_LEFT
    repo.schema_version = node.schema_version
    repo.save(
        update_fields=[
            "indexed_at",
            "state",
            "size_bytes",
            "index_file_count",
            "retries_left",
            "schema_version",
        ]
    )
    _mark_index_stale(repo.zoekt_index_id, now)


def _mark_index_stale(index_id: int, now) -> None:
    """Advance the index's ``last_indexed_at`` so that its used bytes are recounted (4.3).

    The write is skipped when it would change nothing the refresh reads: the
    index is already stale (stamped after its last refresh, so the next one
    counts this callback too) and was stamped less than 30 s ago (GitLab's
    debounce, which keeps ``last_indexed_at`` within 30 s of the newest
    index). GitLab skips it whenever the stamp is less than 30 s old, stale or
    not: a refresh that runs less than 30 s after a stamp leaves the callbacks
    after it uncounted until one comes 30 s after the stamp, and for good when
    indexing stops first. Here an index gets at most one write per refresh of
    it and one per 30 s.

    Under the index's used-bytes lock (shared; the refresh holds it exclusively
    while it counts) the choice sees any refresh that did not count this
    callback, and the stamp is never older than that refresh, whichever clock
    it read.
    """
    locks.index_used_bytes_lock(index_id, shared=True)
    Index.objects.filter(
        Q(last_indexed_at__lt=F("used_storage_bytes_updated_at"))
        | Q(last_indexed_at__lt=now - timedelta(seconds=INDEX_DEBOUNCE_SECONDS)),
        id=index_id,
    ).update(
        last_indexed_at=Greatest(
            Value(now, output_field=DateTimeField()), F("used_storage_bytes_updated_at")
        ),
        updated_at=now,
    )


def retry_delay_seconds(retries_left: int, jitter_fraction: float) -> float:
    """GitLab's backoff: 5 min × 2^attempt, plus 0–50 % jitter (``jitter_fraction`` in [0, 1])."""
    attempt = Task.MODEL_DEFAULT_RETRIES_LEFT - retries_left
    delay = Task.RETRY_DELAY_SECONDS * (2**attempt)
    return delay + delay * 0.5 * jitter_fraction


def _apply_failure(task: Task, now) -> CallbackOutcome:
    """GitLab's retry rule for every task that is not failed yet, pending ones too (7.4).

    Two exceptions keep a report safe to repeat: a task that is finished (done,
    skipped, orphaned) is left alone, where GitLab would spend a retry on it and
    could even fail a done task; and a task whose ``perform_at`` is in the future
    has not been offered since it was scheduled, so the report is a repeat of
    the one that scheduled it (or is about no run of it) and spends nothing.
    """
    if task.state == Task.State.FAILED:
        return CallbackOutcome("ignored_already_failed", task.id)
    if task.state not in (Task.State.PENDING, Task.State.PROCESSING):
        return CallbackOutcome("ignored_not_processing", task.id)
    if task.perform_at > now:
        return CallbackOutcome("ignored_already_rescheduled", task.id)
    if task.retries_left > 1:
        delay = retry_delay_seconds(task.retries_left, random.random())
        Task.objects.filter(id=task.id).update(
            retries_left=task.retries_left - 1,
            perform_at=now + timedelta(seconds=delay),
            updated_at=now,
        )
        return CallbackOutcome("retry_scheduled", task.id)
    Task.objects.filter(id=task.id).update(state=Task.State.FAILED, retries_left=0, updated_at=now)
    hooks.handle_task_failed_on_commit(task.id)
    return CallbackOutcome("failed", task.id)


def do_handle_task_failed(task_id: int) -> dict:
    """A task failed for good: spend one of its repository's retries (reference 7.4)."""
    task = Task.objects.filter(id=task_id, state=Task.State.FAILED).first()
    if task is None:
        return {"task_id": task_id, "handled": False, "reason": "task_not_failed"}
    retry_state = (
        Repository.State.PENDING_DELETION
        if task.task_type == Task.TaskType.DELETE_REPO
        else Repository.State.PENDING
    )
    now = clock.now()
    with transaction.atomic():
        # A redelivered or swept event must not spend a second retry: the mark and the
        # retry commit together, and the database refuses a second mark.
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO zoekt_handled_task_failures (task_id, handled_at) VALUES (%s, %s) "
                "ON CONFLICT DO NOTHING RETURNING task_id",
                [task_id, now],
            )
            if cursor.fetchone() is None:
                return {"task_id": task_id, "handled": False, "reason": "already_handled"}
        updated = transitions.spend_repository_retry(
            Repository.objects.filter(id=task.zoekt_repository_id, retries_left__gt=0),
            retry_state=retry_state,
            now=now,
        )
    repo = Repository.objects.filter(id=task.zoekt_repository_id).values("state").first()
    return {
        "task_id": task_id,
        "handled": bool(updated),
        "repository_state": repo["state"] if repo else None,
    }


def do_sweep_failed_tasks(*, now=None) -> dict:
    """Handle the failed tasks whose ``handle_task_failed`` message never ran (the broker
    was down when it was sent, or it was lost), from the database alone; and forget
    the handled marks of tasks no longer kept. Safe to run twice."""
    now = now or clock.now()
    handled = HandledTaskFailure.objects.filter(task_id=OuterRef("id"))
    ids = list(
        Task.objects.filter(
            state=Task.State.FAILED,
            updated_at__lt=now - timedelta(seconds=TASK_FAILED_SWEEP_AFTER_SECONDS),
            updated_at__gte=now - timedelta(seconds=TASK_FAILED_KEPT_SECONDS),
        )
        .exclude(Exists(handled))
        .order_by("id")
        .values_list("id", flat=True)[:TASK_FAILED_SWEEP_BATCH]
    )
    swept = sum(1 for task_id in ids if do_handle_task_failed(task_id)["handled"])
    forgotten, _ = HandledTaskFailure.objects.filter(
        handled_at__lt=now - timedelta(seconds=TASK_FAILED_KEPT_SECONDS)
    ).delete()
    return {"failed_tasks_found": len(ids), "swept": swept, "marks_forgotten": forgotten}


@dataclasses.dataclass(frozen=True)
class EvictedReplicas:
    replicas_deleted: int
    indices_evicted: int


def do_evict_index(index_id: int, *, now=None) -> int:
    """Evict exactly this index and nothing else: it leaves its replica (which keeps its
    other indices) as ``evicted``, and the scheduling jobs orphan it and delete it with
    its repositories on the node. The single-index path a move's swap takes; runs in the
    caller's transaction. Returns the rows changed (0 or 1)."""
    now = now or clock.now()
    return transitions.mark_indices_evicted(
        Index.objects.filter(id=index_id), now=now, leave_replica=True
    )


def do_evict_replicas(replica_ids: list[int], *, now=None) -> EvictedReplicas:
    """Evict exactly these replicas: every index of theirs becomes ``evicted``, the rows go.

    The one replica-eviction path (GitLab's IndexToEvictEventWorker tail, and
    node-level eviction): the indices, now without a replica, are orphaned
    and deleted by the scheduling jobs, their repositories deleted on the
    nodes, and the rollout re-plans the namespace. Runs in the caller's
    transaction (or its own).
    """
    if not replica_ids:
        return EvictedReplicas(0, 0)
    now = now or clock.now()
    with transaction.atomic():
        evicted = transitions.mark_indices_evicted(
            Index.objects.filter(zoekt_replica_id__in=replica_ids), now=now
        )
        _, per_model = Replica.objects.filter(id__in=replica_ids).delete()
    return EvictedReplicas(per_model.get(Replica._meta.label, 0), evicted)


def do_retire_replacement(move: Move, *, now=None) -> EvictedReplicas:
    """Retire what a move built: its build replica is evicted (the replacement index
    with it), and the source, which never stopped serving, stays. In the caller's
    transaction, with the move row locked; the move's state is the caller's to change."""
    if not move.replacement_replica_id:
        return EvictedReplicas(0, 0)
    return do_evict_replicas([move.replacement_replica_id], now=now)


def do_park_move(move: Move, reason: str, *, details: dict, now=None) -> str:
    """Give a building move up for good: retire its replacement, then park it with its
    reason; the record waits for an operator. The one park path: a move out of
    attempts (``eviction.moves``) and a drain cancelled mid-move (``zoekt.drains``)."""
    now = now or clock.now()
    do_retire_replacement(move, now=now)
    log.warning("move_parked", move_id=move.id, reason=str(reason))
    return move.transition(Move.State.PARKED, now, reason=str(reason), details=details)
