"""Small builders for scenario dicts, and a compact view of a plan for table-driven cases."""

from __future__ import annotations

from typing import Any


def node(node_id: int, unclaimed: int, name: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": node_id, "unclaimed_storage_bytes": unclaimed}
    if name is not None:
        out["name"] = name
    return out


def namespace(
    enabled_id: int,
    root_id: int,
    projects: list[tuple[int, int, int | None]] | None = None,
    *,
    replicas: int = 1,
    existing: list[tuple[int, str]] | None = None,
    on_nodes: list[int] | None = None,
) -> dict[str, Any]:
    """``projects`` as (project_namespace_id, project_id, repository_size).

    ``on_nodes``: the nodes already holding an index of the namespace
    (``existing_node_ids``).
    """
    out: dict[str, Any] = {
        "enabled_namespace_id": enabled_id,
        "namespace_id": root_id,
        "number_of_replicas": replicas,
        "existing_replicas": [{"id": i, "state": state} for i, state in existing or []],
        "projects": [
            {"project_namespace_id": pnid, "project_id": pid, "repository_size": size}
            for pnid, pid, size in projects or []
        ],
    }
    if on_nodes is not None:
        out["existing_node_ids"] = on_nodes
    return out


def scenario(
    nodes: list[dict[str, Any]],
    namespaces: list[dict[str, Any]],
    *,
    buffer_factor: int | float = 1,
    max_indices_per_replica: int | None = None,
) -> dict[str, Any]:
    options: dict[str, Any] = {"buffer_factor": buffer_factor}
    if max_indices_per_replica is not None:
        options["max_indices_per_replica"] = max_indices_per_replica
    return {"options": options, "nodes": nodes, "namespaces": namespaces}


def compact(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan with every fact kept but fewer braces, for hand-written expectations.

    * an index is ``(node_id, from, to, required, max)``;
    * ``create`` maps namespace id → replicas (lists of indices);
    * ``failures`` maps namespace id → {"replicas": ..., "errors": [(replica_idx, type), ...]};
    * ``destroy`` maps namespace id → replica ids; ``unchanged`` lists namespace ids;
    * ``nodes`` maps node id → (before, after, claimed, namespace_ids).
    """

    def replicas(ns: dict[str, Any]) -> list[list[tuple[Any, ...]]]:
        return [
            [
                (
                    index["node_id"],
                    index["projects"]["project_namespace_id_from"],
                    index["projects"]["project_namespace_id_to"],
                    index["required_storage_bytes"],
                    index["max_storage_bytes"],
                )
                for index in replica["indices"]
            ]
            for replica in ns["replicas"]
        ]

    return {
        "total": plan["total_required_storage_bytes"],
        "create": {ns["namespace_id"]: replicas(ns) for ns in plan["create"]},
        "failures": {
            ns["namespace_id"]: {
                "replicas": replicas(ns),
                "errors": [(e["replica_idx"], e["type"]) for e in ns["errors"]],
            }
            for ns in plan["failures"]
        },
        "destroy": {ns["namespace_id"]: ns["replicas_to_destroy"] for ns in plan["destroy"]},
        "unchanged": [ns["namespace_id"] for ns in plan["unchanged"]],
        "nodes": {
            n["id"]: (
                n["unclaimed_storage_bytes_before"],
                n["unclaimed_storage_bytes_after"],
                n["claimed_storage_bytes"],
                n["namespace_ids"],
            )
            for n in plan["nodes"]
        },
    }


def expected(
    *,
    total: int = 0,
    create: dict[int, Any] | None = None,
    failures: dict[int, Any] | None = None,
    destroy: dict[int, list[int]] | None = None,
    unchanged: list[int] | None = None,
    nodes: dict[int, tuple[int, int, int, list[int]]] | None = None,
) -> dict[str, Any]:
    return {
        "total": total,
        "create": create or {},
        "failures": failures or {},
        "destroy": destroy or {},
        "unchanged": unchanged or [],
        "nodes": nodes or {},
    }
