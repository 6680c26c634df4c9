"""Replay: a node is lost; how many searches go dark, and how long until the fleet recovers.

Run it with ``python -m config.devservers exec -- .venv/bin/python
bench/replay_lost_node.py`` (or with ``DATABASE_URL`` and ``REDIS_URL``
set); it uses the scratch database ``<name>_replay_lost``. Everything runs
through ``simulator.replay``: the real API, planner, scheduling, search
targets and database, fake nodes and a simulated clock.

The fleet: four nodes of 400 GiB; 80 root groups (log-normal sizes, about
1,200 projects) whose search traffic follows a Zipf law (exponent 1), 100
searches a simulated minute. Once every namespace is ready and an hour has
passed, ``zoekt-2`` stops for good (no heartbeat, no callback). From then
on a search is dark when ``search_targets`` finds no ready replica on
searchable nodes. Three runs, each from an empty database:

* **GitLab's defaults**: one replica per namespace, lost-node threshold
  12 h. The node is offline after 30 s, so its namespaces go dark, and stay
  dark until ``lost_nodes_check`` deletes the node (12 h) and the rollout
  places them again;
* **threshold 30 min**: the same, with ``zoekt_lost_node_threshold`` 30m;
* **two replicas**: GitLab's defaults with
  ``zoekt_default_number_of_replicas`` 2 (twice the disk).

For each run it prints the dark searches (count and share of the searches
after the stop), when search recovered (the end of the last dark sample),
when the node was deleted and when every namespace had all its replicas
ready again, all counted from the stop. It writes a PNG chart of per-node
disk, RSS and dark searches over simulated time (``--chart``, default
``docs/replays/lost_node.png``).
"""

from __future__ import annotations

import argparse
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

MIB = 1024**2
ROOT_BASE = 700_000
NODES = ("zoekt-0", "zoekt-1", "zoekt-2", "zoekt-3")
LOST = "zoekt-2"
BUFFER = 3
MEMORY_FACTOR = 0.125

RUNS = (
    ("GitLab defaults (1 replica, lost after 12 h)", {}),
    ("lost after 30 min", {"zoekt_lost_node_threshold": "30m"}),
    ("2 replicas (lost after 12 h)", {"zoekt_default_number_of_replicas": 2}),
)


def build_catalog(seed: int, groups: int) -> tuple[dict[int, str], list[tuple[int, int, int]]]:
    rng = random.Random(seed)
    roots, projects, project_id = {}, [], 300_000
    for k in range(groups):
        root = ROOT_BASE + k
        roots[root] = f"group-{k:03d}"
        for _ in range(rng.randint(5, 25)):
            project_id += 1
            size = int(min(rng.lognormvariate(math.log(30 * MIB), 1.1), 4 * GIB))
            projects.append((project_id, root, size))
    return roots, projects


def run_once(label: str, overrides: dict, args) -> tuple[object, dict]:
    from simulator.models import zipf_hotness
    from simulator.replay import Replay, catalog_rows, fleet_state
    from zoekt.models import Node

    roots, projects = build_catalog(args.seed, args.groups)
    sizes = {project_id: size * BUFFER for project_id, _, size in projects}
    traffic = zipf_hotness(list(roots), s=1.0, seed=args.seed)
    reset_database()
    started = time.perf_counter()
    with Replay(
        index_size=lambda repo_id: sizes.get(repo_id, MIB),
        hotness={root: MEMORY_FACTOR for root in roots},
        traffic=traffic,
        searches_per_sample=args.searches_per_minute,
        tick_seconds=args.tick,
        seed=args.seed,
    ) as replay:
        # GitLab's placement (the product's default is balanced), as when first measured.
        replay.settings(
            zoekt_placement_strategy="first_fit",
            zoekt_indexing_enabled=True,
            zoekt_search_enabled=True,
            # Lost-node handling alone (the reconciler has its own replay).
            zoekt_rebalance_enabled=False,
            **overrides,
        )
        replay.load_catalog(*catalog_rows(roots, projects))
        for name in NODES:
            replay.add_node(name, disk_total_bytes=400 * GIB)
        replay.enable(list(roots), label="namespaces enabled")

        marks: dict[str, float] = {}

        def progress(r: Replay) -> None:
            lost_uuid = r.nodes[LOST].fake.uuid
            if (
                "stop" in marks
                and "deleted" not in marks
                and not Node.objects.filter(uuid=lost_uuid).exists()
            ):
                marks["deleted"] = r.t
                r.event(f"{LOST} deleted as lost")
            if not args.quiet and int(r.t) % 3600 == 0:
                state = fleet_state()
                print(
                    f"  [{label[:24]}] {clock_text(r.t):>13}  short "
                    f"{state['namespaces_short']}/{state['namespaces']}  dark so far "
                    f"{sum(s.dark for s in r.samples)}  wall {time.perf_counter() - started:.0f}s",
                    file=sys.stderr,
                )

        ready = replay.run(4 * 3600, until=lambda r: r.converged(), progress=progress)
        marks["ready"] = replay.t
        replay.run(3600, progress=progress)
        replay.stop_node(LOST)
        marks["stop"] = replay.t

        def recovered(r: Replay) -> bool:
            return "deleted" in marks and r.t - marks["stop"] >= 1800 and r.converged()

        replay.run(args.max_hours * 3600, until=recovered, progress=progress)
        marks["replicated"] = replay.t if recovered(replay) else math.nan
        replay.run(1800, progress=progress)  # steady state again
        wall = time.perf_counter() - started

    stop = marks["stop"]
    after = [s for s in replay.samples if s.t >= stop]
    dark_samples = [s for s in after if s.dark]
    searches = sum(s.searches for s in after)
    dark = sum(s.dark for s in after)
    recovered_at = dark_samples[-1].t + replay.traffic_every - stop if dark_samples else 0.0
    return replay, {
        "label": label,
        "settings": overrides,
        "initial_ready": ready,
        "initial_ready_after_s": marks["ready"],
        "searches_after_stop": searches,
        "dark_after_stop": dark,
        "dark_share": dark / searches if searches else 0.0,
        "search_recovered_after_s": recovered_at,
        "node_deleted_after_s": marks.get("deleted", math.nan) - stop,
        "replicated_after_s": marks["replicated"] - stop,
        "simulated_s": replay.t,
        "wall_s": wall,
    }


def print_table(results: list[dict]) -> None:
    print()
    print("Lost-node replay: 4 nodes, 80 groups with Zipf search traffic, 100 searches a")
    print("simulated minute; zoekt-2 stops one hour after everything is ready.")
    print("Times are counted from the stop.")
    print()
    header = (
        f"{'run':<46} {'dark searches':>14} {'dark share':>10} {'search back':>13} "
        f"{'node deleted':>13} {'replicated':>13} {'wall':>6}"
    )
    print(header)
    print("-" * len(header))

    def when(value: float) -> str:
        return "never" if math.isnan(value) else clock_text(value)

    for r in results:
        back = clock_text(r["search_recovered_after_s"]) if r["dark_after_stop"] else "never dark"
        print(
            f"{r['label']:<46} {r['dark_after_stop']:>14,} {100 * r['dark_share']:>9.1f}% "
            f"{back:>13} "
            f"{when(r['node_deleted_after_s']):>13} {when(r['replicated_after_s']):>13} "
            f"{r['wall_s']:>5.0f}s"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--groups", type=int, default=80)
    parser.add_argument("--searches-per-minute", type=int, default=100)
    parser.add_argument("--tick", type=float, default=20.0, help="simulated seconds per tick")
    parser.add_argument("--max-hours", type=float, default=16.0, help="give up after this long")
    parser.add_argument("--chart", type=Path, default=ROOT / "docs" / "replays" / "lost_node.png")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()

    setup_django("replay_lost")
    runs, results = run_all(RUNS, lambda label, overrides: run_once(label, overrides, args))
    print_table(results)
    finish(
        runs,
        results,
        chart=args.chart,
        json_path=args.json,
        title="Lost-node replay: per-node disk, webserver RSS and dark searches",
        dark_per_minute=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
