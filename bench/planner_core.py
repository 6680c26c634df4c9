"""Planner core benchmark: plan time for 100,000 and 1,000,000 projects on 200 nodes.

Run it with ``python bench/planner_core.py`` (no database, no services). For
each size it builds a deterministic synthetic scenario (seeded), parses it
once, then plans it three times and prints the best time, with and without
the decision records ``planner.explain`` reads.

It then plans the *same* scenario with the memory dimension on (a
configured per-node memory budget, ``--memory-fill`` of it claimed by the
estimated memory of everything planned, so that big namespaces hit
``max_memory_bytes`` and split) and prints the memory-on time, its ratio to
the disk-only time (the target: at most 1.5×) and what memory did.

The synthetic fleet: 200 nodes, listed as GitLab's selection lists them
(most unclaimed first), sized so that the planned bytes fill about 70% of
their unclaimed storage (each node 0.5–1.5× the mean). The namespaces: a
heavy-tailed mix (most have a handful of projects, a few have tens of
thousands), about 1 in 20 projects without statistics, repository sizes
log-normal around 24 MiB (median), some namespaces with 2 replicas, a few with
nothing to do (unchanged or destroy) and a few empty. Most namespaces fit
one index; the biggest roll over to several indices, and some fail (first
fit over a stale order, the index cap): every path of the core runs.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.core import plan
from planner.scenario import parse_scenario, placement_options

NODES = 200
SEED = 20260301
FILL = 0.7
#: With memory on: the share of the fleet's memory budget the estimated
#: memory of every planned replica would claim.
MEMORY_FILL = 0.6


def synthetic_scenario(projects: int, *, nodes: int = NODES, seed: int = SEED) -> dict[str, Any]:
    rng = random.Random(seed)
    namespaces: list[dict[str, Any]] = []
    next_pnid = 1_000_000
    next_pid = 1
    left = projects
    ns_index = 0
    while left > 0:
        ns_index += 1
        # Heavy tail: Pareto-distributed project counts, capped by what is left.
        count = min(left, max(1, int(rng.paretovariate(1.1) * 3)), 60_000)
        project_list = []
        for _ in range(count):
            size = None if rng.random() < 0.05 else int(rng.lognormvariate(17, 1.6))
            next_pnid += rng.randint(1, 3)
            project_list.append(
                {"project_namespace_id": next_pnid, "project_id": next_pid, "repository_size": size}
            )
            next_pid += 1
        rng.shuffle(project_list)
        left -= count
        roll = rng.random()
        existing: list[dict[str, Any]] = []
        replicas = 2 if roll < 0.1 else 1
        if roll > 0.98:
            existing = [
                {"id": ns_index * 10 + k, "state": "ready"} for k in range(1 + (roll > 0.99))
            ]
        namespaces.append(
            {
                "enabled_namespace_id": ns_index,
                "namespace_id": 10 * ns_index,
                "number_of_replicas": replicas,
                "existing_replicas": existing,
                "projects": project_list,
            }
        )
        if rng.random() < 0.01:
            ns_index += 1
            namespaces.append(
                {"enabled_namespace_id": ns_index, "namespace_id": 10 * ns_index, "projects": []}
            )
    # Size the fleet to the demand: the planned bytes of every replica fill
    # about FILL of it, so big namespaces roll over and a few do not fit.
    demand = sum(
        3 * p["repository_size"] * ns.get("number_of_replicas", 1)
        for ns in namespaces
        for p in ns["projects"]
        if p["repository_size"] is not None
    )
    mean = demand / FILL / nodes
    node_list = [
        {"id": i + 1, "unclaimed_storage_bytes": int(mean * rng.uniform(0.5, 1.5))}
        for i in range(nodes)
    ]
    # As GitLab's selection lists them: most unclaimed first.
    node_list.sort(key=lambda node: -node["unclaimed_storage_bytes"])
    return {
        "options": {"buffer_factor": 3, "max_indices_per_replica": 10},
        "nodes": node_list,
        "namespaces": namespaces,
    }


def with_memory_budget(data: dict[str, Any], fill: float = MEMORY_FILL) -> dict[str, Any]:
    """The same scenario with a configured per-node memory budget (memory on)."""
    ratio = 0.5  # the default memory_ratio
    demand = sum(
        ratio * p["repository_size"] * ns.get("number_of_replicas", 1)
        for ns in data["namespaces"]
        for p in ns["projects"]
        if p["repository_size"] is not None
    )
    budget = int(demand / fill / len(data["nodes"]))
    options = dict(data["options"])
    options["memory"] = {"node_memory_budget_bytes": budget, "memory_ratio": ratio}
    return {**data, "options": options}


def best_of_each(runs: int, *fns) -> list[tuple[float, Any]]:
    """The best time of each function over ``runs`` rounds, the functions taking turns."""
    best = [float("inf")] * len(fns)
    results: list[Any] = [None] * len(fns)
    for _ in range(runs):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            results[i] = fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return list(zip(best, results, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--projects", type=int, nargs="*", default=[100_000, 1_000_000], help="sizes to run"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--memory-fill", type=float, default=MEMORY_FILL)
    args = parser.parse_args()

    print(f"| projects | namespaces | nodes | parse s | plan s (best of {args.runs}) "
          "| plan s, no decisions | indices | multi-index replicas | failures |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    memory_rows = []
    for count in args.projects:
        data = synthetic_scenario(count)
        start = time.perf_counter()
        scenario = parse_scenario(data)
        parse_seconds = time.perf_counter() - start
        memory = parse_scenario(with_memory_budget(data, args.memory_fill))
        # Interleaved, so that a change in the machine's load hits both alike.
        (plan_seconds, result), (mem_seconds, mem_result) = best_of_each(
            args.runs, lambda s=scenario: plan(s), lambda s=memory: plan(s)
        )
        (bare_seconds, _), (mem_bare, _) = best_of_each(
            args.runs,
            lambda s=scenario: plan(s, record_decisions=False),
            lambda s=memory: plan(s, record_decisions=False),
        )
        print(
            f"| {count:,} | {len(scenario.namespaces):,} | {len(scenario.nodes)} "
            f"| {parse_seconds:.2f} | {plan_seconds:.3f} | {bare_seconds:.3f} {_summary(result)}"
        )
        memory_rows.append((count, plan_seconds, mem_seconds, bare_seconds, mem_bare, mem_result))

    print()
    print(f"Memory on (budget: {args.memory_fill:.0%} of it claimed by the estimates):")
    print()
    print("| projects | disk-only s | memory s | ratio | disk-only s, no decisions "
          "| memory s, no decisions | ratio | indices | multi-index replicas | failures "
          "| memory warnings | memory bound max/lower |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for count, disk_s, mem_s, disk_bare, mem_bare, result in memory_rows:
        warnings = Counter(w.type for ns in result.namespaces_in_order for w in ns.warnings)
        bound = result.bounds["memory"]
        print(
            f"| {count:,} | {disk_s:.3f} | {mem_s:.3f} | {mem_s / disk_s:.2f}x "
            f"| {disk_bare:.3f} | {mem_bare:.3f} | {mem_bare / disk_bare:.2f}x "
            f"{_summary(result)} "
            f"{', '.join(f'{k} {v}' for k, v in sorted(warnings.items())) or 'none'} "
            f"| {bound['max_utilization']:.3f} / {bound['lower_bound']:.3f} |"
        )

    print()
    print("The placement strategy (no decision records; the target: balanced within 1.5×).")
    print("The balanced choice alone (options.strategy), and the product's balanced placement")
    print("(with largest first and the disk ceiling per index), each against first fit:")
    print()
    print("| projects | dimension | first fit s | balanced choice s | ratio "
          "| the product's s | ratio |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|")
    variants = (
        {"strategy": "first_fit"},
        {"strategy": "balanced"},
        {"strategy": "balanced", **placement_options("balanced")},
    )
    for count in args.projects:
        data = synthetic_scenario(count)
        for label, base in (("disk", data), ("memory", with_memory_budget(data, args.memory_fill))):
            scenarios = [
                parse_scenario({**base, "options": {**base["options"], **options}})
                for options in variants
            ]
            (first_s, _), (choice_s, _), (product_s, _) = best_of_each(
                args.runs,
                *(lambda s=scenario: plan(s, record_decisions=False) for scenario in scenarios),
            )
            print(
                f"| {count:,} | {label} | {first_s:.3f} | {choice_s:.3f} "
                f"| {choice_s / first_s:.2f}x | {product_s:.3f} | {product_s / first_s:.2f}x |"
            )
    return 0


def _summary(result) -> str:
    indices = sum(len(node.indices) for node in result.nodes)
    multi = sum(
        len(replica.indices) > 1 for ns in result.namespaces_in_order for replica in ns.replicas
    )
    failures = Counter(error.type for ns in result.failures for error in ns.errors)
    return (
        f"| {indices:,} | {multi:,} | {len(result.failures):,} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(failures.items())) or 'none'}) |"
    )


if __name__ == "__main__":
    sys.exit(main())
