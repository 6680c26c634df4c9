"""Replay: the 2026-10-20 incident, a transient disk spike on one node: legacy vs safeguards.

Its latest figures are in docs/benchmarks.md ("Replays").

Run it with ``python -m config.devservers exec -- .venv/bin/python
bench/replay_transient_spike.py`` (or with ``DATABASE_URL`` and ``REDIS_URL``
set); it uses the scratch database ``<name>_replay_spike``. Everything runs
through ``simulator.replay``: the real API, planner, scheduling, eviction,
search targets and database, fake nodes and a simulated clock, with indexing
that takes time (index bytes ÷ a per-task rate, the node's concurrency at a
time).

The fleet (the incident's relative figures, fewer namespaces): three nodes of
3,023 GiB; 300 root groups of 1-4 projects with log-normal sizes, indices
0.6 × the repository size (the incident's 290 GiB of index for 470 GiB of
repository size), filled to ~1,750 GiB (57 %) per node, one replica each.
The initial fill is set-up, not measured: it starts many indices a minute.
From an hour before the spike GitLab.com's settings apply
(``zoekt_rollout_batch_size`` 1, ``zoekt_initial_indexing_limit`` 1,
``zoekt_rollout_retry_interval`` 1d), node-level eviction on. Then ``zoekt-0``
receives 740 GiB of temporary data, written over 2 hours and cleared 7 hours
after it started; its neighbours have room. Three runs from an empty database:
the safeguards (``zoekt_node_eviction_safeguards`` on, the default) with each
eviction order (``smallest_used_first``, the default, and
``largest_that_fits``: the ``largest-fit`` row), and legacy (off).

One table, every mode: namespaces evicted, re-placed on the same node,
evicted twice, namespace-hours without a ready replica and dark searches, all
counted from the spike. The chart (``--chart``, default
``docs/replays/transient_spike.png``): the hot node's disk % with the
watermarks, and the namespaces without a ready replica, for every mode.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dataclasses
import itertools
import math
import random
import time
from collections import defaultdict
from datetime import timedelta
from unittest import mock

from bench.replays import (
    GIB,
    ROOT,
    clock_text,
    hours,
    reset_database,
    setup_django,
    traffic_replay,
)

MIB = 1024**2
ROOT_BASE = 800_000
NODES = ("zoekt-0", "zoekt-1", "zoekt-2")
HOT = "zoekt-0"
NODE_GIB = 3023.0
FILL_GIB = 1750.0  # index data per node before the spike (58 %)
INDEX_PER_REPOSITORY_BYTE = 0.6
#: Zoekt indexes tens of MB a second per task; 20 MiB/s, 8 tasks at once per node.
INDEXING_BYTES_PER_SECOND = 20 * MIB
NODE_CONCURRENCY = 8
GITLAB_COM = {
    "zoekt_indexing_enabled": True,
    "zoekt_search_enabled": True,
    "zoekt_node_level_eviction_enabled": True,
    "zoekt_rollout_batch_size": 1,
    "zoekt_initial_indexing_limit": 1,
    "zoekt_rollout_retry_interval": "1d",
    "zoekt_default_number_of_replicas": 1,
    # GitLab never rebalances placed namespaces; the reconciler has its own replay.
    "zoekt_rebalance_enabled": False,
}
FILL = {
    "zoekt_rollout_batch_size": 500,
    "zoekt_initial_indexing_limit": 50,
    "zoekt_rollout_retry_interval": "10m",
}


@dataclasses.dataclass(frozen=True)
class Mode:
    label: str
    safeguards: bool
    order: str = "smallest_used_first"
    #: ``zoekt_eviction_moves``: move instead of delete (the product's default).
    moves: bool = True


SAFEGUARDS = Mode("safeguards", True)
LARGEST_FIT = Mode("largest-fit", True, "largest_that_fits")
DELETE = Mode("delete", True, moves=False)
DELETE_LARGEST = Mode("delete-largest", True, "largest_that_fits", moves=False)
LEGACY = Mode("legacy", False, moves=False)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    suffix: str
    spike_gib: float
    spike_ramp_hours: float
    #: None: the bytes stay (the node really filled).
    spike_hours: float | None
    after_hours: float
    modes: tuple[Mode, ...] = (SAFEGUARDS, LARGEST_FIT, LEGACY)


def build_catalog(seed: int, groups: int):
    """Root groups of 1-4 projects, log-normal sizes, scaled so the fleet's indices fill
    each node to ``FILL_GIB``."""
    rng = random.Random(seed)
    raw = []
    for _ in range(groups):
        # Clipped at 12× the median project: a project larger than an index may hold
        # (max_storage_bytes ÷ the buffer factor) could never be placed.
        raw.append([min(rng.lognormvariate(0.0, 1.3), 12.0) for _ in range(rng.randint(1, 4))])
    total = sum(sum(sizes) for sizes in raw)
    scale = len(NODES) * FILL_GIB * GIB / INDEX_PER_REPOSITORY_BYTE / total
    roots, projects, project_id = {}, [], 400_000
    for k, sizes in enumerate(raw):
        root = ROOT_BASE + k
        roots[root] = f"group-{k:04d}"
        for size in sizes:
            project_id += 1
            projects.append((project_id, root, max(int(size * scale), MIB)))
    return roots, projects


class Tracker:
    """What eviction did to each namespace, from the one replica-eviction path."""

    def __init__(self, replay) -> None:
        self.replay = replay
        self.evictions: list[tuple[float, int, int, frozenset]] = []  # t, ns, replica, nodes
        self.evicted_from: dict[int, dict[int, float]] = defaultdict(dict)  # ns -> node -> t
        self.replaced_same_node: set[int] = set()
        self.dark_namespace_seconds = 0.0
        self.dark_series: list[tuple[float, int]] = []
        self.measure_from: float | None = None

    def wrap(self, original):
        def evict(replica_ids, **kwargs):
            from zoekt.models import Index, Replica

            if sys._getframe(1).f_globals.get("__name__") == "eviction.moves":
                # A move's swap or a parked move's clean-up: the namespace keeps
                # serving from the other copy; counted from the moves' records.
                return original(replica_ids, **kwargs)

            rows = Replica.objects.filter(id__in=replica_ids).values_list("id", "namespace_id")
            nodes = defaultdict(set)
            for replica_id, node_id in Index.objects.filter(
                zoekt_replica_id__in=replica_ids
            ).values_list("zoekt_replica_id", "zoekt_node_id"):
                nodes[replica_id].add(node_id)
            for replica_id, namespace_id in rows:
                self.evictions.append(
                    (self.replay.t, namespace_id, replica_id, frozenset(nodes[replica_id]))
                )
            return original(replica_ids, **kwargs)

        return evict

    def observe(self, period: float) -> None:
        """Every ``period``: namespaces without a ready target, and re-placements."""
        from zoekt.models import Index
        from zoekt.search_targets import search_targets_many

        answers = search_targets_many(self.replay.roots)
        dark = sum(1 for answer in answers.values() if not answer.targets)
        self.dark_series.append((self.replay.t, dark))
        if self.measure_from is not None:
            self.dark_namespace_seconds += dark * period
        # A new index of an evicted namespace on the node it was evicted from (the
        # evicted row itself stays until it is destroyed: it is older than the eviction).
        for namespace_id, node_id, created_at in Index.objects.filter(
            namespace_id__in=list(self.evicted_from)
        ).values_list("namespace_id", "zoekt_node_id", "created_at"):
            evicted_at = self.evicted_from[namespace_id].get(node_id)
            if evicted_at is not None and created_at > self.replay.start + timedelta(
                seconds=evicted_at
            ):
                self.replaced_same_node.add(namespace_id)

    def note_evictions(self) -> None:
        """Record where each eviction took its namespace from (after the tick's jobs ran)."""
        for t, namespace_id, _, nodes in self.evictions:
            for node_id in nodes:
                known = self.evicted_from[namespace_id]
                if node_id not in known:
                    known[node_id] = t

    def figures(self) -> dict:
        replicas = defaultdict(set)
        for _, namespace_id, replica_id, _ in self.evictions:
            replicas[namespace_id].add(replica_id)
        return {
            "namespaces_evicted": len(replicas),
            "replaced_on_same_node": len(self.replaced_same_node),
            "evicted_twice": sum(1 for ids in replicas.values() if len(ids) >= 2),
            "namespace_hours_without_ready_replica": self.dark_namespace_seconds / 3600,
        }


def run_once(scenario: Scenario, how: Mode, args):
    from eviction.models import EvictionDecision
    from simulator.models import zipf_hotness
    from simulator.replay import catalog_rows, fleet_state
    from zoekt import actions as zoekt_actions

    roots, projects = build_catalog(args.seed, args.groups)
    index_sizes = {pid: int(size * INDEX_PER_REPOSITORY_BYTE) for pid, _, size in projects}
    traffic = zipf_hotness(list(roots), s=1.0, seed=args.seed)
    reset_database()
    started = time.perf_counter()
    replay = traffic_replay(args, index_sizes, traffic, node_concurrency=NODE_CONCURRENCY)
    replay.roots = list(roots)
    tracker = Tracker(replay)
    hot_disk: list[tuple[float, float]] = []
    with (
        replay,
        mock.patch.object(
            zoekt_actions, "do_evict_replicas", tracker.wrap(zoekt_actions.do_evict_replicas)
        ),
    ):
        # The initial fill is set-up, not measured: it starts more indices a minute and
        # retries a failed placement soon; GitLab.com's settings apply from the spike's hour.
        replay.settings(
            **{**GITLAB_COM, **FILL},
            # GitLab's placement in every mode (the product's default is balanced), so
            # the modes share one layout and differ only in eviction.
            zoekt_placement_strategy="first_fit",
            zoekt_node_eviction_safeguards=how.safeguards,
            zoekt_eviction_order=how.order,
            zoekt_eviction_moves=how.moves,
        )
        replay.load_catalog(*catalog_rows(roots, projects))
        for name in NODES:
            replay.add_node(name, disk_total_bytes=int(NODE_GIB * GIB), disk_base_used_bytes=0)
        replay.enable(list(roots), label="namespaces enabled")
        last_observed = [-math.inf]

        def watch(r) -> None:
            # At the instant searches are drawn: a node that heartbeat this tick is online.
            tracker.note_evictions()
            sample = r.samples[-1].nodes[HOT]
            hot_disk.append((r.t, sample.disk_used_bytes / (NODE_GIB * GIB)))
            if r.t - last_observed[0] >= args.observe_every - 1e-9:
                last_observed[0] = r.t
                tracker.observe(args.observe_every)

        replay.watch(watch)

        def progress(r) -> None:
            if not args.quiet and int(r.t) % 3600 == 0:
                state = fleet_state()
                print(
                    f"  [{scenario.name}/{how.label}] {clock_text(r.t):>13}  short "
                    f"{state['namespaces_short']}/{state['namespaces']}  hot "
                    f"{100 * hot_disk[-1][1]:.1f}%  evictions {len(tracker.evictions)}  "
                    f"wall {time.perf_counter() - started:.0f}s",
                    file=sys.stderr,
                )

        converged = replay.run(
            args.converge_hours * 3600, until=lambda r: r.converged(), progress=progress
        )
        converged_at = replay.t
        replay.settings(**{key: GITLAB_COM[key] for key in FILL})
        replay.run(3600, progress=progress)
        spike_at = replay.t
        tracker.measure_from = spike_at
        duration = (
            scenario.spike_hours * 3600
            if scenario.spike_hours is not None
            else (scenario.after_hours + 1) * 3600
        )
        replay.spike(HOT, int(scenario.spike_gib * GIB), duration, ramp=args.ramp_hours * 3600)
        replay.event(f"+{scenario.spike_gib:.0f} GiB on {HOT}")
        replay.run(scenario.after_hours * 3600, progress=progress)
        wall = time.perf_counter() - started
        hot_id = replay.nodes[HOT].fake.node_id
        decisions = list(
            EvictionDecision.objects.filter(applied_at__isnull=False)
            .order_by("id")
            .values("node_id", "reason", "namespaces_affected", "created_at")
        )
        from zoekt.models import Index

        hot_index_after_cooldown = 0
        cooldown_starts = [d["created_at"] for d in decisions if d["node_id"] == hot_id]
        if how.safeguards and cooldown_starts:
            start = cooldown_starts[0]
            hot_index_after_cooldown = Index.objects.filter(
                zoekt_node_id=hot_id,
                created_at__gt=start,
                created_at__lt=start + timedelta(hours=12),
            ).count()
        final_hot = hot_disk[-1][1]

    after = [s for s in replay.samples if s.t >= spike_at]
    result = {
        "scenario": scenario.name,
        "mode": how.label,
        **tracker.figures(),
        **move_figures(),
        "dark_searches": sum(s.dark for s in after),
        "searches": sum(s.searches for s in after),
        "decisions_applied": len(decisions),
        "decision_reasons": sorted({d["reason"] for d in decisions}),
        "hot_peak_percent": 100 * max(p for t, p in hot_disk if t >= spike_at),
        "hot_final_percent": 100 * final_hot,
        "placed_on_hot_during_cooldown": hot_index_after_cooldown,
        "converged": converged,
        "converged_after_s": converged_at,
        "simulated_s": replay.t,
        "wall_s": wall,
        "namespaces": len(roots),
        "projects": len(projects),
    }
    replay.hot_disk = hot_disk
    replay.dark_series = tracker.dark_series
    replay.spike_at = spike_at
    return replay, result


def move_figures() -> dict:
    """Moves from their records: namespaces moved, durations (planned to done), fallbacks
    (delete-first), parked, those still in flight at the end, and the thrash check:
    namespaces moved twice within 24 h, and moves started once the first decision's
    moves had all finished (the fleet had settled)."""
    from zoekt.models import Move

    rows = list(
        Move.objects.values("state", "namespace_id", "created_at", "done_at", "decision_id")
    )
    done = [r for r in rows if r["state"] == Move.State.DONE]
    durations = sorted((r["done_at"] - r["created_at"]).total_seconds() for r in done)

    def pct(q: float) -> float | None:
        if not durations:
            return None
        return durations[min(len(durations) - 1, max(0, math.ceil(q * len(durations)) - 1))]

    return {
        "namespaces_moved": len({r["namespace_id"] for r in done}),
        "move_p50_s": pct(0.5),
        "move_p90_s": pct(0.9),
        "fallbacks": sum(1 for r in rows if r["state"] == Move.State.FALLEN_BACK),
        "parked": sum(1 for r in rows if r["state"] == Move.State.PARKED),
        "moves_in_flight": sum(1 for r in rows if r["state"] in Move.LIVE),
        "moved_twice_in_24h": _moved_twice(rows),
        "moves_after_settled": _moves_after_settled(rows),
    }


def _moved_twice(rows: list[dict]) -> int:
    starts: dict[int, list] = defaultdict(list)
    for r in rows:
        if r["state"] not in ("cancelled", "fallen_back"):
            starts[r["namespace_id"]].append(r["created_at"])
    twice = 0
    for times in starts.values():
        times.sort()
        if any(b - a < timedelta(hours=24) for a, b in itertools.pairwise(times)):
            twice += 1
    return twice


def _moves_after_settled(rows: list[dict]) -> int | None:
    """Moves started after every move of the first deciding decision had finished."""
    decided = sorted({r["decision_id"] for r in rows if r["decision_id"] is not None})
    if not decided:
        return None
    first = [r for r in rows if r["decision_id"] == decided[0]]
    if any(r["done_at"] is None for r in first):
        return None
    settled = max(r["done_at"] for r in first)
    return sum(1 for r in rows if r["created_at"] > settled)


def print_table(scenario: Scenario, results: list[dict], args) -> None:
    first = results[0]
    print()
    print(f"{scenario.title}")
    print(
        f"{len(NODES)} nodes of {NODE_GIB:,.0f} GiB, {first['namespaces']} root groups "
        f"({first['projects']} projects), 1 replica each; indexing "
        f"{args.rate_mib:g} MiB/s per task, {NODE_CONCURRENCY} tasks a node. "
        "Counted from the spike."
    )
    print()
    header = (
        f"{'mode':<14} {'evicted':>8} {'same node':>10} {'twice':>6} "
        f"{'ns-hours dark':>14} {'dark searches':>14} {'moved':>6} {'move p50':>9} "
        f"{'move p90':>9} {'fallback':>9} {'parked':>7} {'hot peak':>9} {'hot end':>8} "
        f"{'wall':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['mode']:<14} {r['namespaces_evicted']:>8} {r['replaced_on_same_node']:>10} "
            f"{r['evicted_twice']:>6} {r['namespace_hours_without_ready_replica']:>14.1f} "
            f"{r['dark_searches']:>14,} {r['namespaces_moved']:>6} "
            f"{clock_text(r['move_p50_s']):>9} {clock_text(r['move_p90_s']):>9} "
            f"{r['fallbacks']:>9} {r['parked']:>7} {r['hot_peak_percent']:>8.1f}% "
            f"{r['hot_final_percent']:>7.1f}% {r['wall_s']:>5.0f}s"
        )
    for r in results:
        print(
            f"  {r['mode']}: {r['decisions_applied']} decisions applied {r['decision_reasons']}, "
            f"converged after {clock_text(r['converged_after_s'])}, "
            f"placed on {HOT} during its cooldown: {r['placed_on_hot_during_cooldown']}, "
            f"moves still in flight: {r['moves_in_flight']}, moved twice within 24 h: "
            f"{r['moved_twice_in_24h']}, moves started after the first decision's had "
            f"finished: {r['moves_after_settled'] if r['moves_after_settled'] is not None else '-'}"
        )


def plot(scenario: Scenario, runs, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    colors = {
        "safeguards": "#2a7",
        "largest-fit": "#27c",
        "delete": "#e90",
        "delete-largest": "#a6c",
        "legacy": "#c44",
    }
    for mode, replay in runs:
        t0 = replay.spike_at
        axes[0].plot(
            [hours(t - t0) for t, _ in replay.hot_disk],
            [100 * p for _, p in replay.hot_disk],
            label=mode,
            color=colors[mode],
            linewidth=1.4,
        )
        axes[1].step(
            [hours(t - t0) for t, _ in replay.dark_series],
            [n for _, n in replay.dark_series],
            where="post",
            label=mode,
            color=colors[mode],
            linewidth=1.2,
        )
    for level, text in ((60, "low 60 %"), (75, "high 75 %"), (85, "critical 85 %")):
        axes[0].axhline(level, color="grey", linestyle="--", linewidth=0.8)
        axes[0].annotate(
            text,
            (0, level),
            xycoords=("axes fraction", "data"),
            xytext=(2, 2),
            textcoords="offset points",
            fontsize=7,
            color="grey",
        )
    for ax in axes:
        ax.axvline(0, color="#888", linewidth=0.6)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[0].set_ylabel(f"{HOT} disk used, %")
    axes[1].set_ylabel("namespaces without\na ready replica")
    axes[1].set_xlabel("hours from the spike's start (negative: initial fill)")
    fig.suptitle(scenario.title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"\nchart: {path}")


def main(scenario: Scenario, parser: argparse.ArgumentParser) -> int:
    import json

    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--searches-per-minute", type=int, default=100)
    parser.add_argument("--tick", type=float, default=30.0, help="simulated seconds per tick")
    parser.add_argument(
        "--rate-mib",
        type=float,
        default=INDEXING_BYTES_PER_SECOND / MIB,
        help="indexing MiB/s per task",
    )
    parser.add_argument("--observe-every", type=float, default=300.0)
    parser.add_argument(
        "--ramp-hours",
        type=float,
        default=scenario.spike_ramp_hours,
        help="hours over which the extra bytes are written",
    )
    parser.add_argument("--converge-hours", type=float, default=12.0)
    parser.add_argument("--modes", default=",".join(mode.label for mode in scenario.modes))
    parser.add_argument(
        "--chart", type=Path, default=ROOT / "docs" / "replays" / f"{scenario.name}.png"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()

    setup_django(scenario.suffix)
    wanted = args.modes.split(",")
    runs, results = [], []
    for how in scenario.modes:
        if how.label not in wanted:
            continue
        print(f"run: {how.label}", file=sys.stderr)
        replay, result = run_once(scenario, how, args)
        runs.append((how.label, replay))
        results.append(result)
    print_table(scenario, results, args)
    plot(scenario, runs, args.chart)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


SCENARIO = Scenario(
    name="transient_spike",
    title="Transient spike on zoekt-0 (740/3,023 of its disk for 7 h)",
    suffix="replay_spike",
    spike_gib=740.0,
    spike_ramp_hours=2.0,
    spike_hours=7.0,
    after_hours=20.0,
)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sys.exit(main(SCENARIO, parser))
