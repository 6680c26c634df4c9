"""A slow, literal model of GitLab's newest PlanningService, for tests.

It walks the steps as ``../shared/reference/gitlab-zoekt.md`` 5.3 and
``gitlab-planner-newest.md`` state them (one index per namespace and node,
the fit test before the node search, empty replicas avoiding the
namespace's nodes, the two wordings of ``node_unavailable``, node names in
the output), node dicts and all, asks ``planner.filters`` the "can it go
here?" question for every candidate of every project that needs a node, and
builds the contract's JSON shape itself (not through ``planner.plan``). The
optimised ``planner.core`` must produce the same bytes.

It also models the product's options of the disk dimension, as
``docs/planner.md`` states them: ``strategy: balanced`` (the passing node
with the best ``planner.filters.node_score``, asked of
``planner.filters.least_allocated``), ``order: largest_first`` and
``max_index_storage_fraction`` (a ceiling on each new index's
max_storage_bytes; a namespace that fails under it is planned again without).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from planner.filters import (
    Candidate,
    best_for_empty_replica,
    first_fit,
    least_allocated,
    storage_capacity,
)
from planner.scenario import BALANCED, DISK, LARGEST_FIRST, Scenario


def reference_plan(scenario: Scenario) -> dict[str, Any]:
    options = scenario.options
    named = any(node.name is not None for node in scenario.nodes)
    fraction = options.max_index_storage_fraction
    nodes = [
        {
            "id": node.id,
            "name": node.name,
            "unclaimed": node.unclaimed_storage_bytes,
            "before": node.unclaimed_storage_bytes,
            # What balanced scores against: the disk size, never below the unclaimed.
            "capacity": storage_capacity(node.total_bytes, node.unclaimed_storage_bytes),
            "ceiling": None
            if fraction is None
            else int(max(node.unclaimed_storage_bytes, 0) * Fraction(repr(fraction))),
            "indices": [],
        }
        for node in scenario.nodes
    ]
    by_id = {node["id"]: node for node in nodes}
    balanced = options.strategy == BALANCED
    order = list(range(len(scenario.namespaces)))
    if options.order == LARGEST_FIRST:

        def size(ns) -> int:
            return sum(p.repository_size for p in ns.projects if p.repository_size is not None)

        order.sort(key=lambda i: -size(scenario.namespaces[i]))
    by_position: dict[int, dict[str, Any]] = {}
    for position in order:
        ns = scenario.namespaces[position]
        existing = len(ns.existing_replicas)
        desired = ns.number_of_replicas
        action = (
            "create" if existing < desired else "destroy" if existing > desired else "unchanged"
        )
        errors: list[dict[str, Any]] = []
        warnings: list[dict[str, Any]] = []
        replicas: list[list[dict[str, Any]]] = []
        result: dict[str, Any] = {
            "namespace_id": ns.namespace_id,
            "enabled_namespace_id": ns.enabled_namespace_id,
            "action": action,
        }

        if action == "destroy":
            ordered = sorted(ns.existing_replicas, key=lambda r: (r.state_value, -r.id))
            result["replicas_to_destroy"] = [r.id for r in ordered[: existing - desired]]
        elif action == "create":
            snapshot = [(n["unclaimed"], list(n["indices"])) for n in nodes]
            # The ceiling applies to a namespace larger than the smallest one.
            total = sum(
                options.scale(p.repository_size)
                for p in ns.projects
                if p.repository_size is not None
            )
            ceilings = fraction is not None and total > min(
                (n["ceiling"] for n in nodes), default=0
            )
            replicas, errors = _create(ns, nodes, by_id, options, balanced, ceilings=ceilings)
            if errors and ceilings:
                # The ceiling made it fail: planned again without it.
                for n, (unclaimed, indices) in zip(nodes, snapshot, strict=True):
                    n["unclaimed"], n["indices"] = unclaimed, indices
                first = errors[0]
                replicas, errors = _create(ns, nodes, by_id, options, balanced, ceilings=False)
                if not errors:
                    warnings.append(
                        {
                            "namespace_id": ns.namespace_id,
                            "replica_idx": None,
                            "type": "disk_ceiling_abandoned",
                            "details": "The placement under the disk ceiling per index "
                            "(max_index_storage_fraction) would have failed "
                            f"({first['type']} in replica {first['replica_idx']}: "
                            f"{first['details']}); the namespace is planned without it, each "
                            "index taking up to its node's unclaimed storage",
                        }
                    )
        # GitLab's newest planner names every index's node (null when nameless); a
        # placed plan carries the key only when some node has a name, a failed one always.
        carries_name = named or bool(errors)
        result["replicas"] = [
            {"indices": [_out(i, carries_name) for i in replica]} for replica in replicas
        ]
        result["namespace_required_storage_bytes"] = sum(
            i["required"] for replica in replicas for i in replica
        )
        unique: list[dict[str, Any]] = []
        for item in errors:
            if item not in unique:
                unique.append(item)
        result["errors"] = unique
        result["warnings"] = warnings
        by_position[position] = result
    results = [by_position[position] for position in range(len(order))]

    failures = [r for r in results if r["errors"]]
    ok = [r for r in results if not r["errors"]]
    create = [r for r in ok if r["action"] == "create"]
    return {
        "total_required_storage_bytes": sum(r["namespace_required_storage_bytes"] for r in create),
        "create": create,
        "destroy": [r for r in ok if r["action"] == "destroy"],
        "unchanged": [r for r in ok if r["action"] == "unchanged"],
        "failures": failures,
        "nodes": [
            {
                "id": n["id"],
                **({"name": n["name"]} if named else {}),
                "unclaimed_storage_bytes_before": n["before"],
                "unclaimed_storage_bytes_after": n["unclaimed"],
                "claimed_storage_bytes": sum(i["required"] for i in n["indices"]),
                "namespace_ids": sorted({i["namespace_id"] for i in n["indices"]}),
                "indices": [
                    {**_out(i, named), "namespace_id": i["namespace_id"]}
                    for i in sorted(n["indices"], key=lambda i: i["namespace_id"])
                ],
            }
            for n in nodes
            if n["indices"]
        ],
    }


def _create(ns, nodes, by_id, options, balanced: bool, *, ceilings: bool):
    """The missing replicas of ``ns``: (replicas, errors), the nodes updated."""
    existing = len(ns.existing_replicas)
    desired = ns.number_of_replicas
    errors: list[dict[str, Any]] = []
    replicas: list[list[dict[str, Any]]] = []
    # Nodes this namespace may not use: those holding any of its indices
    # in the database, then every node a replica of this run takes.
    used: set[int] = set(ns.existing_node_ids)

    def error(replica_idx, type_, details):
        errors.append(
            {
                "namespace_id": ns.namespace_id,
                "replica_idx": replica_idx,
                "type": type_,
                "details": details,
            }
        )

    for _ in range(desired - existing):
        if not ns.projects:
            candidates = [Candidate(n["id"], {DISK: n["unclaimed"]}) for n in nodes]
            best, _ = best_for_empty_replica(candidates, used)
            if best is None:
                error(
                    None,
                    "node_unavailable",
                    "No nodes available to create an empty replica",
                )
                continue
            node = nodes[best]
            # The empty index claims nothing and is not listed on its node.
            replicas.append([_index(node, ns.namespace_id)])
            used.add(node["id"])
            continue
        replica: list[dict[str, Any]] = []
        for project in ns.projects:  # ascending project namespace id
            if project.repository_size is None:
                continue
            cap = options.max_indices_per_replica
            if len(replica) >= cap:
                error(
                    len(replicas),
                    "index_limit_exceeded",
                    f"Replica reached maximum index limit ({cap})",
                )
                break
            size = options.scale(project.repository_size)
            last = replica[-1] if replica else None
            if last is not None and last["required"] + size <= last["max"]:
                # The fit test comes first: no node search.
                last["to"] = project.project_namespace_id
                last["required"] += size
                by_id[last["node_id"]]["unclaimed"] -= size
                continue
            excluded = used | {i["node_id"] for i in replica}
            candidates = [Candidate(n["id"], {DISK: n["unclaimed"]}) for n in nodes]
            if balanced:
                capacities = [{DISK: n["capacity"]} for n in nodes]
                position, _ = least_allocated(candidates, {DISK: size}, excluded, capacities)
            else:
                position, _ = first_fit(candidates, {DISK: size}, excluded)
            if position is None:
                if any(n["unclaimed"] >= size for n in nodes):
                    details = (
                        f"Every node with capacity for project {project.project_id} "
                        f"with size {size} already holds an index for this namespace"
                    )
                else:
                    details = (
                        f"No node can accommodate project {project.project_id} with size {size}"
                    )
                error(len(replicas), "node_unavailable", details)
                continue
            best = nodes[position]
            index = _index(best, ns.namespace_id)
            if ceilings and best["ceiling"] is not None and best["ceiling"] < index["max"]:
                index["max"] = max(best["ceiling"], size)  # never below its first project
            if last is not None:
                index["from"] = last["to"] + 1
            index["to"] = project.project_namespace_id
            index["required"] = size
            best["unclaimed"] -= size
            best["indices"].append(index)
            replica.append(index)
        if replica:
            replica[-1]["to"] = None
        replicas.append(replica)
        used.update(i["node_id"] for i in replica)
    return replicas, errors


def _index(node: dict[str, Any], namespace_id: int) -> dict[str, Any]:
    return {
        "node_id": node["id"],
        "node_name": node["name"],
        "namespace_id": namespace_id,
        "from": None,
        "to": None,
        "required": 0,
        "max": node["unclaimed"],
    }


def _out(index: dict[str, Any], named: bool) -> dict[str, Any]:
    out = {
        "node_id": index["node_id"],
        "projects": {
            "project_namespace_id_from": index["from"],
            "project_namespace_id_to": index["to"],
        },
        "required_storage_bytes": index["required"],
        "max_storage_bytes": index["max"],
    }
    if named:
        out["node_name"] = index["node_name"]
    return out
