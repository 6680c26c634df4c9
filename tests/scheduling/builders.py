"""Rows in bulk for the scheduling tests: a batch limit needs a thousand rows, in few inserts."""

from __future__ import annotations

from django.db import connection

from tests.factories import GroupFactory, NodeFactory
from zoekt import clock
from zoekt.models import EnabledNamespace, Index, Namespace, Node, Project, Replica, Repository


def roots(count: int) -> list[Namespace]:
    """``count`` top-level groups."""
    rows = Namespace.objects.bulk_create(
        [
            Namespace(name=f"bulk-{i}", path=f"bulk-{i}", type=Namespace.Type.GROUP)
            for i in range(count)
        ]
    )
    ids = [row.id for row in rows]
    with connection.cursor() as cursor:
        cursor.execute("UPDATE namespaces SET traversal_ids = ARRAY[id] WHERE id = ANY(%s)", [ids])
    for row in rows:
        row.traversal_ids = [row.id]
    return rows


def projects(root: Namespace, count: int) -> list[Project]:
    """``count`` projects directly under ``root``, each with its project namespace, in id order."""
    namespaces = Namespace.objects.bulk_create(
        [
            Namespace(
                name=f"p-{root.id}-{i}", path=f"p-{i}", type=Namespace.Type.PROJECT, parent=root
            )
            for i in range(count)
        ]
    )
    ids = [row.id for row in namespaces]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE namespaces SET traversal_ids = ARRAY[%s::bigint, id] WHERE id = ANY(%s)",
            [root.id, ids],
        )
    return Project.objects.bulk_create(
        [
            Project(name=ns.name, path=ns.path, namespace=root, project_namespace=ns)
            for ns in namespaces
        ]
    )


def indices(count: int, node: Node | None = None, **fields) -> list[Index]:
    """``count`` indices on ``node`` (one new node by default), each of its own namespace."""
    node = node or NodeFactory()
    groups = roots(count)
    enabled = EnabledNamespace.objects.bulk_create(
        [EnabledNamespace(root_namespace=group) for group in groups]
    )
    replicas = Replica.objects.bulk_create(
        [Replica(zoekt_enabled_namespace=e, namespace_id=e.root_namespace_id) for e in enabled]
    )
    return Index.objects.bulk_create(
        [
            Index(
                zoekt_enabled_namespace=e,
                zoekt_replica=r,
                zoekt_node=node,
                namespace_id=e.root_namespace_id,
                **fields,
            )
            for e, r in zip(enabled, replicas, strict=True)
        ]
    )


def repositories(index: Index, count: int, **fields) -> list[Repository]:
    """``count`` repositories in ``index``, each of a new project of the index's namespace."""
    root = Namespace.objects.get(pk=index.namespace_id)
    rows = projects(root, count)
    now = clock.now()
    return Repository.objects.bulk_create(
        [
            Repository(
                zoekt_index=index,
                project=p,
                project_identifier=p.id,
                created_at=now,
                updated_at=now,
                **fields,
            )
            for p in rows
        ]
    )


def group_with_index(node: Node | None = None, **fields) -> Index:
    """One enabled namespace with one replica and one index on ``node``."""
    return indices(1, node, **fields)[0]


__all__ = ["GroupFactory", "group_with_index", "indices", "projects", "repositories", "roots"]
