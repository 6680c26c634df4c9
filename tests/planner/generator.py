"""A seeded generator of random planning scenarios in the contract's JSON shape.

Used to compare the optimised core with the literal model of GitLab's newest
planner (``reference_impl``) on thousands of scenarios, and handy for a bug
report: ``random_scenario(random.Random(seed))`` is the same scenario on
every machine. The scenarios use every input the newest planner reads:
``existing_node_ids`` (candidates and non-candidates), node names (some
null), several replicas, ``number_of_replicas: 0``, existing replicas in
both states, projects without statistics, empty namespaces, negative
unclaimed storage, integral and fractional buffer factors, and small index
caps.
"""

from __future__ import annotations

import random
from typing import Any

STATES = ("pending", "ready")


def random_scenario(rng: random.Random) -> dict[str, Any]:
    node_ids = rng.sample(range(1, 40), rng.randint(0, 8))
    named = rng.random() < 0.5
    nodes = []
    for node_id in node_ids:
        node: dict[str, Any] = {
            "id": node_id,
            "unclaimed_storage_bytes": rng.choice(
                [rng.randint(-50, 300), rng.randint(0, 2000), 0, 1000]
            ),
        }
        if named:
            node["name"] = None if rng.random() < 0.2 else f"zoekt-{node_id}"
        nodes.append(node)
    namespaces = []
    replica_id = 1
    project_id = 1
    for n, enabled_id in enumerate(rng.sample(range(1, 500), rng.randint(1, 6))):
        projects = []
        if rng.random() > 0.15:  # else an empty namespace
            for pnid in sorted(rng.sample(range(1, 300), rng.randint(1, 16))):
                size = (
                    None
                    if rng.random() < 0.1
                    else rng.choice([rng.randint(0, 60), rng.randint(0, 400)])
                )
                projects.append(
                    {
                        "project_namespace_id": pnid,
                        "project_id": project_id,
                        "repository_size": size,
                    }
                )
                project_id += 1
            rng.shuffle(projects)
        existing = []
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            existing.append({"id": replica_id, "state": rng.choice(STATES)})
            replica_id += 1
        holders = rng.sample([*node_ids, 90, 91], rng.randint(0, min(3, len(node_ids) + 2)))
        namespaces.append(
            {
                "enabled_namespace_id": enabled_id,
                "namespace_id": 10_000 + n,
                "number_of_replicas": rng.choice([0, 1, 1, 1, 2, 2, 3]),
                "existing_replicas": existing,
                "projects": projects,
                "existing_node_ids": holders,
            }
        )
    options = {
        "buffer_factor": rng.choice([1, 2, 3, 1.5, 2.5]),
        "max_indices_per_replica": rng.choice([1, 2, 3, 5, 10]),
    }
    return {"options": options, "nodes": nodes, "namespaces": namespaces}
