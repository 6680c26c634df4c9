"""Read models: what the dashboard, ``/metrics`` and operator commands show, in few queries.

Each function here reads the database with a fixed number of queries,
whatever the number of nodes, namespaces, indices or plans (the dashboard's
tests count them with 3 and with 30 of each), and returns plain dataclasses
a template or a Prometheus collector can read without touching the ORM.

* ``fleet_overview``: per node disk (used, reserved, unclaimed, total and the
  watermark), memory (``zoekt.memory.node_memory_report``: estimated against
  observed RSS against the budget), shards loaded, index and task counts,
  online and searchable (``NodeQuerySet.online`` / ``searchable``), and the
  fleet's counts by state.
* ``namespace_page`` / ``namespace_detail``: enabled namespaces with their
  replicas, indices, project ranges, nodes, states and search targets.
* ``recent_plans`` / ``plan_detail``: the rollout plans kept by
  ``planner.records``.
* ``eviction_page``: the nodes over the high watermark and in cooldown
  (``eviction.queries.eviction_overview``) and a page of eviction decisions.
* ``move_page``: the live moves and a page of recent ones, with durations.
* ``demo_progress``: nodes online, namespaces with a ready replica, indices
  and repositories by state (what ``make demo`` prints while it converges).

Memory figures come from ``zoekt.memory`` (budgets, estimate, observed
ratios) rather than being computed a second time here.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import Count, Exists, F, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce

from eviction.models import EvictionDecision
from eviction.queries import EvictionOverview, eviction_overview
from planner.models import RolloutPlan
from zoekt import app_settings, capacity, clock, memory, search_health
from zoekt.capacity import NodeWatermark
from zoekt.models import (
    EnabledNamespace,
    Index,
    Move,
    Namespace,
    Node,
    Replica,
    Repository,
    Task,
)
from zoekt.search_targets import SearchTargets, search_targets, search_targets_many

INDEX_STATE_NAMES = {state.value: state.label for state in Index.State}
REPLICA_STATE_NAMES = {state.value: state.label for state in Replica.State}
REPOSITORY_STATE_NAMES = {state.value: state.label for state in Repository.State}
TASK_STATE_NAMES = {state.value: state.label for state in Task.State}
WATERMARK_LEVEL_NAMES = {level.value: level.label for level in Index.WatermarkLevel}


def _by_state(rows: Iterable[tuple[int, int]], names: dict[int, str]) -> dict[str, int]:
    """``{state name: count}`` for every state of the enum, zeros included, in enum order."""
    counts = dict.fromkeys(names.values(), 0)
    for value, count in rows:
        counts[names.get(value, str(value))] = counts.get(names.get(value, str(value)), 0) + count
    return counts


# ----------------------------------------------------------------------------
# Fleet
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NodeRow:
    id: int
    uuid: str
    name: str
    version: str | None
    search_base_url: str
    last_seen_at: datetime
    online: bool
    searchable: bool
    #: Why search health leaves the node out (``zoekt.reasons``), when it does.
    search_exclusions: tuple[str, ...]
    total_bytes: int
    used_bytes: int
    indexed_bytes: int
    usable_storage_bytes: int
    reserved_storage_bytes: int
    unclaimed_storage_bytes: int
    storage_percent_used: float
    watermark: NodeWatermark
    #: ``{index state name: count}`` of the indices on the node.
    indices: dict[str, int]
    #: ``{task state name: count}`` of the node's tasks, and those due now.
    tasks: dict[str, int]
    tasks_due: int
    #: ``zoekt.memory.NodeMemory`` (None for a node that is not a search node).
    memory: memory.NodeMemory | None
    #: Seconds since the node's sustain clock started (``high_watermark_exceeded_at``;
    #: kept through the hysteresis band); None: no clock running.
    over_high_seconds: int | None = None
    #: The end of the node's eviction cooldown, while it is in the future.
    eviction_cooldown_until: datetime | None = None

    @property
    def index_count(self) -> int:
        return sum(self.indices.values())

    @property
    def reserved_percent(self) -> float:
        return self.reserved_storage_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def rss_bytes(self) -> int | None:
        return None if self.memory is None else self.memory.rss_bytes

    @property
    def shards_loaded(self) -> int | None:
        return None if self.memory is None else self.memory.shards_loaded


@dataclasses.dataclass(frozen=True)
class FleetOverview:
    now: datetime
    nodes: list[NodeRow]
    settings: app_settings.ZoektSettings
    watermark_limits: tuple[float, float, float]
    indices: dict[str, int]
    index_watermark_levels: dict[str, int]
    replicas: dict[str, int]
    repositories: dict[str, int]
    tasks: dict[str, int]
    enabled_namespaces: int
    search_enabled_namespaces: int
    #: Enabled namespaces with a replica of more than one index (split over nodes).
    split_namespaces: int = 0

    @property
    def online(self) -> int:
        return sum(1 for node in self.nodes if node.online)

    @property
    def searchable(self) -> int:
        return sum(1 for node in self.nodes if node.searchable)

    @property
    def memory_ratio(self) -> float:
        return self.settings.memory_ratio

    @property
    def memory_budget_bytes(self) -> int | None:
        """The configured per-node budget (source A); None: not configured."""
        return self.settings.node_memory_budget_bytes

    def totals(self, attr: str) -> int:
        return sum(getattr(node, attr) for node in self.nodes)

    @property
    def watermarks(self) -> dict[str, int]:
        counts = Counter(node.watermark.value for node in self.nodes)
        return {level.value: counts.get(level.value, 0) for level in NodeWatermark}


#: An enabled namespace is split when one of its replicas has more than one index
#: (each index on its own node, a range of its projects).
_SPLIT = Exists(
    Index.objects.filter(zoekt_replica__zoekt_enabled_namespace=OuterRef("pk"))
    .order_by()
    .values("zoekt_replica_id")
    .annotate(n=Count("id"))
    .filter(n__gt=1)
)


def natural_key(name: str) -> tuple:
    """Sort key that orders ``zoekt-2`` before ``zoekt-10`` (digits compare as numbers)."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part.lower())
        for part in re.split(r"(\d+)", name)
        if part
    )


def _index_counts() -> tuple[dict[int, Counter], Counter]:
    """Indices by state per node id, and over the fleet (one grouped query)."""
    per_node: dict[int, Counter] = defaultdict(Counter)
    fleet: Counter = Counter()
    for node_id, state, count in (
        Index.objects.order_by()
        .values_list("zoekt_node_id", "state")
        .annotate(count=Count("id"))
        .values_list("zoekt_node_id", "state", "count")
    ):
        per_node[node_id][state] += count
        fleet[state] += count
    return per_node, fleet


def fleet_overview(
    now: datetime | None = None, settings: app_settings.ZoektSettings | None = None
) -> FleetOverview:
    """Every node, by name (``natural_key``: zoekt-2 before zoekt-10), with its disk,
    memory, indices and tasks; and the fleet's counts.

    Queries: nodes with their reservations (1), searchable (2), memory (3),
    indices per node and state (1), tasks per node and state (1), and one
    count each for index watermark levels, replicas, repositories, enabled
    namespaces and split namespaces: 13, whatever the fleet size (the
    settings come from their cache).
    """
    now = now or clock.now()
    settings = settings or app_settings.current()
    nodes = list(Node.objects.with_unclaimed_storage_bytes().order_by("id"))
    searchable = set(Node.objects.searchable(now).values_list("id", flat=True))
    online_health = {
        node.id: (node.metadata, node.webserver_last_seen_at)
        for node in nodes
        if node.is_online(now)
    }
    exclusions = search_health.search_exclusions(
        online_health, now=now, max_restarts=settings.max_restarts_15m
    )
    memories = {row.node_id: row for row in memory.node_memory_report(settings=settings, now=now)}

    index_counts, fleet_indices = _index_counts()

    task_counts: dict[int, Counter] = defaultdict(Counter)
    tasks_due: Counter = Counter()
    fleet_tasks: Counter = Counter()
    pending = (Task.State.PENDING, Task.State.PROCESSING)
    for node_id, state, count, due in (
        Task.objects.order_by()
        .values_list("zoekt_node_id", "state")
        .annotate(
            count=Count("id"),
            due=Count("id", filter=Q(perform_at__lte=now, state__in=pending)),
        )
        .values_list("zoekt_node_id", "state", "count", "due")
    ):
        task_counts[node_id][state] += count
        tasks_due[node_id] += due
        fleet_tasks[state] += count

    development = capacity.watermark_limits(_development_watermarks())
    rows = [
        NodeRow(
            id=node.id,
            uuid=str(node.uuid),
            name=node.name,
            version=node.version,
            search_base_url=node.search_base_url,
            last_seen_at=node.last_seen_at,
            online=node.is_online(now),
            searchable=node.id in searchable,
            search_exclusions=tuple(str(reason) for reason in exclusions.get(node.id, ())),
            total_bytes=node.total_bytes,
            used_bytes=node.used_bytes,
            indexed_bytes=node.indexed_bytes,
            usable_storage_bytes=node.usable_storage_bytes,
            reserved_storage_bytes=node.reserved_storage_bytes,
            unclaimed_storage_bytes=node.unclaimed_storage_bytes,
            storage_percent_used=node.storage_percent_used,
            watermark=node.watermark,
            indices=_by_state(index_counts[node.id].items(), INDEX_STATE_NAMES),
            tasks=_by_state(task_counts[node.id].items(), TASK_STATE_NAMES),
            tasks_due=tasks_due[node.id],
            memory=memories.get(node.id),
            over_high_seconds=_seconds_since(node.high_watermark_exceeded_at, now),
            eviction_cooldown_until=_future(node.eviction_cooldown_until, now),
        )
        for node in nodes
    ]
    rows.sort(key=lambda row: (natural_key(row.name), row.id))
    enabled = EnabledNamespace.objects.aggregate(
        total=Count("id"), search=Count("id", filter=Q(search=True))
    )
    return FleetOverview(
        now=now,
        nodes=rows,
        settings=settings,
        watermark_limits=development,
        indices=_by_state(fleet_indices.items(), INDEX_STATE_NAMES),
        index_watermark_levels=_by_state(
            _grouped(Index.objects, "watermark_level"), WATERMARK_LEVEL_NAMES
        ),
        replicas=_by_state(_grouped(Replica.objects, "state"), REPLICA_STATE_NAMES),
        repositories=_by_state(_grouped(Repository.objects, "state"), REPOSITORY_STATE_NAMES),
        tasks=_by_state(fleet_tasks.items(), TASK_STATE_NAMES),
        enabled_namespaces=enabled["total"],
        search_enabled_namespaces=enabled["search"],
        split_namespaces=EnabledNamespace.objects.filter(_SPLIT).count(),
    )


def _seconds_since(then: datetime | None, now: datetime) -> int | None:
    return None if then is None else max(0, int((now - then).total_seconds()))


def _future(at: datetime | None, now: datetime) -> datetime | None:
    return at if at is not None and at > now else None


def _grouped(queryset, field: str) -> list[tuple[int, int]]:
    return list(
        queryset.order_by()
        .values_list(field)
        .annotate(count=Count("pk"))
        .values_list(field, "count")
    )


def _development_watermarks() -> bool:
    from django.conf import settings

    return bool(getattr(settings, "ZOEKT_DEVELOPMENT_WATERMARKS", False))


# ----------------------------------------------------------------------------
# Namespaces
# ----------------------------------------------------------------------------


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


class UnknownChoice(ValueError):
    """A query parameter outside its choices: the page answers 400 and names them."""

    def __init__(self, field: str, value: str, choices: Iterable[str]) -> None:
        self.field = field
        self.value = value
        self.choices = [choice for choice in choices if choice]
        super().__init__(f"unknown {field} {value!r}: one of {', '.join(self.choices)} (or none)")


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
        rows = rows.filter(_SPLIT)
    paginator = Paginator(rows, per_page)
    page_obj = paginator.get_page(page)
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
            replicas=_by_state(replicas[row.id].items(), REPLICA_STATE_NAMES),
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
    sized = sorted(
        (pid, size or 0)
        for pid, size in Namespace.objects.project_namespaces_under(root_namespace_id).values_list(
            "id", "project__statistics__repository_size"
        )
    )
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
    return NamespaceDetail(
        enabled=enabled,
        root=enabled.root_namespace,
        desired_replicas=enabled.number_of_replicas(settings.default_number_of_replicas),
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


# ----------------------------------------------------------------------------
# Rollout plans
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlanRow:
    id: int
    created_at: datetime
    dry_run: bool
    summary: dict[str, Any]

    @property
    def bounds(self) -> list[dict[str, Any]]:
        """``[{dimension, lower_bound, max_utilization, ratio}]`` (disk first)."""
        return [
            {"dimension": dimension, **values}
            for dimension, values in sorted(
                (self.summary.get("bounds") or {}).items(), key=lambda item: item[0] != "disk"
            )
        ]


def recent_plans(limit: int = 50) -> list[PlanRow]:
    """The newest rollout plans, without their plan and explanation bodies (one query)."""
    return [
        PlanRow(**row)
        for row in RolloutPlan.objects.order_by("-id").values(
            "id", "created_at", "dry_run", "summary"
        )[:limit]
    ]


@dataclasses.dataclass(frozen=True)
class PlannedIndexView:
    node_id: int
    node_name: str
    project_namespace_id_from: int | None
    project_namespace_id_to: int | None
    required_storage_bytes: int
    estimated_memory_bytes: int | None


@dataclasses.dataclass(frozen=True)
class Rejected:
    reason: str
    count: int
    dimension: str | None = None
    requested: int | None = None
    available: int | None = None


@dataclasses.dataclass(frozen=True)
class CandidateView:
    node_id: int
    node_name: str
    taken: list[tuple[int, int]]
    #: One entry per reason, with the last amounts requested and available.
    rejected: list[Rejected]
    detail: str | None


@dataclasses.dataclass(frozen=True)
class NamespacePlanView:
    namespace_id: int
    enabled_namespace_id: int
    path: str | None
    action: str
    failed: bool
    errors: list[dict[str, Any]]
    warnings: list[dict[str, Any]]
    required_storage_bytes: int
    replicas: list[list[PlannedIndexView]]
    replicas_to_destroy: list[int] | None
    #: None: this namespace was not explained (or the run kept no records).
    candidates: list[CandidateView] | None
    decisions: list[dict[str, Any]]
    decisions_total: int
    #: Balanced runs: each kept new-index decision's node and score, and the best
    #: usable nodes passed over with theirs.
    scores: list[ScoreView] = dataclasses.field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.failed:
            return "failed"
        if self.warnings:
            return "warnings"
        return "ok"


@dataclasses.dataclass(frozen=True)
class ScoreView:
    replica_idx: int
    index_idx: int
    node_name: str
    score: float
    runners_up: list[tuple[str, float]]


@dataclasses.dataclass(frozen=True)
class PlanDetail:
    row: PlanRow
    page: Page
    namespaces: list[NamespacePlanView]
    nodes: list[dict[str, Any]]
    node_names: dict[int, str]
    explained: bool

    @property
    def placed_nodes(self) -> int:
        return sum(1 for node in self.nodes if node.get("placed"))


PLAN_FILTERS = {"": "all", "failed": "failed", "warnings": "with warnings", "create": "create"}


def _share(part: int | None, whole: int | None) -> float | None:
    return part / whole if part is not None and whole and whole > 0 else None


def _plan_node(node: dict[str, Any], node_name: str) -> dict[str, Any]:
    """A plan's node entry for the page: disk always, memory when the plan had it."""
    out = {
        **node,
        "name": node_name,
        "placed": True,
        "utilization": _share(
            node["claimed_storage_bytes"], node["unclaimed_storage_bytes_before"]
        ),
    }
    if "unclaimed_memory_bytes_before" in node:
        before = node["unclaimed_memory_bytes_before"]
        after = node["unclaimed_memory_bytes_after"]
        claimed = None if before is None or after is None else before - after
        out["claimed_memory_bytes"] = claimed
        out["memory_utilization"] = _share(claimed, before)
    return out


def plan_detail(
    plan_id: int, *, filter: str = "", page: int | str = 1, per_page: int = 50
) -> PlanDetail | None:
    """One stored plan, its namespaces (failed first, then with warnings) a page at a time.

    Queries: the plan row (1) and the page's root namespace paths (1).
    """
    row = RolloutPlan.objects.filter(id=plan_id).first()
    if row is None:
        return None
    plan = row.plan or {}
    summary = row.summary or {}
    names = {int(key): value for key, value in (summary.get("node_names") or {}).items()}

    def name(node_id: int) -> str:
        return names.get(node_id, f"node-{node_id}")

    explained = {item["namespace_id"]: item for item in (row.explanation or [])}
    entries = [
        *plan.get("failures", []),
        *plan.get("create", []),
        *plan.get("destroy", []),
        *plan.get("unchanged", []),
    ]
    entries.sort(key=lambda ns: (not ns.get("errors"), not ns.get("warnings")))
    if filter == "failed":
        entries = [ns for ns in entries if ns.get("errors")]
    elif filter == "warnings":
        entries = [ns for ns in entries if ns.get("warnings")]
    elif filter == "create":
        entries = [ns for ns in entries if ns.get("action") == "create" and not ns.get("errors")]
    page_obj = Paginator(entries, per_page).get_page(page)
    on_page = list(page_obj.object_list)
    paths = dict(
        Namespace.objects.filter(id__in=[ns["namespace_id"] for ns in on_page]).values_list(
            "id", "path"
        )
    )
    views = []
    for ns in on_page:
        item = explained.get(ns["namespace_id"])
        candidates = None
        if item is not None:
            candidates = [
                CandidateView(
                    node_id=node["node_id"],
                    node_name=name(node["node_id"]),
                    taken=[tuple(taken) for taken in node["taken"]],
                    rejected=[
                        Rejected(reason, count, **(node.get("last") or {}).get(reason, {}))
                        for reason, count in node["passed_over"].items()
                    ],
                    detail=node.get("detail"),
                )
                for node in item["nodes"]
            ]
        views.append(
            NamespacePlanView(
                namespace_id=ns["namespace_id"],
                enabled_namespace_id=ns["enabled_namespace_id"],
                path=paths.get(ns["namespace_id"]),
                action=ns["action"],
                failed=bool(ns.get("errors")),
                errors=ns.get("errors", []),
                warnings=ns.get("warnings", []),
                required_storage_bytes=ns.get("namespace_required_storage_bytes", 0),
                replicas=[
                    [
                        PlannedIndexView(
                            node_id=index["node_id"],
                            node_name=name(index["node_id"]),
                            project_namespace_id_from=index["projects"][
                                "project_namespace_id_from"
                            ],
                            project_namespace_id_to=index["projects"]["project_namespace_id_to"],
                            required_storage_bytes=index["required_storage_bytes"],
                            estimated_memory_bytes=index.get("estimated_memory_bytes"),
                        )
                        for index in replica["indices"]
                    ]
                    for replica in ns.get("replicas", [])
                ],
                replicas_to_destroy=ns.get("replicas_to_destroy"),
                candidates=candidates,
                decisions=[] if item is None else item["decisions"],
                decisions_total=0 if item is None else item["decisions_total"],
                scores=[
                    ScoreView(
                        d["replica_idx"],
                        d["index_idx"],
                        name(d["node_id"]),
                        d["score"],
                        [(name(r["node_id"]), r["score"]) for r in d.get("runners_up", ())],
                    )
                    for d in ([] if item is None else item["decisions"])
                    if d.get("score") is not None
                ],
            )
        )
    nodes = [_plan_node(node, name(node["id"])) for node in plan.get("nodes", [])]
    # The header counts every candidate: list the ones that took nothing too.
    placed = {node["id"] for node in nodes}
    nodes += [
        {"id": node_id, "name": node_name, "placed": False}
        for node_id, node_name in sorted(names.items(), key=lambda item: natural_key(item[1]))
        if node_id not in placed
    ]
    return PlanDetail(
        row=PlanRow(row.id, row.created_at, row.dry_run, summary),
        page=page_obj,
        namespaces=views,
        nodes=nodes,
        node_names=names,
        explained=row.explanation is not None,
    )


# ----------------------------------------------------------------------------
# Evictions
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DecisionRow:
    id: int
    created_at: datetime
    last_seen_at: datetime
    repeats: int
    node_id: int | None
    node_name: str
    trigger: str
    mode: str
    reason: str
    applied_at: datetime | None
    namespaces_affected: int
    #: Used bytes of the indices it took off the node (0 for a skipped decision).
    evicted_bytes: int
    used_bytes: int
    total_bytes: int
    projected_used_bytes: int | None
    #: The cooldown it started: ended (when, why), or still running until.
    cooldown_ended_at: datetime | None
    cooldown_end_reason: str
    cooldown_until: datetime | None
    details: dict[str, Any]

    @property
    def applied(self) -> bool:
        return self.applied_at is not None

    @property
    def used_percent(self) -> float | None:
        return self.used_bytes / self.total_bytes if self.total_bytes else None

    @property
    def projected_percent(self) -> float | None:
        if self.projected_used_bytes is None or not self.total_bytes:
            return None
        return self.projected_used_bytes / self.total_bytes


@dataclasses.dataclass(frozen=True)
class EvictionPage:
    now: datetime
    settings: app_settings.ZoektSettings
    overview: EvictionOverview
    page: Page
    decisions: list[DecisionRow]
    watermark_limits: tuple[float, float, float]

    @property
    def high_watermark(self) -> float:
        return self.watermark_limits[1]

    @property
    def hysteresis_floor(self) -> float:
        """Under this the sustain clock is cleared (high − ``EVICTION_HYSTERESIS``)."""
        return self.watermark_limits[1] - capacity.EVICTION_HYSTERESIS

    @property
    def applied_total(self) -> int:
        return sum(self.overview.applied.values())

    @property
    def namespaces_affected_total(self) -> int:
        return sum(self.overview.namespaces_affected.values())

    @property
    def skipped_total(self) -> int:
        return sum(self.overview.skipped.values())


def eviction_page(
    *,
    page: int | str = 1,
    per_page: int = 50,
    now: datetime | None = None,
    settings: app_settings.ZoektSettings | None = None,
) -> EvictionPage:
    """The nodes over the high watermark and in cooldown, and a page of decisions.

    Newest first (by when a decision was last seen, so a skip that keeps
    repeating stays at the top). Queries: ``eviction_overview``'s counts and
    watched nodes (3), the count and the page with each decision's node (2).
    """
    now = now or clock.now()
    settings = settings or app_settings.current()
    overview = eviction_overview(recent=0, now=now)
    rows = EvictionDecision.objects.select_related("node").order_by("-last_seen_at", "-id")
    page_obj = Paginator(rows, per_page).get_page(page)
    decisions = []
    for row in page_obj.object_list:
        running = (
            row.applied_at is not None
            and row.cooldown_ended_at is None
            and row.node is not None
            and row.mode == EvictionDecision.Mode.SAFEGUARDS
        )
        decisions.append(
            DecisionRow(
                id=row.id,
                created_at=row.created_at,
                last_seen_at=row.last_seen_at,
                repeats=row.repeats,
                node_id=row.node_id,
                node_name=row.node_name or (row.node.name if row.node else f"node-{row.node_id}"),
                trigger=row.trigger,
                mode=row.mode,
                reason=row.reason,
                applied_at=row.applied_at,
                namespaces_affected=row.namespaces_affected,
                evicted_bytes=row.chosen_bytes,
                used_bytes=row.used_bytes,
                total_bytes=row.total_bytes,
                projected_used_bytes=row.projected_used_bytes,
                cooldown_ended_at=row.cooldown_ended_at,
                cooldown_end_reason=row.cooldown_end_reason,
                cooldown_until=_future(row.node.eviction_cooldown_until, now) if running else None,
                details=row.details or {},
            )
        )
    return EvictionPage(
        now=now,
        settings=settings,
        overview=overview,
        page=page_obj,
        decisions=decisions,
        watermark_limits=capacity.watermark_limits(_development_watermarks()),
    )


# ----------------------------------------------------------------------------
# Demo progress
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DemoProgress:
    """How far a fleet is from every enabled namespace having a ready replica.

    What ``manage.py zoekt_demo_drive`` prints while ``make demo`` converges.
    """

    nodes: int
    nodes_online: int
    enabled_namespaces: int
    #: Enabled namespaces with at least one ready replica.
    namespaces_ready: int
    #: Enabled namespaces with no replica at all (the rollout has not placed them).
    namespaces_without_replica: int
    #: ``{index state name: count}`` over every index, zeros included, in enum order.
    indices: dict[str, int]
    #: ``{node name: indices}`` for the nodes holding at least one index, by node id.
    indices_per_node: dict[str, int]
    #: ``{node name: ready indices}``, likewise, for the nodes holding a ready index.
    ready_indices_per_node: dict[str, int]
    repositories_ready: int
    repositories: int

    @property
    def converged(self) -> bool:
        """Every enabled namespace (and there is at least one) has a ready replica."""
        return 0 < self.enabled_namespaces == self.namespaces_ready


def demo_progress(now: datetime | None = None) -> DemoProgress:
    """Nodes online, namespaces ready, indices and repositories by state: 4 queries.

    Nodes (1, online decided in Python by ``Node.is_online``), enabled
    namespaces with and without replicas (1), indices per node and state (1),
    repositories per state (1).
    """
    now = now or clock.now()
    nodes = list(Node.objects.order_by("id").only("id", "metadata", "last_seen_at"))
    replicas = Replica.objects.filter(zoekt_enabled_namespace=OuterRef("pk"))
    namespaces = EnabledNamespace.objects.annotate(
        has_replica=Exists(replicas), has_ready=Exists(replicas.filter(state=Replica.State.READY))
    ).aggregate(
        total=Count("id"),
        ready=Count("id", filter=Q(has_ready=True)),
        without=Count("id", filter=Q(has_replica=False)),
    )
    per_node, states = _index_counts()
    repositories = dict(_grouped(Repository.objects, "state"))
    names = {node.id: node.name for node in nodes}
    held = sorted(per_node)
    return DemoProgress(
        nodes=len(nodes),
        nodes_online=sum(1 for node in nodes if node.is_online(now)),
        enabled_namespaces=namespaces["total"],
        namespaces_ready=namespaces["ready"],
        namespaces_without_replica=namespaces["without"],
        indices=_by_state(states.items(), INDEX_STATE_NAMES),
        indices_per_node={
            names.get(node_id, f"node-{node_id}"): sum(per_node[node_id].values())
            for node_id in held
        },
        ready_indices_per_node={
            names.get(node_id, f"node-{node_id}"): per_node[node_id][Index.State.READY]
            for node_id in held
            if per_node[node_id][Index.State.READY]
        },
        repositories_ready=repositories.get(Repository.State.READY, 0),
        repositories=sum(repositories.values()),
    )


# ----------------------------------------------------------------------------
# Moves
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MoveRow:
    id: int
    trigger: str
    state: str
    reason: str
    namespace_id: int
    namespace_path: str | None
    source_node: str
    target_node: str | None
    bytes: int
    created_at: datetime
    deadline_at: datetime | None
    #: Planned to done (or to now, while live; to parked or fallen back).
    seconds: int
    live: bool


@dataclasses.dataclass(frozen=True)
class MovePage:
    live: list[MoveRow]
    recent: Page
    rows: list[MoveRow]
    #: ``{state: count}`` over every move kept.
    states: dict[str, int]


def _move_row(move: Move, paths: dict[int, str], now: datetime) -> MoveRow:
    end = move.done_at or move.parked_at or move.fallen_back_at or move.cancelled_at or now
    return MoveRow(
        id=move.id,
        trigger=move.trigger,
        state=move.state,
        reason=move.reason,
        namespace_id=move.namespace_id,
        namespace_path=paths.get(move.namespace_id),
        source_node=move.source_node.name if move.source_node else "(gone)",
        target_node=move.target_node.name if move.target_node else None,
        bytes=move.bytes,
        created_at=move.created_at,
        deadline_at=move.deadline_at,
        seconds=max(0, int((end - move.created_at).total_seconds())),
        live=move.live,
    )


def move_page(*, page: int | str = 1, per_page: int = 50, now: datetime | None = None) -> MovePage:
    """The live moves (oldest first) and a page of the finished ones (newest first).

    Queries: states (1), live (1), the count and the page (2), paths (1).
    """
    now = now or clock.now()
    states = dict(_grouped(Move.objects, "state"))
    related = Move.objects.select_related("source_node", "target_node")
    live = list(related.live().order_by("id"))
    recent = Paginator(related.exclude(state__in=Move.LIVE).order_by("-id"), per_page).get_page(
        page
    )
    finished = list(recent.object_list)
    paths = dict(
        Namespace.objects.filter(id__in={m.namespace_id for m in [*live, *finished]}).values_list(
            "id", "path"
        )
    )
    return MovePage(
        live=[_move_row(m, paths, now) for m in live],
        recent=recent,
        rows=[_move_row(m, paths, now) for m in finished],
        states=states,
    )
