"""Replay: 1,000 namespaces enabled at once on 10 nodes, from enable to every one searchable.

Run it with ``python -m config.devservers exec -- .venv/bin/python
bench/replay_initial_indexing.py`` (or with ``DATABASE_URL`` and ``REDIS_URL``
set); it uses the scratch database ``<name>_replay_initial_indexing``.
Everything runs through ``simulator.replay``: the real API, rollout, scheduling
and hand-out, fake nodes and a simulated clock, at GitLab.com's settings (the
defaults: one replica, a rollout batch of 32 re-run while full,
``zoekt_initial_indexing_limit`` 1, a CPU-to-tasks ratio of 1). Indexing takes
time: each node runs 8 tasks at once (it reports a concurrency of 8, so its
limit is 8), each at 0.5 MiB/s of index, and a running build takes its index's
bytes again as temporary space until it finishes.

The catalog: 1,000 root groups with a log-normal number of projects (about 3 on
average, up to 40) of log-normal size (median 20 MiB, up to 256 MiB, so no single
build is a large share of the bound); a project's index is its repository's size.
Two runs from an empty database, one table:

* **GitLab's rule** (``zoekt_indexing_admission`` ``gitlab``): the oldest tasks first
  and one pending index started per node a minute;
* **admission control** (the product's default): a node's free slots filled by priority,
  round robin between namespaces, within its disk headroom, and pending indices started
  as fast as its queue drains (docs/scheduling.md).

The clock ticks 5 simulated seconds, and every node heartbeats once a tick: GitLab's
default task pull frequency. A slot freed by a build's end stays idle until the node's next
heartbeat; a real node with a full backlog pulls every 500 ms, which the replay does not
model, so the idle time it shows is an upper bound.

The physical bound is every index byte over what the fleet can build at once: Σ index
bytes ÷ (nodes × slots × rate). The table gives the time from enable to every namespace
searchable against it, and the highest disk share any node reported at any tick against
the high watermark. The chart (``--chart``, default ``docs/replays/initial_indexing.png``)
draws the namespaces searchable over time and the busiest node's disk share.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.replays import GIB, MIB, ROOT, clock_text, reset_database, setup_django

NODES = 10
NODE_CONCURRENCY = 8
BUFFER = 3
ROOT_BASE = 700_000
HIGH = 0.75

RUNS = (("GitLab's rule", "gitlab"), ("admission control", "admission"))


def build_catalog(seed: int, groups: int) -> tuple[dict[int, str], list[tuple[int, int, int]]]:
    """Root groups by id and their projects as ``(project id, root id, repository bytes)``."""
    rng = random.Random(seed)
    roots, projects, project_id = {}, [], 900_000
    for k in range(groups):
        root = ROOT_BASE + k
        roots[root] = f"group-{k:04d}"
        count = min(40, 1 + int(rng.lognormvariate(math.log(3.0), 0.8)))
        for _ in range(count):
            project_id += 1
            size = int(min(rng.lognormvariate(math.log(20 * MIB), 1.0), 256 * MIB))
            projects.append((project_id, root, size))
    return roots, projects


class Watch:
    """At every tick: the namespaces searchable and each node's disk share."""

    def __init__(self, disk_total: int):
        self.disk_total = disk_total
        self.series: list[tuple[float, int, float]] = []  # (t, searchable, busiest share)
        self.peak_share = 0.0
        self.peak_temporary = 0

    def __call__(self, r) -> None:
        from simulator.replay import fleet_state

        state = fleet_state()
        shares = [node.fake.disk_used_bytes() / self.disk_total for node in r.nodes.values()]
        busiest = max(shares, default=0.0)
        self.peak_share = max(self.peak_share, busiest)
        self.peak_temporary = max(
            self.peak_temporary, max(n.fake.temporary_bytes() for n in r.nodes.values())
        )
        self.series.append((r.t, state["namespaces"] - state["namespaces_short"], busiest))


def node_bytes(sizes: dict[int, int]) -> dict[str, int]:
    """The index bytes the placement gave each node (every index, by its projects)."""
    from zoekt.models import Repository

    placed: dict[str, int] = {}
    for name, project_id in Repository.objects.values_list(
        "zoekt_index__zoekt_node__metadata__name", "project_id"
    ):
        placed[name] = placed.get(name, 0) + sizes.get(project_id, MIB)
    return placed


def run_once(label: str, mode: str, args) -> dict:
    from django.db.models import Max

    from simulator.replay import Replay, catalog_rows
    from zoekt.models import Task

    roots, projects = build_catalog(args.seed, args.groups)
    sizes = {project_id: size for project_id, _, size in projects}
    index_bytes = sum(sizes.values())
    disk = math.ceil(index_bytes * BUFFER / NODES / 0.45 / GIB) * GIB
    rate = args.rate_mib * MIB
    bound = index_bytes / (NODES * NODE_CONCURRENCY * rate)
    reset_database()
    started = time.perf_counter()
    replay = Replay(
        index_size=lambda repo_id: sizes.get(repo_id, MIB),
        tick_seconds=args.tick,
        indexing_bytes_per_second=rate,
        node_concurrency=NODE_CONCURRENCY,
        temporary_space_factor=1.0,
        seed=args.seed,
    )
    watch = Watch(disk)
    with replay:
        replay.settings(
            zoekt_indexing_enabled=True,
            zoekt_search_enabled=True,
            zoekt_indexing_admission=mode,
            # Every build as GitLab.com sends it, none forced at random.
            zoekt_force_reindexing_percentage=0,
        )
        replay.load_catalog(*catalog_rows(roots, projects))
        for k in range(NODES):
            replay.add_node(f"zoekt-{k}", disk_total_bytes=disk, disk_base_used_bytes=0)
        replay.watch(watch)
        replay.enable(list(roots), label="1,000 namespaces enabled")
        enabled_t = replay.t

        def progress(r) -> None:
            if args.quiet or int(r.t) % 900:
                return
            searchable = watch.series[-1][1] if watch.series else 0
            print(
                f"  [{label}] {clock_text(r.t - enabled_t):>13}  searchable "
                f"{searchable}/{len(roots)}  busiest {100 * watch.peak_share:.1f} %  "
                f"wall {time.perf_counter() - started:.0f}s",
                file=sys.stderr,
            )

        done = replay.run(
            args.give_up_hours * 3600, until=lambda r: r.converged(), progress=progress
        )
        elapsed = replay.t - enabled_t
        tasks = Task.objects.filter(state=Task.State.DONE).count()
        placed = node_bytes(sizes)
        enabled_at = replay.start + timedelta(seconds=enabled_t)
        names = {node_id: name for name, node_id in replay.node_ids().items()}
        last_builds = {
            names.get(node_id, str(node_id)): (at - enabled_at).total_seconds()
            for node_id, at in Task.objects.filter(state=Task.State.DONE)
            .values_list("zoekt_node_id")
            .annotate(last=Max("updated_at"))
        }
    return {
        "label": label,
        "mode": mode,
        "namespaces": len(roots),
        "projects": len(projects),
        "index_bytes": index_bytes,
        "node_disk_bytes": disk,
        "bound_s": bound,
        "placement_bound_s": max(placed.values()) / (NODE_CONCURRENCY * rate),
        "node_index_bytes": placed,
        "node_last_build_s": last_builds,
        "searchable": done,
        "time_to_searchable_s": elapsed if done else math.nan,
        "over_bound": (elapsed / bound) if done else math.nan,
        "peak_disk_share": watch.peak_share,
        "peak_temporary_bytes": watch.peak_temporary,
        "tasks_done": tasks,
        "series": [(t - enabled_t, n, s) for t, n, s in watch.series],
        "wall_s": time.perf_counter() - started,
    }


def print_table(results: list[dict], args) -> None:
    first = results[0]
    print()
    print(
        f"Initial indexing replay: {first['namespaces']} namespaces ({first['projects']} "
        f"projects, {first['index_bytes'] / GIB:.1f} GiB of index) on {NODES} nodes of "
        f"{first['node_disk_bytes'] / GIB:.0f} GiB, {NODE_CONCURRENCY} slots a node at "
        f"{args.rate_mib:g} MiB/s a task; bound {clock_text(first['bound_s'])}."
    )
    for r in results:
        placed = r["node_index_bytes"]
        print(
            f"{r['label']}: the placement's busiest node holds {max(placed.values()) / GIB:.1f} "
            f"GiB of index against an even share of {r['index_bytes'] / NODES / GIB:.1f} GiB, so "
            f"no hand-out can finish before {clock_text(r['placement_bound_s'])} "
            f"({r['placement_bound_s'] / r['bound_s']:.2f}× the bound); the last build ended at "
            f"{clock_text(max(r['node_last_build_s'].values()))}."
        )
    print()
    print(
        "| hand-out | every namespace searchable | over the bound | busiest node at any tick "
        "| peak temporary bytes on a node | tasks done |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['label']} | {clock_text(r['time_to_searchable_s'])} | "
            f"{r['over_bound']:.2f}× | {100 * r['peak_disk_share']:.1f} % "
            f"(high {100 * HIGH:.0f} %) | "
            f"{r['peak_temporary_bytes'] / GIB:.2f} GiB | {r['tasks_done']} |"
        )
    gitlab, admitted = results[0], results[-1]
    if len(results) > 1 and admitted["time_to_searchable_s"]:
        ratio = gitlab["time_to_searchable_s"] / admitted["time_to_searchable_s"]
        print(f"\nAdmission control is {ratio:.2f}× faster than GitLab's rule in this run.")


def draw(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for r in results:
        minutes = [t / 60 for t, _, _ in r["series"]]
        top.plot(minutes, [n for _, n, _ in r["series"]], label=r["label"])
        bottom.plot(minutes, [100 * s for _, _, s in r["series"]], label=r["label"])
    bound = results[0]["bound_s"] / 60
    top.axvline(bound, color="grey", linestyle="--", label="physical bound")
    top.set_ylabel("namespaces searchable")
    top.legend(fontsize=8, loc="lower right")
    bottom.axhline(100 * HIGH, color="red", linestyle=":", label="high watermark")
    bottom.set_ylabel("busiest node's disk %")
    bottom.set_xlabel("simulated minutes since enable")
    bottom.legend(fontsize=8, loc="upper right")
    fig.suptitle(
        f"{results[0]['namespaces']} namespaces on {NODES} nodes: GitLab's rule against "
        "admission control",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--rate-mib", type=float, default=0.5)
    parser.add_argument(
        "--tick", type=float, default=5.0, help="simulated seconds a tick (a node heartbeats once)"
    )
    parser.add_argument("--give-up-hours", type=float, default=12.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--modes", default="gitlab,admission")
    parser.add_argument("--chart", type=Path, default=ROOT / "docs/replays/initial_indexing.png")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    setup_django("replay_initial_indexing")
    wanted = args.modes.split(",")
    results = []
    for label, mode in RUNS:
        if mode in wanted:
            print(f"run: {label}", file=sys.stderr)
            results.append(run_once(label, mode, args))
    print_table(results, args)
    draw(results, args.chart)
    print(f"\nchart: {args.chart}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
