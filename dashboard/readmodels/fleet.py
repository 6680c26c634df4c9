"""The fleet page's read model (and ``/metrics``'s): ``fleet_overview``.

Per node disk (used, reserved, unclaimed, total and the watermark), memory
(``zoekt.memory.node_memory_report``: estimated against observed RSS against the
budget), shards loaded, index and task counts, online and searchable
(``NodeQuerySet.online`` / ``searchable``), the fleet's counts by state, and the
namespaces dark to search, by reason (``zoekt.search_targets.dark_namespaces``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from datetime import datetime

from django.db.models import Count, Q

from dashboard.readmodels.common import (
    INDEX_STATE_NAMES,
    REPLICA_STATE_NAMES,
    REPOSITORY_STATE_NAMES,
    SPLIT,
    TASK_STATE_NAMES,
    WATERMARK_LEVEL_NAMES,
    by_state,
    future,
    grouped,
    indices_by_node_and_state,
    seconds_since,
)
from dashboard.readmodels.maintenance import ShutdownRow, node_maintenance
from zoekt import (
    admission,
    app_settings,
    capacity,
    clock,
    memory,
    protocol,
    search_health,
    search_targets,
)
from zoekt.capacity import NodeWatermark
from zoekt.models import EnabledNamespace, Index, Node, Replica, Repository, Task, natural_key
from zoekt.protocol import NodeIndexing

#: How many dark namespaces the fleet page links to by name.
DARK_EXAMPLES = 5


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
    #: Whether the node serves search (``NodeQuerySet.for_search``: the zoekt service).
    for_search: bool = True
    schema_version: int | None = None
    #: The indexer's RSS as the node reports it in its metadata (None: not reported).
    indexer_rss_bytes: int | None = None
    #: The node's live shutdown record (restart, drain), as the Maintenance page shows it.
    shutdown: ShutdownRow | None = None
    #: Its task slots (the concurrency limit), the work in them and its backlog
    #: (``zoekt.protocol.indexing_figures``), and the disk left for builds up to the build
    #: ceiling after their temporary bytes (docs/scheduling.md, admission control).
    slots: int = 0
    indexing: NodeIndexing = dataclasses.field(default_factory=NodeIndexing)
    build_headroom_bytes: int = 0

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
    #: Enabled namespaces with search on whose projects a search cannot all reach, by
    #: reason (``zoekt.search_targets.dark_namespaces``: its rule, over every namespace).
    dark_namespaces: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The first few of them (root namespace ids, lowest first), for the page to link.
    dark_examples: tuple[int, ...] = ()

    @property
    def build_ceiling(self) -> float:
        """The disk share builds in flight may fill (admission control)."""
        return admission.build_ceiling(*self.watermark_limits[:2])

    @property
    def dark(self) -> int:
        """Enabled namespaces with search on that a search finds no target for."""
        return sum(self.dark_namespaces.values())

    @property
    def in_maintenance(self) -> int:
        """Nodes with a live shutdown record (restarting or draining)."""
        return sum(1 for node in self.nodes if node.shutdown is not None)

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


def fleet_overview(
    now: datetime | None = None, settings: app_settings.ZoektSettings | None = None
) -> FleetOverview:
    """Every node, by name (``natural_key``: zoekt-2 before zoekt-10), with its disk,
    memory, indices and tasks; and the fleet's counts.

    Queries: nodes with their reservations (1), searchable (2), memory (3),
    indices per node and state (1), tasks per node and state (1), the live
    shutdown records (1, and 2 more while a node drains), one count each
    for index watermark levels, replicas, repositories, enabled namespaces and
    split namespaces, and the dark namespaces (``search_targets``' four: the
    namespaces, their ready indices, searchable) and the indexing figures per node
    and priority (1): 19 (21 with a drain), whatever the fleet size (the settings
    come from their cache).
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

    index_counts, fleet_indices = indices_by_node_and_state()

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

    development = capacity.watermark_limits(app_settings.development_watermarks())
    maintenance = node_maintenance(now)
    indexing = protocol.indexing_figures(settings.indexing_temporary_space_factor)
    idle = NodeIndexing()
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
            indices=by_state(index_counts[node.id].items(), INDEX_STATE_NAMES),
            tasks=by_state(task_counts[node.id].items(), TASK_STATE_NAMES),
            tasks_due=tasks_due[node.id],
            memory=memories.get(node.id),
            over_high_seconds=seconds_since(node.high_watermark_exceeded_at, now),
            eviction_cooldown_until=future(node.eviction_cooldown_until, now),
            for_search=Node.Service.ZOEKT in (node.services or ()),
            schema_version=node.schema_version,
            indexer_rss_bytes=memory.process_counter(node.metadata, "indexer", "rss_bytes"),
            shutdown=maintenance.get(node.id),
            slots=node.concurrency_limit(settings.cpu_to_tasks_ratio),
            indexing=indexing.get(node.id, idle),
            build_headroom_bytes=admission.NodeRoom(
                slots=0,
                total_bytes=node.total_bytes,
                used_bytes=node.used_bytes,
                low_watermark=development[0],
                high_watermark=development[1],
            ).headroom_bytes(indexing.get(node.id, idle).temporary_bytes),
        )
        for node in nodes
    ]
    rows.sort(key=lambda row: (natural_key(row.name), row.id))
    dark = search_targets.dark_namespaces(now)
    enabled = EnabledNamespace.objects.aggregate(
        total=Count("id"), search=Count("id", filter=Q(search=True))
    )
    return FleetOverview(
        now=now,
        nodes=rows,
        settings=settings,
        watermark_limits=development,
        indices=by_state(fleet_indices.items(), INDEX_STATE_NAMES),
        index_watermark_levels=by_state(
            grouped(Index.objects, "watermark_level"), WATERMARK_LEVEL_NAMES
        ),
        replicas=by_state(grouped(Replica.objects, "state"), REPLICA_STATE_NAMES),
        repositories=by_state(grouped(Repository.objects, "state"), REPOSITORY_STATE_NAMES),
        tasks=by_state(fleet_tasks.items(), TASK_STATE_NAMES),
        enabled_namespaces=enabled["total"],
        search_enabled_namespaces=enabled["search"],
        split_namespaces=EnabledNamespace.objects.filter(SPLIT).count(),
        dark_namespaces={str(reason): len(ids) for reason, ids in dark.items()},
        dark_examples=tuple(sorted(i for ids in dark.values() for i in ids)[:DARK_EXAMPLES]),
    )
