"""GitLab's SchedulingService: every scheduled task of reference 6.3, one method each.

Beat runs ``zoekt.scheduling`` every minute; it enqueues one
``zoekt.run_scheduled_task`` job per name in ``TASKS`` (GitLab's
SchedulingWorker fan-out), and each job calls ``SchedulingService.execute``
with its name under that task's advisory lock. A method checks its
condition and either does the work itself (state upkeep that is one
statement, node-level eviction) or *dispatches* an event: it enqueues the
matching Celery task of ``zoekt.scheduling.events`` after commit, which does
one bounded batch (``zoekt.scheduling.handlers``). Every method returns a
dict of what it found and did, for one log line.

Throttling (reference 6.2): a task with a period runs at most once per
period. The first run of a period sets a Redis key (``SET NX`` with an expiry
equal to the period) named after the task and the period; a run that finds
the key does nothing. The condition is checked *inside* the throttle, so a
false condition still uses up the period. Tasks without a period run on
every tick. ``bypass_throttle`` turns the throttle off (GitLab bypasses it in
development); the end-to-end tests and benchmarks use it to run the jobs in a
loop as fast as beat would over hours.

Left out: GitLab's SaaS subscription tasks (``remove_expired_subscriptions``,
``saas_rollout``). ``eviction`` (SaaS-only node-level eviction in GitLab)
runs here only when ``zoekt_node_level_eviction_enabled`` is on.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Exists, F, OuterRef, Window
from django.db.models.functions import RowNumber

from zoekt import actions, admission, app_settings, capacity, clock
from zoekt.logging import get_logger
from zoekt.models import Index, Move, Namespace, Node, Repository
from zoekt.reasons import Reason
from zoekt.scheduling import handlers

log = get_logger(__name__)

# GitLab's task names (reference 6.3), without the SaaS subscription tasks.
TASKS: tuple[str, ...] = (
    "auto_index_self_managed",
    "eviction",
    "initial_indexing",
    "node_with_negative_unclaimed_storage_bytes_check",
    "update_index_used_bytes",
    "force_update_overprovisioned_index",
    "indices_to_evict_check",
    "index_mismatched_watermark_check",
    "index_should_be_marked_as_orphaned_check",
    "index_should_be_marked_as_pending_eviction_check",
    "index_to_delete_check",
    "lost_nodes_check",
    "mark_indices_as_ready",
    "repo_should_be_marked_as_orphaned_check",
    "repo_to_index_check",
    "repo_to_reindex_check",
    "repo_to_delete_check",
    "update_index_used_storage_bytes",
    "update_replica_states",
)

# Periods of the throttled tasks, in seconds (reference 6.3); the others run every tick.
PERIODS: dict[str, int] = {
    "eviction": 5 * 60,
    "node_with_negative_unclaimed_storage_bytes_check": 60 * 60,
    "index_mismatched_watermark_check": 10 * 60,
    "lost_nodes_check": 10 * 60,
    "repo_should_be_marked_as_orphaned_check": 10 * 60,
}

# GitLab's numbers (reference 6.3, 6.5, 6.6, 6.10).
AUTO_INDEX_BATCH_SIZE = 1_000
# Pending indices per online node per run: the setting zoekt_initial_indexing_limit (default 1).
NODE_PROCESSING_LIMIT = 100  # nodes per repo_to_reindex_check
NEGATIVE_UNCLAIMED_NODE_BATCH_SIZE = 1_000

THROTTLE_KEY_PREFIX = "zoekt:scheduling:throttle"

Result = dict[str, Any]
Dispatch = Callable[[str, tuple], None]


def throttle_key(task: str, period_seconds: int) -> str:
    return f"{THROTTLE_KEY_PREFIX}:{task}:{period_seconds}"


def acquire_period(task: str, period_seconds: int) -> bool:
    """Take this period of ``task``: True the first time in ``period_seconds`` (Redis SET NX EX)."""
    return bool(
        cache.add(throttle_key(task, period_seconds), clock.now().isoformat(), period_seconds)
    )


def enqueue_event(event: str, args: tuple) -> None:
    """Enqueue an event job after the current transaction commits (at once outside one)."""
    from zoekt.scheduling import events

    events.task_for(event).delay_on_commit(*args)


class SchedulingService:
    def __init__(
        self,
        *,
        settings: app_settings.ZoektSettings | None = None,
        now: datetime | None = None,
        bypass_throttle: bool = False,
        dispatch: Dispatch = enqueue_event,
    ) -> None:
        self.settings = settings or app_settings.current()
        self.now = now or clock.now()
        self.bypass_throttle = bypass_throttle
        self._dispatch = dispatch

    # ------------------------------------------------------------------ #

    def execute(self, task: str) -> Result:
        """Run one scheduled task by its GitLab name; the result always names the task."""
        if task not in TASKS:
            raise ValueError(f"unknown scheduled task {task!r}")
        result = getattr(self, task)()
        return {"task": task, **result}

    def _throttled(self, task: str) -> bool:
        """True when this period of ``task`` was already used (and so this run does nothing)."""
        if self.bypass_throttle:
            return False
        return not acquire_period(task, PERIODS[task])

    def _dispatch_event(self, event: str, *args) -> None:
        self._dispatch(event, args)

    def _event(self, condition: bool, event: str, **found) -> Result:
        """Dispatch ``event`` (no arguments) when ``condition`` holds."""
        if not condition:
            return {"skipped": Reason.CONDITION_NOT_MET, **found}
        self._dispatch_event(event)
        return {"dispatched": [event], **found}

    def _throttled_result(self, task: str) -> Result:
        return {"skipped": Reason.THROTTLED, "period_seconds": PERIODS[task]}

    # --- enabling ---------------------------------------------------------------------

    def auto_index_self_managed(self) -> Result:
        """Enable every top-level namespace that is not enabled yet, 1,000 ids at a time."""
        if not self.settings.auto_index_root_namespace:
            return {"skipped": Reason.AUTO_INDEX_DISABLED}
        created = 0
        batches = 0
        roots = Namespace.objects.roots().exclude(type=Namespace.Type.PROJECT)
        for ids in handlers.id_batches(roots, AUTO_INDEX_BATCH_SIZE):
            batches += 1
            with connection.cursor() as cursor:
                cursor.execute(
                    """
                    INSERT INTO zoekt_enabled_namespaces (root_namespace_id, created_at, updated_at)
                    SELECT n.id, %(now)s, %(now)s FROM namespaces n
                    WHERE n.id = ANY(%(ids)s) AND NOT EXISTS (
                        SELECT 1 FROM zoekt_enabled_namespaces e WHERE e.root_namespace_id = n.id
                    )
                    ORDER BY n.id
                    ON CONFLICT (root_namespace_id) DO NOTHING
                    """,
                    {"ids": ids, "now": self.now},
                )
                created += cursor.rowcount
        return {"namespace_batches": batches, "enabled_namespaces_created": created}

    # --- node-level eviction (GitLab's SaaS legacy, behind a setting) --------------------

    def eviction(self) -> Result:
        """Node-level eviction (reference 6.5(a)), every 5 minutes when the setting is on.

        GitLab runs it on GitLab.com only; here on every deployment where
        ``zoekt_node_level_eviction_enabled`` is on. The check is the
        throttle and the setting; the decisions (safeguards or GitLab's
        legacy rule) are the eviction package's event job
        (``eviction.evict_from_nodes``, docs/eviction.md).
        """
        if not self.settings.node_level_eviction_enabled:
            return {"skipped": Reason.NODE_LEVEL_EVICTION_DISABLED}
        if self._throttled("eviction"):
            return self._throttled_result("eviction")
        hot = (
            Node.objects.for_search()
            .online(self.now)
            .high_watermark_exceeded(app_settings.development_watermarks())
            .count()
        )
        return self._event(hot > 0, "evict_from_nodes", nodes_over_high_watermark=hot)

    # --- indexing ---------------------------------------------------------------------------

    def initial_indexing(self) -> Result:
        """For each online search node, dispatch its oldest pending indices.

        As many per node as ``zoekt_initial_indexing_limit`` (GitLab's default, 1),
        a live move's replacement first, then oldest (lowest id) first, node by node.
        """
        if self.settings.indexing_admission != admission.MODE_GITLAB:
            return self._initial_indexing_admitted()
        limit = self.settings.initial_indexing_limit
        online = Node.objects.for_search().online(self.now)
        # A move's replacement goes ahead of the queue: the copy it replaces is on a
        # full node, and the move holds its lease until the replacement is ready.
        moving = Exists(Move.objects.live().filter(replacement_index=OuterRef("pk")))
        rows = list(
            Index.objects.filter(state=Index.State.PENDING, zoekt_node__in=online)
            .annotate(
                rank=Window(
                    RowNumber(),
                    partition_by=F("zoekt_node_id"),
                    order_by=[moving.desc(), F("id").asc()],
                )
            )
            .filter(rank__lte=limit)
            .order_by("zoekt_node_id", "id")
            .values_list("zoekt_node_id", "id")
        )
        index_ids = [index_id for _, index_id in rows]
        for index_id in index_ids:
            self._dispatch_event("initialize_index", index_id)
        return {
            "initial_indexing_limit": limit,
            "nodes_with_pending_indices": len({node_id for node_id, _ in rows}),
            "dispatched": ["initialize_index"] * len(index_ids),
            "index_ids": index_ids,
        }

    def _initial_indexing_admitted(self) -> Result:
        """Admission control's initial indexing (``zoekt.admission.start_pending_indices``).

        Each online search node starts its pending indices, a live move's replacement
        first, then the oldest, while its queue of repositories not yet built stays
        under ``QUEUE_PER_SLOT`` times its task slots: as fast as the node drains its
        queue, not one a minute. An index's repositories are estimated by its
        namespace's projects. The disk is paced at hand-out, build by build.
        """
        nodes = list(Node.objects.for_search().online(self.now).values_list("id", "metadata"))
        ratio = self.settings.cpu_to_tasks_ratio
        slots = {
            node_id: capacity.concurrency_limit(
                (metadata or {}).get("concurrency"),
                (metadata or {}).get("concurrency_override"),
                ratio,
            )
            for node_id, metadata in nodes
        }
        moving = Exists(Move.objects.live().filter(replacement_index=OuterRef("pk")))
        pending = list(
            Index.objects.filter(state=Index.State.PENDING, zoekt_node_id__in=slots)
            .annotate(moving=moving)
            .values_list("id", "zoekt_node_id", "namespace_id", "moving")
        )
        if not pending:
            return {"mode": admission.MODE_ADMISSION, "dispatched": [], "index_ids": []}
        queued = dict(
            Repository.objects.filter(
                zoekt_index__zoekt_node_id__in={row[1] for row in pending},
                state__in=(Repository.State.PENDING, Repository.State.INITIALIZING),
            )
            .values_list("zoekt_index__zoekt_node_id")
            .annotate(count=Count("id"))
            .values_list("zoekt_index__zoekt_node_id", "count")
        )
        projects = dict(
            Namespace.objects.filter(
                type="Project", traversal_ids__0__in={row[2] for row in pending}
            )
            .values_list("traversal_ids__0")
            .annotate(count=Count("id"))
            .values_list("traversal_ids__0", "count")
        )
        index_ids = admission.start_pending_indices(
            (
                admission.PendingIndex(index_id, node_id, projects.get(namespace_id, 0), moving)
                for index_id, node_id, namespace_id, moving in pending
            ),
            queued,
            slots,
        )
        for index_id in index_ids:
            self._dispatch_event("initialize_index", index_id)
        return {
            "mode": admission.MODE_ADMISSION,
            "nodes_with_pending_indices": len({row[1] for row in pending}),
            "pending_indices": len(pending),
            "dispatched": ["initialize_index"] * len(index_ids),
            "index_ids": index_ids,
        }

    def repo_to_index_check(self) -> Result:
        return self._event(Repository.objects.should_be_indexed().exists(), "index_repos")

    def repo_to_reindex_check(self) -> Result:
        """One reindex event per node with outdated ready repositories, up to 100 nodes (6.10)."""
        maximum = Node.objects.maximum_schema_version(self.now)
        outdated = Repository.objects.should_be_reindexed(maximum).filter(
            state=Repository.State.READY
        )
        if not outdated.exists():
            return {"skipped": Reason.CONDITION_NOT_MET, "maximum_schema_version": maximum}
        node_ids = list(
            self.nodes_needing_reindex().values_list("id", flat=True)[:NODE_PROCESSING_LIMIT]
        )
        for node_id in node_ids:
            self._dispatch_event("reindex_repos", node_id)
        return {
            "maximum_schema_version": maximum,
            "dispatched": ["reindex_repos"] * len(node_ids),
            "node_ids": node_ids,
        }

    def nodes_needing_reindex(self):
        """Online nodes with a ready repository below the node's own schema version, by id."""
        outdated = Repository.objects.filter(
            zoekt_index__zoekt_node_id=OuterRef("pk"),
            state=Repository.State.READY,
            schema_version__lt=OuterRef("schema_version"),
        )
        return Node.objects.online(self.now).filter(Exists(outdated)).order_by("id")

    def mark_indices_as_ready(self) -> Result:
        candidates = Index.objects.filter(
            state=Index.State.INITIALIZING
        ).with_all_finished_repositories()
        return self._event(candidates.exists(), "mark_indices_ready")

    def update_replica_states(self) -> Result:
        return actions.do_update_replica_states()

    # --- storage ------------------------------------------------------------------------

    def update_index_used_bytes(self) -> Result:
        """GitLab keeps this name as a deprecated no-op."""
        return {"skipped": Reason.DEPRECATED}

    def update_index_used_storage_bytes(self) -> Result:
        stale = Index.objects.with_stale_used_storage_bytes_updated_at().exists()
        return self._event(stale, "update_index_used_storage_bytes")

    def force_update_overprovisioned_index(self) -> Result:
        exists = handlers.overprovisioned_indices().exists()
        return self._event(exists, "shrink_overprovisioned_indices")

    def index_mismatched_watermark_check(self) -> Result:
        """Every 10 minutes: count indices whose stored level differs from SQL's; log only."""
        if self._throttled("index_mismatched_watermark_check"):
            return self._throttled_result("index_mismatched_watermark_check")
        count = Index.objects.with_mismatched_watermark_levels().count()
        if not count:
            return {"skipped": Reason.CONDITION_NOT_MET, "mismatched_indices": 0}
        return {"mismatched_indices": count}

    def node_with_negative_unclaimed_storage_bytes_check(self) -> Result:
        """Hourly: dispatch the search nodes with negative unclaimed storage, 1,000 ids an event."""
        task = "node_with_negative_unclaimed_storage_bytes_check"
        if self._throttled(task):
            return self._throttled_result(task)
        node_ids = list(
            Node.objects.for_search()
            .negative_unclaimed_storage_bytes()
            .order_by("id")
            .values_list("id", flat=True)
        )
        if not node_ids:
            return {"skipped": Reason.CONDITION_NOT_MET, "nodes": 0}
        dispatched = []
        for start in range(0, len(node_ids), NEGATIVE_UNCLAIMED_NODE_BATCH_SIZE):
            self._dispatch_event(
                "evict_overcommitted_nodes",
                node_ids[start : start + NEGATIVE_UNCLAIMED_NODE_BATCH_SIZE],
            )
            dispatched.append("evict_overcommitted_nodes")
        return {"nodes": len(node_ids), "dispatched": dispatched}

    # --- eviction and deletion ---------------------------------------------------------------

    def index_should_be_marked_as_pending_eviction_check(self) -> Result:
        exists = Index.objects.should_be_pending_eviction().exists()
        return self._event(exists, "mark_indices_pending_eviction")

    def indices_to_evict_check(self) -> Result:
        exists = Index.objects.filter(state=Index.State.PENDING_EVICTION).exists()
        return self._event(exists, "evict_indices")

    def index_should_be_marked_as_orphaned_check(self) -> Result:
        return self._event(Index.objects.should_be_marked_as_orphaned().exists(), "orphan_indices")

    def index_to_delete_check(self) -> Result:
        return self._event(Index.objects.should_be_deleted().exists(), "delete_indices")

    def repo_should_be_marked_as_orphaned_check(self) -> Result:
        task = "repo_should_be_marked_as_orphaned_check"
        if self._throttled(task):
            return self._throttled_result(task)
        return self._event(
            Repository.objects.should_be_marked_as_orphaned().exists(), "orphan_repos"
        )

    def repo_to_delete_check(self) -> Result:
        return self._event(Repository.objects.should_be_deleted().exists(), "delete_repos")

    # --- lost nodes -----------------------------------------------------------------------------

    def lost_nodes_check(self) -> Result:
        """Every 10 minutes: dispatch one lost search node, only while another is online (6.7)."""
        if self._throttled("lost_nodes_check"):
            return self._throttled_result("lost_nodes_check")
        threshold = self.settings.lost_node_threshold_seconds
        if not threshold:
            return {"skipped": Reason.LOST_NODE_HANDLING_DISABLED}
        search_nodes = Node.objects.for_search()
        # A node being restarted within its allowed delay is not lost (docs/operations.md).
        lost = (
            search_nodes.lost(threshold, self.now)
            .not_in_restart(self.now)
            .order_by("id")
            .values_list("id", flat=True)
        )
        node_id = lost.first()
        if node_id is None:
            return {"skipped": Reason.NO_LOST_NODES}
        if not search_nodes.online(self.now).exists():
            return {"skipped": Reason.NO_ONLINE_NODES, "lost_node_id": node_id}
        self._dispatch_event("delete_lost_node", node_id)
        return {"dispatched": ["delete_lost_node"], "lost_node_id": node_id}
