"""Which enabled namespaces a rollout plans, and on which candidate nodes (reference 5.2).

GitLab's ``SelectionService``, at the database edge of the planner:

* **namespaces**: the enabled namespaces that are allowed to roll out (never
  failed, or failed longer ago than the retry interval), walked in id
  batches of 5,000; within each batch those whose replica count (any state)
  differs from the desired count (the override, else the default setting);
  ascending id; at most ``max_batch_size`` of them.
* **nodes**: ``available_for_search_indexing`` (online, for search, positive
  unclaimed storage), most unclaimed first and then by id, each with its
  unclaimed bytes computed in SQL. This order is the planner's candidate
  order. While memory planning is on (the ``zoekt_node_memory_budget_bytes``
  setting is set), a node at or over the high memory watermark (observed
  webserver RSS ÷ its memory budget, ``zoekt.memory``) takes no new index:
  it is left out of the candidates and listed in ``memory_excluded``.

The two lists form the *resource pool* the loader turns into a scenario.
The cost is two queries per 5,000 enabled namespaces walked plus one for the
nodes, whatever the number of projects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from zoekt import app_settings, clock, memory
from zoekt.models import EnabledNamespace, Node

#: GitLab's ``each_batch_with_mismatched_replicas`` batch size.
NAMESPACE_BATCH_SIZE = 5_000
#: GitLab's default ``max_batch_size`` (the rollout job passes the setting instead).
DEFAULT_MAX_BATCH_SIZE = 128


@dataclass(frozen=True, slots=True)
class SelectedNamespace:
    enabled_namespace_id: int
    namespace_id: int
    #: Desired replica count: the override, else the default setting.
    number_of_replicas: int
    #: Replicas it has now (every state).
    replica_count: int


@dataclass(frozen=True, slots=True)
class SelectedNode:
    id: int
    unclaimed_storage_bytes: int
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ResourcePool:
    """The namespaces to plan (ascending id) and the candidate nodes (candidate order)."""

    namespaces: tuple[SelectedNamespace, ...]
    nodes: tuple[SelectedNode, ...]
    #: Nodes otherwise available but over the high memory watermark (memory
    #: planning on only): ``(node id, RSS ÷ budget)``, by candidate order.
    memory_excluded: tuple[tuple[int, float], ...] = ()


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

    def execute(self) -> ResourcePool:
        namespaces = tuple(self.namespaces())
        nodes = tuple(self.nodes())
        return ResourcePool(
            namespaces=namespaces, nodes=nodes, memory_excluded=tuple(self.memory_excluded)
        )

    # ------------------------------------------------------------------ #

    def namespaces(self) -> list[SelectedNamespace]:
        """Mismatched, rollout-allowed enabled namespaces in id order, up to the batch size."""
        default = self.settings.default_number_of_replicas
        allowed = EnabledNamespace.objects.with_rollout_allowed(
            self.settings.rollout_retry_interval_seconds, self.now
        )
        selected: list[SelectedNamespace] = []
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
            rows = (
                batch.with_mismatched_replicas(default)
                .order_by("id")
                .values_list("id", "root_namespace_id", "desired_replicas", "replica_count")[
                    : self.max_batch_size - len(selected)
                ]
            )
            selected.extend(SelectedNamespace(*row) for row in rows)
            if upper is None:
                break
            after = upper
        return selected

    def nodes(self) -> list[SelectedNode]:
        """The candidate nodes: online, for search, positive unclaimed; most unclaimed first.

        While memory planning is on, nodes at or over the high memory
        watermark are left out (and recorded in ``memory_excluded``).
        """
        rows = Node.objects.available_for_search_indexing(self.now).values_list(
            "id", "annotated_unclaimed_storage_bytes", "metadata"
        )
        configured = self.settings.node_memory_budget_bytes
        self.memory_excluded = []
        selected = []
        for node_id, unclaimed, metadata in rows:
            metadata = metadata or {}
            if memory.excluded_from_placement(metadata, configured):
                budget, _ = memory.memory_budget(metadata, configured)
                rss = memory.webserver_counter(metadata, "rss_bytes")
                self.memory_excluded.append((node_id, memory.memory_percent_used(rss, budget)))
                continue
            selected.append(SelectedNode(node_id, unclaimed, metadata))
        return selected
