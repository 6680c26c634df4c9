"""Replay: the 2026-10-20 incident's force re-index, GitLab's pacing against admission control.

Run it with ``python -m config.devservers exec -- .venv/bin/python
bench/replay_force_reindex.py`` (or with ``DATABASE_URL`` and ``REDIS_URL``
set); it uses the scratch database ``<name>_replay_force_reindex``. Everything
runs through ``simulator.replay``: the real API, hand-out, scheduling and
eviction, fake nodes and a simulated clock (20 s ticks).

The incident's shape (eviction seed): node ``zoekt-0`` of 3,023 GiB at about
53 %, holding 495 namespaces (4,708 projects, 740 GiB of index); 4,708
``force_index_repo`` tasks are created for them at once. The node builds 8 tasks
at a time at a rate that makes the physical bound (Σ index bytes ÷ slots × rate)
the incident's 8 h 40 min. A rebuild's new shards take their index's bytes while
it runs, and the old shards it replaces are freed only hours later (the
incident's temporary data "cleared by itself hours later"): 8 hours by default,
fitted to the incident, whose disk grew by about 670 GiB while 740 GiB were
rebuilt over 8 h 40 min, so about 90 % of what was rebuilt was still doubled on
disk when the last build ended (8 h ÷ 8 h 40 min = 0.92). ``--linger-hours``
sets it. Two other nodes of the same size, a quarter full, can take evicted or
moved namespaces.

The bound ignores the disk. With the old shards lingering, no pacing that keeps
the node under the high watermark can beat the *disk-aware bound*: while the
lingering and building bytes fill the room to the high watermark (H), builds wait
for the first old shards to go, so with W bytes to rebuild at rate r and a linger
L, the finish is at least L + (W − H) ÷ r when r × L > H and W > H (else W ÷ r).
The table gives both.

Four runs from an empty database, GitLab.com's eviction settings: GitLab's pacing
(``zoekt_indexing_admission`` ``gitlab``) and admission control, each with the
product's eviction safeguards and with GitLab's legacy eviction. One table: the
node's peak disk, the evictions applied and namespaces they took, the time to finish
every forced build against the bound. The chart (``--chart``, default
``docs/replays/force_reindex.png``) draws the node's disk in each run.
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

from bench.replays import GIB, MIB, ROOT, clock_text, reset_database, setup_django

NODE_GIB = 3023.0
HOT = "zoekt-0"
OTHERS = ("zoekt-1", "zoekt-2")
NAMESPACES = 495
PROJECTS = 4708
INDEX_GIB = 740.0
START_SHARE = 0.53
OTHER_SHARE = 0.25
SLOTS = 8
BOUND_S = 8 * 3600 + 40 * 60
LINGER_HOURS = 8.0
ROOT_BASE = 600_000
HIGH = 0.75

RUNS = (
    ("GitLab's pacing, legacy eviction", "gitlab", False),
    ("GitLab's pacing, safeguards", "gitlab", True),
    ("admission control, legacy eviction", "admission", False),
    ("admission control, safeguards", "admission", True),
)


def build_catalog(seed: int) -> tuple[dict[int, str], list[tuple[int, int, int]]]:
    """495 root groups, 4,708 projects, 740 GiB of index (log-normal sizes)."""
    rng = random.Random(seed)
    roots = {ROOT_BASE + k: f"group-{k:03d}" for k in range(NAMESPACES)}
    raw = [min(rng.lognormvariate(0.0, 1.0), 40.0) for _ in range(PROJECTS)]
    scale = INDEX_GIB * GIB / sum(raw)
    projects = []
    for n, value in enumerate(raw):
        projects.append((800_000 + n, ROOT_BASE + n % NAMESPACES, max(int(value * scale), MIB)))
    return roots, projects


def run_once(label: str, mode: str, safeguards: bool, args) -> dict:
    from eviction.models import EvictionDecision
    from simulator.replay import Replay, catalog_rows
    from zoekt.models import Repository, Task
    from zoekt.scheduling.task_creation import create_bulk_tasks

    roots, projects = build_catalog(args.seed)
    sizes = {project_id: size for project_id, _, size in projects}
    # The planner reserves 3 × the repository size: the statistics say a third of the index.
    statistics = [(project_id, root, size // 3) for project_id, root, size in projects]
    index_bytes = sum(sizes.values())
    rate = index_bytes / (SLOTS * BOUND_S)
    total = int(NODE_GIB * GIB)
    reset_database()
    started = time.perf_counter()
    replay = Replay(
        index_size=lambda repo_id: sizes.get(repo_id, MIB),
        tick_seconds=args.tick,
        indexing_bytes_per_second=64 * rate,  # the initial fill is set-up, not measured
        node_concurrency=SLOTS,
        temporary_space_factor=1.0,
        free_delay=args.linger_hours * 3600,
        seed=args.seed,
    )
    with replay:
        replay.settings(
            zoekt_indexing_enabled=True,
            zoekt_search_enabled=True,
            zoekt_indexing_admission=mode,
            zoekt_force_reindexing_percentage=0,
            zoekt_rebalance_enabled=False,
            zoekt_rollout_batch_size=500,
            zoekt_initial_indexing_limit=50,
            zoekt_node_level_eviction_enabled=True,
            zoekt_node_eviction_safeguards=safeguards,
            zoekt_eviction_moves=safeguards,
        )
        replay.load_catalog(*catalog_rows(roots, statistics))
        base = int(START_SHARE * total) - index_bytes
        replay.add_node(HOT, disk_total_bytes=total, disk_base_used_bytes=base)
        replay.enable(list(roots), label="namespaces enabled")
        replay.run(12 * 3600, until=lambda r: r.converged())
        for name in OTHERS:
            replay.add_node(
                name, disk_total_bytes=total, disk_base_used_bytes=int(OTHER_SHARE * total)
            )
        replay.run(600)
        for node in replay.nodes.values():
            node.fake.config.indexing_bytes_per_second = rate
        hot_id = replay.nodes[HOT].fake.node_id
        forced = create_bulk_tasks(
            Repository.objects.filter(zoekt_index__zoekt_node_id=hot_id),
            Task.TaskType.FORCE_INDEX_REPO,
        )
        replay.event(f"{forced} force_index_repo tasks on {HOT}")
        start_t = replay.t
        first_sample = len(replay.samples)
        live = (Task.State.PENDING, Task.State.PROCESSING)

        def finished(r) -> bool:
            return not Task.objects.filter(
                task_type=Task.TaskType.FORCE_INDEX_REPO, state__in=live
            ).exists()

        def progress(r) -> None:
            if args.quiet or int(r.t - start_t) % 3600:
                return
            share = r.samples[-1].nodes[HOT].disk_used_bytes / total
            left = Task.objects.filter(
                task_type=Task.TaskType.FORCE_INDEX_REPO, state__in=live
            ).count()
            print(
                f"  [{label[:28]}] {clock_text(r.t - start_t):>13}  {HOT} "
                f"{100 * share:.1f} %  forced left {left}  "
                f"wall {time.perf_counter() - started:.0f}s",
                file=sys.stderr,
            )

        done = replay.run(args.give_up_hours * 3600, until=finished, progress=progress)
        elapsed = replay.t - start_t
        series = [
            (s.t - start_t, s.nodes[HOT].disk_used_bytes / total)
            for s in replay.samples[first_sample:]
        ]
        decisions = EvictionDecision.objects.filter(applied_at__isnull=False)
        evicted = sum(d.namespaces_affected or 0 for d in decisions)
        applied = decisions.count()
        forced_done = Task.objects.filter(
            task_type=Task.TaskType.FORCE_INDEX_REPO, state=Task.State.DONE
        ).count()
    start_share = series[0][1] if series else START_SHARE
    disk_bound = disk_aware_bound(
        index_bytes, (HIGH - start_share) * total, SLOTS * rate, args.linger_hours * 3600
    )
    return {
        "label": label,
        "linger_hours": args.linger_hours,
        "disk_bound_s": disk_bound,
        "over_disk_bound": elapsed / disk_bound if done else math.nan,
        "mode": mode,
        "safeguards": safeguards,
        "forced_tasks": forced,
        "forced_done": forced_done,
        "index_bytes": index_bytes,
        "bound_s": BOUND_S,
        "finished": done,
        "time_to_finish_s": elapsed if done else math.nan,
        "over_bound": elapsed / BOUND_S if done else math.nan,
        "peak_share": max(share for _, share in series),
        "start_share": start_share,
        "evictions_applied": applied,
        "namespaces_evicted": evicted,
        "series": series,
        "wall_s": time.perf_counter() - started,
    }


def disk_aware_bound(work: float, room: float, rate: float, linger: float) -> float:
    """The earliest finish of ``work`` bytes of rebuilds at ``rate`` bytes a second when the
    bytes built and not yet freed (freed ``linger`` seconds after their build) must stay
    within ``room``: the module's L + (W − H) ÷ r."""
    if work <= room or rate * linger <= room:
        return work / rate
    return linger + (work - room) / rate


def print_table(results: list[dict]) -> None:
    first = results[0]
    print()
    print(
        f"Force re-index replay: {first['forced_tasks']} force_index_repo tasks for "
        f"{NAMESPACES} namespaces ({first['index_bytes'] / GIB:.0f} GiB of index) on {HOT}, "
        f"{NODE_GIB:.0f} GiB at {100 * first['start_share']:.1f} %; {SLOTS} slots; "
        f"old shards freed {first['linger_hours']:g} h after their rebuild; bound "
        f"{clock_text(BOUND_S)}, disk-aware bound {clock_text(first['disk_bound_s'])}."
    )
    print()
    print(
        "| pacing | eviction | peak disk on the node | evictions applied | namespaces evicted "
        "| time to finish | over the bound | over the disk-aware bound |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        pacing = "GitLab's" if r["mode"] == "gitlab" else "admission control"
        eviction = "safeguards" if r["safeguards"] else "legacy"
        if r["finished"]:
            finish = (
                f"{clock_text(r['time_to_finish_s'])} | {r['over_bound']:.2f}× "
                f"| {r['over_disk_bound']:.2f}×"
            )
        else:
            left = r["forced_tasks"] - r["forced_done"]
            finish = f"not within the run ({left} builds left) | - | -"
        print(
            f"| {pacing} | {eviction} | {100 * r['peak_share']:.1f} % (high {100 * HIGH:.0f} %) | "
            f"{r['evictions_applied']} | {r['namespaces_evicted']} | {finish} |"
        )


def draw(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zoekt import capacity

    fig, axis = plt.subplots(figsize=(9, 4.5))
    for r in results:
        axis.plot(
            [t / 3600 for t, _ in r["series"]], [100 * s for _, s in r["series"]], label=r["label"]
        )
    axis.axhline(100 * HIGH, color="red", linestyle=":", label="high watermark")
    axis.axhline(
        100 * capacity.hysteresis_floor(HIGH), color="orange", linestyle=":", label="build ceiling"
    )
    axis.axvline(BOUND_S / 3600, color="grey", linestyle="--", label="physical bound")
    axis.axvline(
        results[0]["disk_bound_s"] / 3600, color="black", linestyle=":", label="disk-aware bound"
    )
    axis.set_xlabel("simulated hours since the force re-index")
    axis.set_ylabel(f"{HOT} disk %")
    axis.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"Force re-index of 495 namespaces on one node (old shards freed "
        f"{results[0]['linger_hours']:g} h later)",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tick", type=float, default=20.0)
    parser.add_argument("--give-up-hours", type=float, default=30.0)
    parser.add_argument(
        "--linger-hours",
        type=float,
        default=LINGER_HOURS,
        help="hours before a rebuilt repository's old shards are freed",
    )
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--runs", default="0,1,2,3", help="which of the four runs, by index")
    parser.add_argument("--chart", type=Path, default=ROOT / "docs/replays/force_reindex.png")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    setup_django("replay_force_reindex")
    results = []
    for k in (int(i) for i in args.runs.split(",")):
        label, mode, safeguards = RUNS[k]
        print(f"run: {label}", file=sys.stderr)
        results.append(run_once(label, mode, safeguards, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    print_table(results)
    draw(results, args.chart)
    print(f"\nchart: {args.chart}")


if __name__ == "__main__":
    main()
