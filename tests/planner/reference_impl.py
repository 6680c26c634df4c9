"""A slow, literal transcription of GitLab's PlanningService (reference 5.3), for tests.

It walks the steps exactly as the reference states them, node dicts and all,
asks ``planner.filters`` the "can it go here?" question for every candidate
of every project, and builds the contract's JSON shape itself (not through
``planner.plan``). The optimised ``planner.core`` must produce the same bytes.
The only addition to GitLab is ours, documented in docs/planner.md: an index
planned on a node that already holds an index of the namespace is recorded
as a ``node_reused_in_namespace`` error.
"""

from __future__ import annotations

from typing import Any

from planner.filters import Candidate, best_for_empty_replica, first_fit
from planner.scenario import DISK, Scenario


def reference_plan(scenario: Scenario) -> dict[str, Any]:
    options = scenario.options
    nodes = [
        {
            "id": node.id,
            "unclaimed": node.unclaimed_storage_bytes,
            "before": node.unclaimed_storage_bytes,
            "indices": [],
        }
        for node in scenario.nodes
    ]
    by_id = {node["id"]: node for node in nodes}
    results = []
    for ns in scenario.namespaces:
        existing = len(ns.existing_replicas)
        desired = ns.number_of_replicas
        action = (
            "create" if existing < desired else "destroy" if existing > desired else "unchanged"
        )
        errors: list[dict[str, Any]] = []
        replicas: list[list[dict[str, Any]]] = []
        exhausted: set[int] = set()
        result: dict[str, Any] = {
            "namespace_id": ns.namespace_id,
            "enabled_namespace_id": ns.enabled_namespace_id,
            "action": action,
        }

        def error(replica_idx, type_, details, ns=ns, errors=errors):
            errors.append(
                {
                    "namespace_id": ns.namespace_id,
                    "replica_idx": replica_idx,
                    "type": type_,
                    "details": details,
                }
            )

        if action == "destroy":
            ordered = sorted(ns.existing_replicas, key=lambda r: (r.state_value, -r.id))
            result["replicas_to_destroy"] = [r.id for r in ordered[: existing - desired]]
        elif action == "create":
            for _ in range(desired - existing):
                if not ns.projects:
                    candidates = [Candidate(n["id"], {DISK: n["unclaimed"]}) for n in nodes]
                    best, _ = best_for_empty_replica(candidates, exhausted)
                    if best is None:
                        error(
                            None,
                            "node_unavailable",
                            "No nodes available to create an empty replica",
                        )
                        continue
                    node = nodes[best]
                    index = _index(node, ns.namespace_id)
                    node["indices"].append(index)
                    replicas.append([index])
                    exhausted.add(node["id"])
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
                    candidates = [Candidate(n["id"], {DISK: n["unclaimed"]}) for n in nodes]
                    position, _ = first_fit(candidates, {DISK: size}, exhausted)
                    if position is None:
                        error(
                            len(replicas),
                            "node_unavailable",
                            f"No node can accommodate project {project.project_id} "
                            f"with size {size}",
                        )
                        continue
                    best = nodes[position]
                    last = replica[-1] if replica else None
                    if last is not None and last["required"] + size <= last["max"]:
                        index = last
                        assigned = by_id[last["node_id"]]
                    else:
                        if any(i["node_id"] == best["id"] for i in replica):
                            error(
                                len(replicas),
                                "node_reused_in_namespace",
                                f"Index {len(replica)} of replica {len(replicas)} is planned on "
                                f"node {best['id']}, which already holds index 0 of this replica; "
                                "provisioning would violate the unique (enabled namespace, node) "
                                "index",
                            )
                        index = _index(best, ns.namespace_id)
                        replica.append(index)
                        best["indices"].append(index)
                        assigned = best
                        if last is not None:
                            exhausted.add(best["id"])  # the inverted bookkeeping (10.1)
                            index["from"] = last["to"] + 1
                    index["to"] = project.project_namespace_id
                    index["required"] += size
                    assigned["unclaimed"] -= size
                if replica:
                    replica[-1]["to"] = None
                replicas.append(replica)
                exhausted.update(i["node_id"] for i in replica)
        result["replicas"] = [{"indices": [_out(i) for i in replica]} for replica in replicas]
        result["namespace_required_storage_bytes"] = sum(
            i["required"] for replica in replicas for i in replica
        )
        unique: list[dict[str, Any]] = []
        for item in errors:
            if item not in unique:
                unique.append(item)
        result["errors"] = unique
        result["warnings"] = []
        results.append(result)

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
                "unclaimed_storage_bytes_before": n["before"],
                "unclaimed_storage_bytes_after": n["unclaimed"],
                "claimed_storage_bytes": sum(i["required"] for i in n["indices"]),
                "namespace_ids": sorted({i["namespace_id"] for i in n["indices"]}),
                "indices": [
                    {**_out(i), "namespace_id": i["namespace_id"]}
                    for i in sorted(n["indices"], key=lambda i: i["namespace_id"])
                ],
            }
            for n in nodes
            if n["indices"]
        ],
    }


def _index(node: dict[str, Any], namespace_id: int) -> dict[str, Any]:
    return {
        "node_id": node["id"],
        "namespace_id": namespace_id,
        "from": None,
        "to": None,
        "required": 0,
        "max": node["unclaimed"],
    }


def _out(index: dict[str, Any]) -> dict[str, Any]:
    return {
        "node_id": index["node_id"],
        "projects": {
            "project_namespace_id_from": index["from"],
            "project_namespace_id_to": index["to"],
        },
        "required_storage_bytes": index["required"],
        "max_storage_bytes": index["max"],
    }
