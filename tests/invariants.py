"""The fleet's invariants, read from the database: what no race, crash or outage may break.

``violations()`` returns one line per broken invariant (empty when all hold):

* no enabled namespace with two indices on one node;
* no namespace with more replicas than it wants, except one more while a
  live move holds its lease (the move's build replica);
* no repository with two pending tasks of one type;
* no node whose indices reserve more than its usable storage (``reserved``,
  after a rollout: the planner and the apply never plan past it);
* no namespace that was searchable before (``searchable_before``) without a
  search target now, unless a recorded fallback deleted it.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from zoekt import app_settings
from zoekt.models import EnabledNamespace, Move
from zoekt.search_targets import search_targets_many


def _rows(sql: str, params: Iterable = ()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return cursor.fetchall()


def searchable_roots() -> set[int]:
    roots = list(EnabledNamespace.objects.values_list("root_namespace_id", flat=True))
    return {root for root, answer in search_targets_many(roots).items() if answer.targets}


def violations(*, reserved: bool = False, searchable_before: set[int] = frozenset()) -> list[str]:
    out = []
    for enabled_id, node_id, n in _rows(
        "SELECT zoekt_enabled_namespace_id, zoekt_node_id, count(*) FROM zoekt_indices "
        "GROUP BY 1, 2 HAVING count(*) > 1"
    ):
        out.append(f"namespace {enabled_id} has {n} indices on node {node_id}")
    default = app_settings.current().default_number_of_replicas
    leased = set(Move.objects.live().values_list("zoekt_enabled_namespace_id", flat=True))
    for enabled_id, wanted, n in _rows(
        "SELECT e.id, coalesce(e.number_of_replicas_override, %s), count(r.id) "
        "FROM zoekt_enabled_namespaces e JOIN zoekt_replicas r "
        "ON r.zoekt_enabled_namespace_id = e.id GROUP BY 1, 2",
        [default],
    ):
        allowed = wanted + (1 if enabled_id in leased else 0)
        if n > allowed:
            out.append(f"namespace {enabled_id} has {n} replicas, wants {wanted}")
    for repo_id, task_type, n in _rows(
        "SELECT zoekt_repository_id, task_type, count(*) FROM zoekt_tasks WHERE state = 0 "
        "GROUP BY 1, 2 HAVING count(*) > 1"
    ):
        out.append(f"repository {repo_id} has {n} pending tasks of type {task_type}")
    if reserved:
        for node_id, usable, claimed in _rows(
            "SELECT n.id, n.usable_storage_bytes, coalesce(sum(i.reserved_storage_bytes), 0) "
            "FROM zoekt_nodes n LEFT JOIN zoekt_indices i ON i.zoekt_node_id = n.id "
            "GROUP BY 1, 2"
        ):
            if claimed > usable:
                out.append(f"node {node_id} reserves {claimed} of {usable} usable bytes")
    if searchable_before:
        fell_back = set(
            Move.objects.filter(state=Move.State.FALLEN_BACK).values_list("namespace_id", flat=True)
        )
        for root in sorted(searchable_before - searchable_roots() - fell_back):
            out.append(f"namespace {root} lost its last ready copy outside a recorded fallback")
    return out
