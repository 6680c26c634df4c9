"""Which enabled namespaces a rollout plans, and on which candidate nodes (reference 5.2).

GitLab's ``SelectionService``, at the database edge of the planner:

* **namespaces**: the enabled namespaces that are allowed to roll out (never
  failed, or failed longer ago than the retry interval), walked in id
  batches of 5,000; within each batch those whose replica count (any state)
  differs from the desired count (the override, else the default setting);
  ascending id; at most ``max_batch_size`` of them. A root with more than
  ``MAX_PROJECTS_PER_NAMESPACE`` (20,000) project namespaces under it, at any
  depth, is GitLab's "too big to roll out": it is skipped, takes no place in
  the batch, and is listed in ``skipped`` with its reason. Its count is read
  in the same statement as the batch's rows, capped at the limit + 1.
  A namespace short of replicas whose projects all lack statistics (it has
  projects, and none has a ``project_statistics`` row) would be planned a
  replica with no index, which the next run's clean-up deletes: planned
  again on every run, it would hold its place in the batch for ever (GitLab
  MR 257616; with GitLab.com's batch size of 1 the whole rollout stalled
  behind one). It waits instead: it takes no place in the batch, is not
  marked failed, and is listed in ``skipped`` with the reason
  ``waiting_for_project_statistics`` until a project of it has statistics.
  This is asked in one more query per rows read, only for the rows short
  of replicas that have project namespaces (two one-row probes per root on
  the ``traversal_ids`` index; the first project with statistics ends the
  second); kept out of the batch's statement, whose estimated cost sits
  near PostgreSQL's JIT thresholds at large batches.
* **nodes**: ``available_for_search_indexing`` (online, for search, positive
  unclaimed storage), most unclaimed first and then by id, each with its
  unclaimed bytes computed in SQL. This order is the planner's candidate
  order. While memory planning is on (the ``zoekt_node_memory_budget_bytes``
  setting is set), a node at or over the high memory watermark (observed
  webserver RSS ÷ its memory budget, ``zoekt.memory``) takes no new index:
  it is left out of the candidates and listed in ``memory_excluded``. A node
  in its eviction cooldown (``Node.eviction_cooldown_until`` in the future,
  docs/eviction.md) takes no new index either: it is listed in
  ``cooling_excluded`` (reason ``node_eviction_cooldown``), so a node that
  just evicted is not handed its namespaces straight back. A node an operator
  is restarting, within its allowed delay, or draining (a live remove or
  replace, or a drain complete and its node not returned to service;
  ``Node.objects.in_shutdown``, docs/operations.md), is no candidate either
  (in the same query).

The two lists form the *resource pool* the loader turns into a scenario.
The cost is two queries per 5,000 enabled namespaces walked plus one for the
nodes, whatever the number of projects (one more per batch that skipped a
namespace and still has room to fill, and one more per rows read that
include a namespace short of replicas with project namespaces: the
statistics test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.db import connection
from django.db.models import (
    BigIntegerField,
    Exists,
    Func,
    IntegerField,
    OuterRef,
    Subquery,
    Value,
)

from zoekt import app_settings, clock, memory
from zoekt.models import EnabledNamespace, Move, Namespace, Node
from zoekt.reasons import Reason

#: GitLab's ``each_batch_with_mismatched_replicas`` batch size.
NAMESPACE_BATCH_SIZE = 5_000
#: GitLab's default ``max_batch_size`` (the rollout job passes the setting instead).
DEFAULT_MAX_BATCH_SIZE = 128
#: GitLab's ``MAX_PROJECTS_PER_NAMESPACE``: a root with more project namespaces
#: than this is not rolled out.
MAX_PROJECTS_PER_NAMESPACE = 20_000


@dataclass(frozen=True, slots=True)
class SelectedNamespace:
    enabled_namespace_id: int
    namespace_id: int
    #: Desired replica count: the override, else the default setting.
    number_of_replicas: int
    #: Replicas it has now (every state).
    replica_count: int


@dataclass(frozen=True, slots=True)
class SkippedNamespace:
    """A mismatched, rollout-allowed namespace that selection leaves out, and why."""

    enabled_namespace_id: int
    namespace_id: int
    #: ``too_many_project_namespaces`` or ``waiting_for_project_statistics``.
    reason: str
    #: Project namespaces under the root, counted up to ``MAX_PROJECTS_PER_NAMESPACE`` + 1.
    project_namespaces: int
    #: The limit it is over (``MAX_PROJECTS_PER_NAMESPACE`` at selection time);
    #: None when it waits for statistics.
    limit: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace_id": self.namespace_id,
            "enabled_namespace_id": self.enabled_namespace_id,
            "reason": self.reason,
            "project_namespaces": self.project_namespaces,
            "limit": self.limit,
        }


@dataclass(frozen=True, slots=True)
class SelectedNode:
    id: int
    unclaimed_storage_bytes: int
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The node's disk size (``total_bytes``, as reported): what the balanced
    #: strategy scores the node's room against.
    total_bytes: int | None = None
    #: The node's zone (its failure domain), or None.
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class ResourcePool:
    """The namespaces to plan (ascending id) and the candidate nodes (candidate order)."""

    namespaces: tuple[SelectedNamespace, ...]
    nodes: tuple[SelectedNode, ...]
    #: Nodes otherwise available but over the high memory watermark (memory
    #: planning on only): ``(node id, RSS ÷ budget)``, by candidate order.
    memory_excluded: tuple[tuple[int, float], ...] = ()
    #: Nodes otherwise available but cooling down after an eviction:
    #: ``(node id, cooldown end)``, by candidate order.
    cooling_excluded: tuple[tuple[int, datetime], ...] = ()
    #: Namespaces that needed work but were left out (GitLab's project limit), by id.
    skipped: tuple[SkippedNamespace, ...] = ()


class SelectionService:
    def __init__(
        self,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        *,
        settings: app_settings.ZoektSettings | None = None,
        now: datetime | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.max_batch_size = max_batch_size
        self.settings = settings or app_settings.current()
        self.now = now or clock.now()
        #: Filled by ``nodes()``: the nodes left out for memory (see ``ResourcePool``).
        self.memory_excluded: list[tuple[int, float]] = []
        #: Filled by ``nodes()``: the nodes left out for their eviction cooldown.
        self.cooling_excluded: list[tuple[int, datetime]] = []
        #: Filled by ``namespaces()``: the namespaces left out (see ``ResourcePool``).
        self.skipped: list[SkippedNamespace] = []

    def execute(self) -> ResourcePool:
        namespaces = tuple(self.namespaces())
        nodes = tuple(self.nodes())
        return ResourcePool(
            namespaces=namespaces,
            nodes=nodes,
            memory_excluded=tuple(self.memory_excluded),
            cooling_excluded=tuple(self.cooling_excluded),
            skipped=tuple(self.skipped),
        )

    # ------------------------------------------------------------------ #

    def namespaces(self) -> list[SelectedNamespace]:
        """Mismatched, rollout-allowed enabled namespaces in id order, up to the batch size.

        Roots over GitLab's project limit are left out and recorded in ``skipped``.
        """
        default = self.settings.default_number_of_replicas
        limit = MAX_PROJECTS_PER_NAMESPACE
        # A namespace with a live move is the move's until it ends: its replacement
        # replica would look like a surplus to destroy (pending first, newest first).
        allowed = EnabledNamespace.objects.with_rollout_allowed(
            self.settings.rollout_retry_interval_seconds, self.now
        ).exclude(Exists(Move.objects.live().filter(zoekt_enabled_namespace=OuterRef("pk"))))
        selected: list[SelectedNamespace] = []
        self.skipped = []
        after = 0
        while len(selected) < self.max_batch_size:
            # The last id of the next batch of allowed namespaces (None: this is the last batch).
            last = list(
                allowed.filter(id__gt=after)
                .order_by("id")
                .values_list("id", flat=True)[NAMESPACE_BATCH_SIZE - 1 : NAMESPACE_BATCH_SIZE]
            )
            upper = last[0] if last else None
            batch = allowed.filter(id__gt=after)
            if upper is not None:
                batch = batch.filter(id__lte=upper)
            mismatched = batch.with_mismatched_replicas(default).annotate(
                project_namespaces=_capped_project_namespace_count(limit + 1)
            )
            row_after = after
            while len(selected) < self.max_batch_size:
                wanted = self.max_batch_size - len(selected)
                rows = list(
                    mismatched.filter(id__gt=row_after)
                    .order_by("id")
                    .values_list(
                        "id",
                        "root_namespace_id",
                        "desired_replicas",
                        "replica_count",
                        "project_namespaces",
                    )[:wanted]
                )
                # Short of replicas, with project namespaces: projects, none with statistics?
                stats_less = _roots_waiting_for_statistics(
                    [
                        root_id
                        for _, root_id, desired, count, pns in rows
                        if 0 < pns <= limit and count < desired
                    ]
                )
                for enabled_id, root_id, desired, count, project_namespaces in rows:
                    if project_namespaces > limit:
                        self.skipped.append(
                            SkippedNamespace(
                                enabled_id,
                                root_id,
                                str(Reason.TOO_MANY_PROJECT_NAMESPACES),
                                project_namespaces,
                                limit,
                            )
                        )
                    elif root_id in stats_less:
                        self.skipped.append(
                            SkippedNamespace(
                                enabled_id,
                                root_id,
                                str(Reason.WAITING_FOR_PROJECT_STATISTICS),
                                project_namespaces,
                            )
                        )
                    else:
                        selected.append(SelectedNamespace(enabled_id, root_id, desired, count))
                if len(rows) < wanted:
                    break  # the batch has no more mismatched rows
                row_after = rows[-1][0]
            if upper is None:
                break
            after = upper
        return selected

    def nodes(self) -> list[SelectedNode]:
        """The candidate nodes: online, for search, positive unclaimed; most unclaimed first.

        While memory planning is on, nodes at or over the high memory
        watermark are left out (and recorded in ``memory_excluded``).
        """
        # A node an operator is restarting or draining takes nothing new
        # (docs/operations.md).
        rows = (
            Node.objects.available_for_search_indexing(self.now)
            .not_in_shutdown(self.now)
            .values_list(
                "id",
                "annotated_unclaimed_storage_bytes",
                "metadata",
                "eviction_cooldown_until",
                "total_bytes",
                "zone",
            )
        )
        configured = self.settings.node_memory_budget_bytes
        self.memory_excluded = []
        self.cooling_excluded = []
        selected = []
        for node_id, unclaimed, metadata, cooldown_until, usable, zone in rows:
            if cooldown_until is not None and cooldown_until > self.now:
                self.cooling_excluded.append((node_id, cooldown_until))
                continue
            metadata = metadata or {}
            if memory.excluded_from_placement(metadata, configured):
                budget, _ = memory.memory_budget(metadata, configured)
                rss = memory.webserver_counter(metadata, "rss_bytes")
                self.memory_excluded.append((node_id, memory.memory_percent_used(rss, budget)))
                continue
            selected.append(SelectedNode(node_id, unclaimed, metadata, usable, zone))
        return selected


class _CappedCount(Subquery):
    """``count(*)`` of a subquery's rows; the subquery carries its own LIMIT."""

    template = "(SELECT count(*) FROM (%(subquery)s) AS capped)"
    output_field = IntegerField()


def _root_prefix(offset: int = 0) -> Func:
    """``ARRAY[outer root_namespace_id + offset]``: a traversal_ids bound for the btree index."""
    root = OuterRef("root_namespace_id")
    return Func(
        root + Value(offset) if offset else root,
        function="ARRAY",
        template="%(function)s[%(expressions)s]",
        output_field=ArrayField(BigIntegerField()),
    )


#: The roots that have projects (a project namespace under them with its project, as
#: the loader reads them) and none with a statistics row.
_ROOTS_WAITING_FOR_STATISTICS_SQL = """
SELECT r.root_id
FROM unnest(%s::bigint[]) AS r(root_id)
WHERE (
  SELECT 1
  FROM namespaces n
  JOIN projects p ON p.project_namespace_id = n.id
  WHERE n.traversal_ids >= ARRAY[r.root_id]
    AND n.traversal_ids < ARRAY[r.root_id + 1]
    AND n.type = 'Project'
  LIMIT 1
) IS NOT NULL
AND (
  SELECT 1
  FROM namespaces n
  JOIN projects p ON p.project_namespace_id = n.id
  JOIN project_statistics s ON s.project_id = p.id
  WHERE n.traversal_ids >= ARRAY[r.root_id]
    AND n.traversal_ids < ARRAY[r.root_id + 1]
    AND n.type = 'Project'
  LIMIT 1
) IS NULL
"""
# (Scalar subqueries with LIMIT 1 rather than EXISTS: PostgreSQL runs them per root on
# the traversal_ids index; an EXISTS may be planned as a join over every namespace.)


def _roots_waiting_for_statistics(root_ids: list[int]) -> set[int]:
    """Those of ``root_ids`` whose projects all lack statistics (no query for none)."""
    if not root_ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_ROOTS_WAITING_FOR_STATISTICS_SQL, [root_ids])
        return {root_id for (root_id,) in cursor.fetchall()}


def _capped_project_namespace_count(cap: int) -> _CappedCount:
    """The root's project namespaces at any depth (traversal_ids[1] = root), at most ``cap``."""
    return _CappedCount(
        Namespace.objects.filter(
            type=Namespace.Type.PROJECT,
            traversal_ids__gte=_root_prefix(),
            traversal_ids__lt=_root_prefix(1),
        )
        .order_by()
        .values("id")[:cap]
    )
