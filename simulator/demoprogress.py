"""The demo's progress: nodes online, namespaces with a ready replica, indices and
repositories by state (what ``make demo``'s driver prints while the fleet converges).

``demo_progress`` reads the database in a fixed number of queries, with the
dashboard's state names and counting helpers (``dashboard.readmodels.common``);
it is the demo's, so it lives with the simulator, which nothing in the product
imports.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from django.db.models import Count, Exists, OuterRef, Q

from dashboard.readmodels.common import (
    INDEX_STATE_NAMES,
    by_state,
    grouped,
    indices_by_node_and_state,
)
from zoekt import clock
from zoekt.models import EnabledNamespace, Index, Node, Replica, Repository


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
    per_node, states = indices_by_node_and_state()
    repositories = dict(grouped(Repository.objects, "state"))
    names = {node.id: node.name for node in nodes}
    held = sorted(per_node)
    return DemoProgress(
        nodes=len(nodes),
        nodes_online=sum(1 for node in nodes if node.is_online(now)),
        enabled_namespaces=namespaces["total"],
        namespaces_ready=namespaces["ready"],
        namespaces_without_replica=namespaces["without"],
        indices=by_state(states.items(), INDEX_STATE_NAMES),
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
