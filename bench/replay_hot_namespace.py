"""Replay: the seed's hot-namespace cluster, placed by disk only and memory-aware.

Run it with ``python -m config.devservers exec -- .venv/bin/python
bench/replay_hot_namespace.py`` (or with ``DATABASE_URL`` and ``REDIS_URL``
set); it uses the scratch database ``<name>_replay_hot``. Everything runs
through ``simulator.replay``: the real API, planner, scheduling and
database, fake nodes and a simulated clock.

The cluster is the one of the memory issue (two nodes, round figures):

* two nodes of 1 TiB disk, each reporting a webserver memory limit of
  96 GiB;
* 60 small root groups (about 20 GiB of repositories, 1,000 projects),
  enabled first; once they are ready, one hot group of 400 projects and
  about 91 GiB of repositories (the projects of
  ``tests/planner/data/seed_reported_cluster.json``) is enabled;
* a repository's index takes 3 × its repository size on disk (GitLab's
  planning buffer factor), so the hot group takes about 27 % of a node;
* webserver RSS (``NamespaceMemoryModel``): 2 MiB per shard loaded plus the
  index bytes held × the namespace's memory factor: 0.49 for the hot group
  (the ~49 % resident-to-disk ratio observed in the escalation), 0.125 for
  the small ones (GitLab's sizing rule of thumb, 32 GiB per 256 GB of index;
  it puts them at about 5 GiB per node, as in the escalation).

It runs the same timeline twice from an empty database: **disk-only**
(``zoekt_node_memory_budget_bytes`` unset: GitLab's planner) and
**memory-aware** (the budget set to 96 GiB per node and ``memory_ratio``
1.5, the ratio the hot group shows per repository byte). It prints, per run
and node, the indices held, disk used, the RSS the simulator observes and
the control plane's memory estimate, and the max/min ratio of observed RSS
between the nodes; it writes a PNG chart of per-node disk and RSS over
simulated time (``--chart``, default ``docs/replays/hot_namespace.png``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.replays import (
    GIB,
    ROOT,
    clock_text,
    finish,
    reset_database,
    run_all,
    setup_django,
)

TIB = 1024 * GIB
MIB = 1024**2
SEED_SCENARIO = ROOT / "tests" / "planner" / "data" / "seed_reported_cluster.json"
HOT_ROOT = 500_000
SMALL_ROOT_BASE = 600_000
BUFFER = 3
HOT_FACTOR = 0.49
SMALL_FACTOR = 0.125
BUDGET = 96 * GIB
MEMORY_RATIO = 1.5
NODES = ("zoekt-0", "zoekt-1")
NODE_CONCURRENCY = 8


def build_catalog(seed: int) -> tuple[dict[int, str], list[tuple[int, int, int]]]:
    """Root groups (id → path) and projects (id, root, repository size) of the cluster."""
    scenario = json.loads(SEED_SCENARIO.read_text())
    hot_projects = scenario["namespaces"][0]["projects"]
    roots = {HOT_ROOT: "hot-group"}
    projects = [(100_000 + p["project_id"], HOT_ROOT, p["repository_size"]) for p in hot_projects]
    rng = random.Random(seed)
    project_id = 200_000
    for k in range(60):
        root = SMALL_ROOT_BASE + k
        roots[root] = f"small-group-{k:02d}"
        for _ in range(rng.randint(10, 24)):
            project_id += 1
            size = int(min(rng.lognormvariate(math.log(12 * MIB), 1.0), 2 * GIB))
            projects.append((project_id, root, size))
    return roots, projects


def run_once(
    label: str,
    *,
    memory_aware: bool,
    seed: int,
    tick: float,
    quiet: bool,
    resplit: bool = False,
    rate_mib: float = 20.0,
):
    from simulator.replay import Replay, catalog_rows, fleet_state

    roots, projects = build_catalog(seed)
    sizes = {project_id: size * BUFFER for project_id, _, size in projects}
    hotness = {root: SMALL_FACTOR for root in roots}
    hotness[HOT_ROOT] = HOT_FACTOR
    small = [root for root in roots if root != HOT_ROOT]
    reset_database()
    started = time.perf_counter()
    with Replay(
        index_size=lambda repo_id: sizes.get(repo_id, MIB),
        hotness=hotness,
        tick_seconds=tick,
        traffic={},
        seed=seed,
        # Indexing takes time: 20 MiB/s of index a task, 8 tasks a node (as the
        # eviction replays), so a re-split's carve builds over many ticks.
        indexing_bytes_per_second=rate_mib * MIB,
        node_concurrency=NODE_CONCURRENCY,
    ) as replay:
        replay.settings(
            # GitLab's placement (the product's default is balanced): the runs show
            # the escalation's shape and what memory planning and a re-split change.
            zoekt_placement_strategy="first_fit",
            zoekt_indexing_enabled=True,
            zoekt_search_enabled=True,
            # Placement alone: the reconciler would move the first-fit layout (its own replay).
            zoekt_rebalance_enabled=False,
            zoekt_node_memory_budget_bytes=BUDGET if memory_aware else None,
            zoekt_memory_ratio=MEMORY_RATIO,
        )
        replay.load_catalog(*catalog_rows(roots, projects))
        for name in NODES:
            replay.add_node(name, disk_total_bytes=TIB, memory_limit_bytes=BUDGET)

        def progress(r: Replay) -> None:
            if not quiet and int(r.t) % 1800 == 0:
                state = fleet_state()
                print(
                    f"  [{label}] {clock_text(r.t):>13}  namespaces short "
                    f"{state['namespaces_short']}/{state['namespaces']}  indices ready "
                    f"{state['indices_ready']}/{state['indices']}",
                    file=sys.stderr,
                )

        replay.enable(small, label="small groups enabled")
        small_ready = replay.run(4 * 3600, until=lambda r: r.converged(), progress=progress)
        small_at = replay.t
        replay.run(600, progress=progress)  # steady for ten minutes
        hot_enabled_at = replay.t
        replay.enable([HOT_ROOT], label="hot group enabled")
        hot_ready = replay.run(6 * 3600, until=lambda r: r.converged(), progress=progress)
        hot_at = replay.t
        replay.run(1800, progress=progress)  # and half an hour of steady state
        report = node_report(replay)
        warnings = plan_warnings()
        extra = {}
        if resplit:
            extra = resplit_hot_group(replay, roots, progress)
            extra["before"] = report
            report = node_report(replay)
        wall = time.perf_counter() - started
    return replay, {
        **extra,
        "label": label,
        "small_ready": small_ready,
        "small_ready_after_s": small_at,
        "hot_ready": hot_ready,
        "hot_ready_after_s": hot_at - hot_enabled_at,
        "simulated_s": replay.t,
        "wall_s": wall,
        "nodes": report,
        "plan_warnings": warnings,
    }


def resplit_hot_group(replay, roots: dict[int, str], progress) -> dict:
    """Memory planning switched on over the disk-only layout, then ``zoekt_move --resplit``
    of the hot group; runs until every carve is done and the carved repositories are gone
    from the source node. Every tick, at the instant searches are drawn, counts the
    namespaces without a search target."""
    from eviction import moves
    from zoekt.models import Index, Move, Repository
    from zoekt.search_targets import search_targets_many

    replay.settings(zoekt_node_memory_budget_bytes=BUDGET, zoekt_memory_ratio=MEMORY_RATIO)
    replay.event("re-split of the hot group")
    started_at = replay.t
    plan = moves.start_resplit(HOT_ROOT)
    source_index = plan.source_index_id
    ticks = {"watched": 0, "dark_namespace_ticks": 0, "hot_dark_ticks": 0}

    def watch(r) -> None:
        if not Move.objects.filter(namespace_id=HOT_ROOT).exists():
            return
        answers = search_targets_many(roots)
        ticks["watched"] += 1
        dark = [root for root, answer in answers.items() if not answer.targets]
        ticks["dark_namespace_ticks"] += len(dark)
        ticks["hot_dark_ticks"] += HOT_ROOT in dark

    replay.watch(watch)

    def finished(r) -> bool:
        live = Move.objects.live().filter(namespace_id=HOT_ROOT).exists()
        leaving = Repository.objects.filter(
            zoekt_index_id=source_index,
            state__in=(Repository.State.PENDING_DELETION, Repository.State.DELETED),
        ).exists()
        return not live and not leaving and r.converged()

    done = replay.run(24 * 3600, until=finished, progress=progress)
    finished_at = replay.t
    replay.run(1800, progress=progress)
    done_moves = list(Move.objects.filter(namespace_id=HOT_ROOT).order_by("id"))
    # The thrash check: memory-pressure moves switched on over the re-split layout (both
    # nodes near the high memory watermark) for 24 simulated hours.
    settled = Move.objects.count()
    replay.settings(zoekt_memory_pressure_moves=True, zoekt_eviction_moves=True)
    replay.event("memory-pressure moves on")
    replay.run(24 * 3600, progress=progress)
    per_namespace = {}
    for namespace_id in Move.objects.values_list("namespace_id", flat=True):
        per_namespace[namespace_id] = per_namespace.get(namespace_id, 0) + 1
    return {
        "moves_after_convergence": Move.objects.count() - settled,
        "most_moves_of_a_namespace": max(per_namespace.values(), default=0),
        "resplit_done": done,
        "resplit_seconds": finished_at - started_at,
        "resplit_pieces": len(plan.pieces),
        "resplit_carves": len(plan.carves),
        "resplit_moves": [
            (m.state, m.done_at and (m.done_at - m.created_at).total_seconds()) for m in done_moves
        ],
        "dark_namespace_minutes": ticks["dark_namespace_ticks"] * replay.tick_seconds / 60,
        "hot_dark_minutes": ticks["hot_dark_ticks"] * replay.tick_seconds / 60,
        "ticks_watched": ticks["watched"],
        "hot_indices_after": Index.objects.filter(namespace_id=HOT_ROOT).count(),
    }


def plan_warnings() -> dict[str, int]:
    """Warning types over the run's kept rollout plans, with their counts."""
    import collections

    from planner.models import RolloutPlan

    counts: collections.Counter = collections.Counter()
    for plan in RolloutPlan.objects.values_list("plan", flat=True):
        # Namespace plans are listed by action: create, destroy, unchanged, failures.
        for action in ("create", "destroy", "unchanged", "failures"):
            for namespace in plan.get(action) or []:
                counts.update(warning["type"] for warning in namespace.get("warnings", []))
    return dict(counts)


def node_report(replay) -> list[dict]:
    from django.db.models import Count

    from zoekt.memory import node_memory_report
    from zoekt.models import Index

    by_id = {row.node_id: row for row in node_memory_report()}
    indices = dict(
        Index.objects.values_list("zoekt_node_id")
        .annotate(n=Count("id"))
        .values_list("zoekt_node_id", "n")
    )
    hot_indices = dict(
        Index.objects.filter(namespace_id=HOT_ROOT)
        .values_list("zoekt_node_id")
        .annotate(n=Count("id"))
        .values_list("zoekt_node_id", "n")
    )
    out = []
    last = replay.samples[-1]
    for name, node in replay.nodes.items():
        memory = by_id.get(node.fake.node_id)
        sample = last.nodes[name]
        out.append(
            {
                "node": name,
                "indices": indices.get(node.fake.node_id, 0),
                "hot_indices": hot_indices.get(node.fake.node_id, 0),
                "disk_used_bytes": sample.disk_used_bytes,
                "disk_percent": 100 * sample.disk_used_bytes / node.fake.config.disk_total_bytes,
                "rss_bytes": sample.rss_bytes,
                "estimated_memory_bytes": memory.estimated_memory_bytes if memory else None,
            }
        )
    return out


def ratio(values: list[float]) -> float:
    low = min(values)
    return math.inf if low <= 0 else max(values) / low


def print_table(results: list[dict]) -> None:
    print()
    print("Hot-namespace replay: 2 nodes × 1 TiB disk, memory limit 96 GiB each;")
    print("60 small groups enabled first, then one hot group (~91 GiB of repositories).")
    print()
    header = (
        f"{'placement':<13} {'node':<8} {'indices':>7} {'hot':>4} {'disk used':>14} "
        f"{'RSS observed':>13} {'estimate':>10}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        for row in result["nodes"]:
            estimate = row["estimated_memory_bytes"]
            print(
                f"{result['label']:<13} {row['node']:<8} {row['indices']:>7} "
                f"{row['hot_indices']:>4} "
                f"{row['disk_used_bytes'] / GIB:>7.1f} GiB {row['disk_percent']:>3.0f}% "
                f"{row['rss_bytes'] / GIB:>9.1f} GiB "
                f"{'-' if estimate is None else f'{estimate / GIB:.1f} GiB':>10}"
            )
    print()
    print(
        f"{'placement':<13} {'RSS max/min':>11} {'hot group ready after':>22} {'wall':>7}  "
        "plan warnings"
    )
    for result in results:
        rss = [row["rss_bytes"] for row in result["nodes"]]
        result["rss_max_over_min"] = ratio(rss)
        ready = clock_text(result["hot_ready_after_s"]) if result["hot_ready"] else "not ready"
        print(
            f"{result['label']:<13} {result['rss_max_over_min']:>10.2f}× {ready:>22} "
            f"{result['wall_s']:>6.0f}s  "
            + (", ".join(f"{k} ×{v}" for k, v in sorted(result["plan_warnings"].items())) or "-")
        )


def print_resplit(results: list[dict]) -> None:
    """Before and after the re-split: the max/min of the estimate and of observed RSS."""
    for result in results:
        before, after = result["before"], result["nodes"]

        def both(rows, key):
            return ratio([row[key] or 0 for row in rows])

        result["estimate_ratio_before"] = both(before, "estimated_memory_bytes")
        result["estimate_ratio_after"] = both(after, "estimated_memory_bytes")
        result["rss_ratio_before"] = both(before, "rss_bytes")
        result["rss_ratio_after"] = both(after, "rss_bytes")
        print()
        print("Re-split of the disk-only layout (memory planning switched on, then")
        print("`zoekt_move --resplit` of the hot group), with moves:")
        print()
        print(f"{'':<28} {'before':>8} {'after':>8}")
        print(
            f"{'estimate max/min':<28} {result['estimate_ratio_before']:>7.2f}× "
            f"{result['estimate_ratio_after']:>7.2f}×"
        )
        print(
            f"{'observed RSS max/min':<28} {result['rss_ratio_before']:>7.2f}× "
            f"{result['rss_ratio_after']:>7.2f}×"
        )
        print(
            f"pieces {result['resplit_pieces']}, carves {result['resplit_carves']}, "
            f"done {result['resplit_done']} after {clock_text(result['resplit_seconds'])}; "
            f"dark namespace-minutes {result['dark_namespace_minutes']:.0f} "
            f"(hot group {result['hot_dark_minutes']:.0f}) over "
            f"{result['ticks_watched']} ticks watched"
        )
        print(
            "thrash check, memory-pressure moves on for 24 h after: "
            f"{result['moves_after_convergence']} more moves; most moves of one namespace "
            f"{result['most_moves_of_a_namespace']}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--tick", type=float, default=20.0, help="simulated seconds per tick")
    parser.add_argument(
        "--rate-mib", type=float, default=20.0, help="index MiB/s per indexing task"
    )
    parser.add_argument(
        "--chart", type=Path, default=ROOT / "docs" / "replays" / "hot_namespace.png"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()

    setup_django("replay_hot")
    runs, results = run_all(
        (
            ("disk-only", (False, False)),
            ("memory-aware", (True, False)),
            ("re-split", (False, True)),
        ),
        lambda label, option: run_once(
            label,
            memory_aware=option[0],
            resplit=option[1],
            seed=args.seed,
            tick=args.tick,
            quiet=args.quiet,
            rate_mib=args.rate_mib,
        ),
    )
    print_table(results)
    print_resplit([r for r in results if "resplit_done" in r])
    finish(
        runs,
        results,
        chart=args.chart,
        json_path=args.json,
        title="Hot-namespace replay: per-node disk and webserver RSS",
        memory_line=(BUDGET / GIB, "memory limit 96 GiB"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
