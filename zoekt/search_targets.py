"""Where a search of one root namespace fans out to, or why it cannot.

A search goes to one replica of the namespace: a *ready* replica (state
``ready``, at least one index, every index ``ready``) whose every index sits
on a searchable node (``Node.objects.searchable``: online, for_search, and
healthy by ``zoekt.search_health``). Of several such replicas the one with
the lowest id is chosen, so the answer is stable between calls. Its targets
are the replica's nodes, ordered by node id, each with the indices it holds
there (ordered by index id) and their project-namespace id ranges.

When there is no target the answer says why, with a code from
``zoekt.reasons``, checked in this order:

``namespace_not_enabled``  no enabled namespace has this root namespace id
``search_disabled``        the enabled namespace has ``search = false``
``no_ready_replica``       no replica is ready (with every index ready)
``no_searchable_replica``  ready replicas exist, each with an index on a node
                           that is not searchable

GitLab's ``Replica.search_enabled?`` asks only for a ready replica with an
index on an online node; this is stricter (every index, searchable nodes),
because a fan-out that misses one index misses part of the namespace.

It costs the same four queries whatever the number of replicas, indices or
nodes: the enabled namespace, the ready replicas' indices with their nodes,
and the two of ``searchable``. ``search_targets_many`` answers for many
namespaces in those same four queries (a namespace with no ready index
needs fewer); ``search_targets`` is it for one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import F

from zoekt import clock
from zoekt.models import EnabledNamespace, Index, Move, Node, Replica
from zoekt.reasons import Reason


@dataclasses.dataclass(frozen=True)
class TargetIndex:
    index_id: int
    project_namespace_id_from: int | None
    project_namespace_id_to: int | None


@dataclasses.dataclass(frozen=True)
class SearchTarget:
    node_id: int
    node_name: str
    search_base_url: str
    replica_id: int
    indices: tuple[TargetIndex, ...]


@dataclasses.dataclass(frozen=True)
class SearchTargets:
    namespace_id: int
    targets: tuple[SearchTarget, ...] = ()
    reason: Reason | None = None

    @property
    def search_enabled(self) -> bool:
        """True when a search of the namespace has somewhere to go."""
        return bool(self.targets)

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace_id": self.namespace_id,
            "search_enabled": self.search_enabled,
            "targets": [dataclasses.asdict(target) for target in self.targets],
            "reason": None if self.reason is None else str(self.reason),
        }


def search_targets(root_namespace_id: int, now: datetime | None = None) -> SearchTargets:
    """The chosen replica's nodes and indices for a search of ``root_namespace_id``."""
    return search_targets_many([root_namespace_id], now)[root_namespace_id]


def search_targets_many(
    root_namespace_ids: Iterable[int], now: datetime | None = None
) -> dict[int, SearchTargets]:
    """``search_targets`` of each root namespace id, in the same four queries for any number."""
    now = now or clock.now()
    ids = sorted(set(root_namespace_ids))
    enabled = {
        row.root_namespace_id: row
        for row in EnabledNamespace.objects.filter(root_namespace_id__in=ids).only(
            "id", "root_namespace_id", "search"
        )
    }
    searching = [row.id for row in enabled.values() if row.search]
    indices: list[Index] = []
    if searching:
        # A live move's replacement is built in a replica of its own, a partial copy
        # until it joins the serving replica at the swap: never a search target.
        ready_replicas = (
            Replica.objects.filter(
                zoekt_enabled_namespace_id__in=searching, state=Replica.State.READY
            )
            .exclude(
                id__in=Move.objects.live()
                .filter(replacement_replica_id__isnull=False)
                .values("replacement_replica_id")
            )
            .with_all_ready_indices()
        )
        indices = list(
            Index.objects.filter(zoekt_replica__in=ready_replicas)
            .select_related("zoekt_node")
            .annotate(replica_enabled_namespace_id=F("zoekt_replica__zoekt_enabled_namespace_id"))
            .order_by("zoekt_replica_id", "zoekt_node_id", "id")
        )
    # enabled namespace id (the replica's) -> replica id -> its indices, sorted by (node, id)
    by_namespace: dict[int, dict[int, list[Index]]] = {}
    for index in indices:
        replicas = by_namespace.setdefault(index.replica_enabled_namespace_id, {})
        replicas.setdefault(index.zoekt_replica_id, []).append(index)
    node_ids = {index.zoekt_node_id for index in indices}
    searchable = (
        set(Node.objects.filter(pk__in=node_ids).searchable(now).values_list("id", flat=True))
        if node_ids
        else set()
    )

    answers: dict[int, SearchTargets] = {}
    for root_id in ids:
        row = enabled.get(root_id)
        if row is None:
            answers[root_id] = SearchTargets(root_id, reason=Reason.NAMESPACE_NOT_ENABLED)
        elif not row.search:
            answers[root_id] = SearchTargets(root_id, reason=Reason.SEARCH_DISABLED)
        else:
            answers[root_id] = _choose(root_id, by_namespace.get(row.id, {}), searchable)
    return answers


def _choose(
    root_id: int, by_replica: dict[int, list[Index]], searchable: set[int]
) -> SearchTargets:
    """The lowest-id ready replica whose every index is on a searchable node."""
    if not by_replica:
        return SearchTargets(root_id, reason=Reason.NO_READY_REPLICA)
    for replica_id in sorted(by_replica):
        replica_indices = by_replica[replica_id]
        if all(index.zoekt_node_id in searchable for index in replica_indices):
            return SearchTargets(root_id, targets=_targets(replica_id, replica_indices))
    return SearchTargets(root_id, reason=Reason.NO_SEARCHABLE_REPLICA)


def _targets(replica_id: int, indices: list[Index]) -> tuple[SearchTarget, ...]:
    """One target per node, in node id order; ``indices`` is sorted by (node, id)."""
    per_node: dict[int, list[Index]] = {}
    for index in indices:
        per_node.setdefault(index.zoekt_node_id, []).append(index)
    return tuple(
        SearchTarget(
            node_id=node_id,
            node_name=node_indices[0].zoekt_node.name,
            search_base_url=node_indices[0].zoekt_node.search_base_url,
            replica_id=replica_id,
            indices=tuple(
                TargetIndex(
                    index_id=index.id,
                    project_namespace_id_from=index.metadata.get("project_namespace_id_from"),
                    project_namespace_id_to=index.metadata.get("project_namespace_id_to"),
                )
                for index in node_indices
            ),
        )
        for node_id, node_indices in per_node.items()
    )
