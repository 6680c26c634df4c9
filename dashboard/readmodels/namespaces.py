"""The namespaces pages' read models: ``namespace_page`` (the list) and
``namespace_detail`` (one root namespace): enabled namespaces with their replicas,
indices, project ranges, nodes, states and search targets, and (the detail) whether
the rollout leaves it waiting for project statistics.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter, defaultdict
from datetime import datetime

from django.core.paginator import Page
from django.db.models import Count, F, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce

from dashboard.readmodels.common import (
    INDEX_STATE_NAMES,
    REPLICA_STATE_NAMES,
    REPOSITORY_STATE_NAMES,
    SPLIT,
    WATERMARK_LEVEL_NAMES,
    UnknownChoice,
    by_state,
    page_of,
)
from planner.models import RolloutPlan
from zoekt import app_settings, clock, memory
from zoekt.models import EnabledNamespace, Index, Namespace, Replica, Repository
from zoekt.reasons import Reason
from zoekt.search_targets import SearchTargets, search_targets, search_targets_many


@dataclasses.dataclass(frozen=True)
class NamespaceRow:
    enabled_namespace_id: int
    root_namespace_id: int
    path: str
    name: str
    search: bool
    desired_replicas: int
    replicas: dict[str, int]
    indices: dict[str, int]
    node_count: int
    #: A search has a target: the rule of ``zoekt.search_targets``, batched.
    searchable: bool
    last_rollout_failed_at: datetime | None
    #: The largest per-replica sum of its indices' used bytes (live, not the
    #: ``last_used_storage_bytes`` metadata the scheduler stores).
    used_storage_bytes: int = 0
    #: The root's repository size (``namespace_root_storage_statistics``) × the
    #: memory ratio: what the planner estimates one whole replica needs in memory.
    memory_estimate_bytes: int | None = None
    #: The most indices one of its replicas has (above 1: split over that many nodes).
    indices_per_replica: int = 0

    @property
    def split(self) -> bool:
        return self.indices_per_replica > 1

    @property
    def replica_count(self) -> int:
        return sum(self.replicas.values())

    @property
    def index_count(self) -> int:
        return sum(self.indices.values())


NAMESPACE_FILTERS = {
    "": "all",
    "failed": "rollout failed",
    "search_disabled": "search disabled",
    "without_replicas": "no replica",
    "split": "split over nodes",
}


NAMESPACE_SORTS = {
    "": "root namespace id",
    "used": "used storage, largest first",
    "memory": "memory estimate, largest first",
    "split": "indices per replica, most first",
}


def _replica_top(expression, alias: str):
    """The largest per-replica ``expression`` of an enabled namespace's indices."""
    return Subquery(
        Index.objects.filter(
            zoekt_enabled_namespace_id=OuterRef("pk"), zoekt_replica_id__isnull=False
        )
        .order_by()
        .values("zoekt_replica_id")
        .annotate(**{alias: expression})
        .order_by(f"-{alias}")
        .values(alias)[:1]
    )


def namespace_page(
    *,
    query: str = "",
    filter: str = "",
    sort: str = "",
    page: int | str = 1,
    per_page: int = 50,
    now: datetime | None = None,
    settings: app_settings.ZoektSettings | None = None,
) -> tuple[Page, list[NamespaceRow]]:
    """One page of enabled namespaces, with their replicas, indices and memory estimate.

    ``query`` is a root namespace id or part of its path; ``filter`` one of
    ``NAMESPACE_FILTERS``, ``sort`` one of ``NAMESPACE_SORTS`` (ties by root
    namespace id); anything else raises ``UnknownChoice``. Queries: the count
    and the page (2), the page's replicas (1) and indices (1), searchable
    nodes (2) and the live moves' build replicas (1).
    """
    if filter not in NAMESPACE_FILTERS:
        raise UnknownChoice("filter", filter, NAMESPACE_FILTERS)
    if sort not in NAMESPACE_SORTS:
        raise UnknownChoice("sort", sort, NAMESPACE_SORTS)
    now = now or clock.now()
    settings = settings or app_settings.current()
    rows = EnabledNamespace.objects.select_related(
        "root_namespace", "root_namespace__root_storage_statistics"
    )
    if sort == "used":
        rows = rows.annotate(
            sort_key=Coalesce(_replica_top(Sum("used_storage_bytes"), "used"), 0)
        ).order_by("-sort_key", "root_namespace_id")
    elif sort == "split":
        rows = rows.annotate(sort_key=Coalesce(_replica_top(Count("id"), "n"), 0)).order_by(
            "-sort_key", "root_namespace_id"
        )
    elif sort == "memory":
        rows = rows.order_by(
            F("root_namespace__root_storage_statistics__repository_size").desc(nulls_last=True),
            "root_namespace_id",
        )
    else:
        rows = rows.order_by("root_namespace_id")
    query = query.strip()
    if query:
        condition = Q(root_namespace__path__icontains=query) | Q(
            root_namespace__name__icontains=query
        )
        if query.isdigit():
            condition |= Q(root_namespace_id=int(query))
        rows = rows.filter(condition)
    if filter == "failed":
        rows = rows.filter(last_rollout_failed_at__isnull=False)
    elif filter == "search_disabled":
        rows = rows.filter(search=False)
    elif filter == "without_replicas":
        rows = rows.filter(replicas__isnull=True)
    elif filter == "split":
        rows = rows.filter(SPLIT)
    page_obj = page_of(rows, per_page, page)
    enabled = list(page_obj.object_list)
    ids = [row.id for row in enabled]
    replicas: dict[int, Counter] = defaultdict(Counter)
    for enabled_id, state in Replica.objects.filter(zoekt_enabled_namespace_id__in=ids).values_list(
        "zoekt_enabled_namespace_id", "state"
    ):
        replicas[enabled_id][state] += 1
    index_rows = list(
        Index.objects.filter(zoekt_enabled_namespace_id__in=ids).values_list(
            "zoekt_enabled_namespace_id",
            "zoekt_replica_id",
            "zoekt_node_id",
            "state",
            "used_storage_bytes",
        )
    )
    indices: dict[int, Counter] = defaultdict(Counter)
    nodes: dict[int, set[int]] = defaultdict(set)
    used: dict[int, Counter] = defaultdict(Counter)  # enabled id → replica id → bytes
    per_replica: dict[int, Counter] = defaultdict(Counter)  # enabled id → replica → indices
    for enabled_id, replica_id, node_id, state, used_bytes in index_rows:
        indices[enabled_id][state] += 1
        nodes[enabled_id].add(node_id)
        if replica_id is not None:
            used[enabled_id][replica_id] += used_bytes
            per_replica[enabled_id][replica_id] += 1
    # zoekt.search_targets' rule (coverage by ready indices on searchable nodes), batched.
    routed = (
        search_targets_many([row.root_namespace_id for row in enabled], now) if index_rows else {}
    )
    searchable_enabled = {
        row.id
        for row in enabled
        if row.root_namespace_id in routed and routed[row.root_namespace_id].search_enabled
    }
    out = [
        NamespaceRow(
            enabled_namespace_id=row.id,
            root_namespace_id=row.root_namespace_id,
            path=row.root_namespace.path,
            name=row.root_namespace.name,
            search=row.search,
            desired_replicas=row.number_of_replicas(settings.default_number_of_replicas),
            replicas=by_state(replicas[row.id].items(), REPLICA_STATE_NAMES),
            indices={
                INDEX_STATE_NAMES[state]: count for state, count in sorted(indices[row.id].items())
            },
            node_count=len(nodes[row.id]),
            searchable=row.search and row.id in searchable_enabled,
            last_rollout_failed_at=row.last_rollout_failed_at,
            used_storage_bytes=max(used[row.id].values(), default=0),
            memory_estimate_bytes=_memory_estimate(row.root_namespace, settings),
            indices_per_replica=max(per_replica[row.id].values(), default=0),
        )
        for row in enabled
    ]
    return page_obj, out


def _memory_estimate(root: Namespace, settings: app_settings.ZoektSettings) -> int | None:
    """The root's repository size × the memory ratio (``zoekt.memory``); None: no statistics."""
    try:
        statistics = root.root_storage_statistics
    except Namespace.root_storage_statistics.RelatedObjectDoesNotExist:
        return None
    return memory.estimate_memory_bytes(statistics.repository_size, settings.memory_ratio)


@dataclasses.dataclass(frozen=True)
class IndexView:
    id: int
    state: str
    node_id: int
    node_name: str
    node_online: bool
    replica_id: int | None
    project_namespace_id_from: int | None
    project_namespace_id_to: int | None
    #: Projects of the root whose project namespace id falls in the range.
    projects_in_range: int
    repositories: dict[str, int]
    used_storage_bytes: int
    reserved_storage_bytes: int | None
    watermark_level: str
    last_indexed_at: datetime
    #: Repository bytes of the projects in its range × the memory ratio.
    memory_estimate_bytes: int = 0

    @property
    def used_percent(self) -> float | None:
        if not self.reserved_storage_bytes:
            return None
        return self.used_storage_bytes / self.reserved_storage_bytes


@dataclasses.dataclass(frozen=True)
class ReplicaView:
    id: int
    state: str
    created_at: datetime
    indices: list[IndexView]


@dataclasses.dataclass(frozen=True)
class NamespaceDetail:
    enabled: EnabledNamespace
    root: Namespace
    desired_replicas: int
    replicas: list[ReplicaView]
    #: Indices of the namespace without a replica (evicted, orphaned).
    detached_indices: list[IndexView]
    project_count: int
    targets: SearchTargets
    #: Repository bytes of all its projects × the memory ratio: one whole replica.
    memory_estimate_bytes: int = 0
    memory_ratio: float = 0.0
    #: ``(id, created_at)`` of the newest kept rollout plan (not a dry run) that
    #: created replicas for it, and of the newest that failed it; None: not kept.
    placed_by_plan: tuple[int, datetime] | None = None
    failed_by_plan: tuple[int, datetime] | None = None
    #: Why the rollout leaves it out of its batches although it is short of replicas
    #: (``waiting_for_project_statistics``: it has projects and none has statistics, as
    #: ``planner.selection`` decides); None when it waits for nothing.
    rollout_waiting_reason: str | None = None

    @property
    def node_ids(self) -> list[int]:
        ids = {index.node_id for replica in self.replicas for index in replica.indices}
        ids |= {index.node_id for index in self.detached_indices}
        return sorted(ids)


def namespace_detail(
    root_namespace_id: int,
    *,
    now: datetime | None = None,
    settings: app_settings.ZoektSettings | None = None,
) -> NamespaceDetail | None:
    """One enabled namespace in full; None when the root namespace is not enabled.

    Queries: the enabled namespace (1), replicas (1), indices with nodes
    (1), repositories per index and state (1), the root's project
    namespace ids with their repository sizes (1), the plans that placed
    and failed it (2) and the search targets (``zoekt.search_targets``).
    """
    now = now or clock.now()
    settings = settings or app_settings.current()
    enabled = (
        EnabledNamespace.objects.select_related("root_namespace")
        .filter(root_namespace_id=root_namespace_id)
        .first()
    )
    if enabled is None:
        return None
    replicas = list(enabled.replicas.order_by("id"))
    indices = list(
        Index.objects.filter(zoekt_enabled_namespace=enabled)
        .select_related("zoekt_node")
        .order_by("zoekt_replica_id", "id")
    )
    repositories: dict[int, Counter] = defaultdict(Counter)
    for index_id, state, count in (
        Repository.objects.filter(zoekt_index__in=[index.id for index in indices])
        .order_by()
        .values_list("zoekt_index_id", "state")
        .annotate(count=Count("id"))
        .values_list("zoekt_index_id", "state", "count")
    ):
        repositories[index_id][state] += count
    rows = list(
        Namespace.objects.project_namespaces_under(root_namespace_id).values_list(
            "id", "project__id", "project__statistics__id", "project__statistics__repository_size"
        )
    )
    sized = sorted((pid, size or 0) for pid, _, _, size in rows)
    # Projects, none with statistics: the rollout's selection leaves it waiting.
    has_projects = any(project_id is not None for _, project_id, _, _ in rows)
    has_statistics = any(statistics_id is not None for _, _, statistics_id, _ in rows)
    project_namespace_ids = [pid for pid, _ in sized]
    # Repository bytes up to each project namespace: a range's sum is two lookups.
    cumulative = [0]
    for _, size in sized:
        cumulative.append(cumulative[-1] + size)

    def bounds(start: int | None, end: int | None) -> tuple[int, int]:
        low = 0 if start is None else bisect.bisect_left(project_namespace_ids, start)
        high = (
            len(project_namespace_ids)
            if end is None
            else bisect.bisect_right(project_namespace_ids, end)
        )
        return low, max(low, high)

    def in_range(start: int | None, end: int | None) -> int:
        low, high = bounds(start, end)
        return high - low

    def memory_in_range(start: int | None, end: int | None) -> int:
        low, high = bounds(start, end)
        return memory.estimate_memory_bytes(cumulative[high] - cumulative[low], ratio)

    ratio = settings.memory_ratio

    views: dict[int | None, list[IndexView]] = defaultdict(list)
    for index in indices:
        start = index.metadata.get("project_namespace_id_from")
        end = index.metadata.get("project_namespace_id_to")
        views[index.zoekt_replica_id].append(
            IndexView(
                id=index.id,
                state=INDEX_STATE_NAMES.get(index.state, str(index.state)),
                node_id=index.zoekt_node_id,
                node_name=index.zoekt_node.name,
                node_online=index.zoekt_node.is_online(now),
                replica_id=index.zoekt_replica_id,
                project_namespace_id_from=start,
                project_namespace_id_to=end,
                projects_in_range=in_range(start, end),
                memory_estimate_bytes=memory_in_range(start, end),
                repositories={
                    REPOSITORY_STATE_NAMES.get(state, str(state)): count
                    for state, count in sorted(repositories[index.id].items())
                },
                used_storage_bytes=index.used_storage_bytes,
                reserved_storage_bytes=index.reserved_storage_bytes,
                watermark_level=WATERMARK_LEVEL_NAMES.get(
                    index.watermark_level, str(index.watermark_level)
                ),
                last_indexed_at=index.last_indexed_at,
            )
        )
    desired = enabled.number_of_replicas(settings.default_number_of_replicas)
    waiting = len(replicas) < desired and has_projects and not has_statistics
    return NamespaceDetail(
        enabled=enabled,
        root=enabled.root_namespace,
        desired_replicas=desired,
        replicas=[
            ReplicaView(
                id=replica.id,
                state=REPLICA_STATE_NAMES.get(replica.state, str(replica.state)),
                created_at=replica.created_at,
                indices=views.get(replica.id, []),
            )
            for replica in replicas
        ],
        detached_indices=views.get(None, []),
        project_count=len(project_namespace_ids),
        targets=search_targets(root_namespace_id, now=now),
        memory_estimate_bytes=memory.estimate_memory_bytes(cumulative[-1], ratio),
        memory_ratio=ratio,
        placed_by_plan=_newest_plan_with(enabled.id, "create"),
        failed_by_plan=_newest_plan_with(enabled.id, "failures"),
        rollout_waiting_reason=str(Reason.WAITING_FOR_PROJECT_STATISTICS) if waiting else None,
    )


def _newest_plan_with(enabled_namespace_id: int, part: str) -> tuple[int, datetime] | None:
    """The newest kept rollout (not a dry run) whose plan lists the namespace under
    ``part`` (``create``, ``failures``): one query, a jsonb containment test."""
    found = (
        RolloutPlan.objects.filter(
            dry_run=False,
            **{f"plan__{part}__contains": [{"enabled_namespace_id": enabled_namespace_id}]},
        )
        .order_by("-id")
        .values_list("id", "created_at")
        .first()
    )
    return None if found is None else (found[0], found[1])
