"""A small, fully described fleet for the dashboard, metrics and browser tests.

``build_fleet(nodes, namespaces)`` makes ``nodes`` search nodes (version
1.16.2, healthy webservers reporting RSS, shards and a memory limit) with
disk use rising across them, and ``namespaces`` enabled root groups of three
projects each, every one with a ready replica of one ready index (the
first two projects) on node ``i % nodes``, plus a pending index for the
third project on the next node, and a ready repository per project.
Everything is reachable from the returned ``Fleet`` so a test can compare
what a page shows with what the database holds.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from tests.factories import GIB, GroupFactory, NodeFactory, ProjectFactory
from zoekt import clock
from zoekt.models import (
    EnabledNamespace,
    Index,
    Namespace,
    Node,
    Project,
    Replica,
    Repository,
    Task,
)

MIB = 1024**2


@dataclasses.dataclass
class Fleet:
    nodes: list[Node]
    namespaces: list[EnabledNamespace]
    projects: dict[int, list[Project]]  # root namespace id → projects
    indices: list[Index]


def build_fleet(
    nodes: int = 3,
    namespaces: int = 3,
    *,
    seen_at: datetime | None = None,
    repository_size: int = 200 * MIB,
) -> Fleet:
    seen_at = seen_at or clock.now()
    node_rows = [
        NodeFactory(
            total_bytes=100 * GIB,
            used_bytes=(20 + 10 * (i % 8)) * GIB,
            indexed_bytes=5 * GIB,
            last_seen_at=seen_at,
            webserver_last_seen_at=seen_at,
            metadata={
                "name": f"zoekt-{i}",
                "version": "1.16.2",
                "concurrency": 4,
                "process_health": {
                    "webserver": {
                        "rss_bytes": (2 + i % 4) * GIB,
                        "shards_loaded": 10 + i,
                        "memory_limit_bytes": 8 * GIB,
                        "restarts_15m": 0,
                    }
                },
            },
        )
        for i in range(nodes)
    ]
    enabled_rows, indices = [], []
    projects: dict[int, list[Project]] = {}
    for i in range(namespaces):
        root = GroupFactory(name=f"group-{i:03d}")
        enabled = EnabledNamespace.objects.create(root_namespace=root)
        enabled_rows.append(enabled)
        own = [
            ProjectFactory(namespace=root, name=f"g{i}-p{j}", repository_size=repository_size)
            for j in range(3)
        ]
        projects[root.id] = own
        replica = Replica.objects.create(
            zoekt_enabled_namespace=enabled, namespace=root, state=Replica.State.READY
        )
        split = own[1].project_namespace_id
        first = Index.objects.create(
            zoekt_enabled_namespace=enabled,
            zoekt_replica=replica,
            zoekt_node=node_rows[i % nodes],
            namespace_id=root.id,
            state=Index.State.READY,
            reserved_storage_bytes=2 * GIB,
            used_storage_bytes=1 * GIB,
            metadata={"project_namespace_id_to": split},
        )
        indices.append(first)
        for project in own[:2]:
            Repository.objects.create(
                zoekt_index=first,
                project=project,
                project_identifier=project.id,
                state=Repository.State.READY,
                size_bytes=repository_size,
            )
        if nodes > 1:
            second = Index.objects.create(
                zoekt_enabled_namespace=enabled,
                zoekt_replica=replica,
                zoekt_node=node_rows[(i + 1) % nodes],
                namespace_id=root.id,
                state=Index.State.READY,
                reserved_storage_bytes=1 * GIB,
                used_storage_bytes=300 * MIB,
                metadata={"project_namespace_id_from": split + 1},
            )
            indices.append(second)
            Repository.objects.create(
                zoekt_index=second,
                project=own[2],
                project_identifier=own[2].id,
                state=Repository.State.READY,
                size_bytes=repository_size,
            )
        Task.objects.create(
            zoekt_node_id=node_rows[i % nodes].id,
            zoekt_repository_id=own[0].id,  # one pending task per (fictional) repository
            project_identifier=own[0].id,
            task_type=Task.TaskType.INDEX_REPO,
            perform_at=clock.now() - timedelta(seconds=1),
        )
    return Fleet(nodes=node_rows, namespaces=enabled_rows, projects=projects, indices=indices)


def unplaced_namespace(name: str, sizes: tuple[int | None, ...]) -> EnabledNamespace:
    """An enabled root group without replicas: the next rollout plans it (a size of None:
    a project without statistics)."""
    root = GroupFactory(name=name)
    for j, size in enumerate(sizes):
        ProjectFactory(namespace=root, name=f"{name}-p{j}", repository_size=size)
    return EnabledNamespace.objects.create(root_namespace=root)


def root_of(enabled: EnabledNamespace) -> Namespace:
    return Namespace.objects.get(pk=enabled.root_namespace_id)
