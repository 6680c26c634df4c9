"""Replay: drain a node (``remove``), and replace one with a new empty node (``replace``).

Run it with ``python -m config.devservers exec -- .venv/bin/python
bench/replay_drain.py`` (or with ``DATABASE_URL`` and ``REDIS_URL`` set); it
uses the scratch database ``<name>_replay_drain``. Everything runs through
``simulator.replay``: the real API, planner, scheduling, moves, search targets
and database, fake nodes and a simulated clock; indexing takes time (20 MiB/s
of index a task, 8 tasks at a time a node, as the other replays).

The fleet: five nodes of one size, chosen so that the catalog fills them to
``--fill`` of their disk (55 % by default, see below); 100 root groups
(log-normal sizes, about 1,500 projects, an index 3 × its repository, the
rolling-restart replay's catalog), one replica each, placed by the product's
balanced strategy. Search traffic follows a Zipf law (exponent 1), 100
searches a simulated minute.

Once every namespace is ready and an hour has passed, the operator takes
``zoekt-2`` out of service. Two runs, each from an empty database:

* **remove**: ``zoekt.shutdowns.do_request_node_shutdown(type="remove")``;
  the drain job moves every index off the node onto the four others;
* **replace**: a sixth node, ``zoekt-5``, of the same size and empty, joins
  (its first heartbeat registers it); once it is online the operator
  requests ``replace`` of ``zoekt-2`` onto it.

The rebalance reconciler (``zoekt_rebalance_enabled``) is off: the replay
measures the drain alone, and with it on the new node's first heartbeat would
start rebalance moves onto it before the replace is requested.

Each run goes on until the record is ``complete`` (or gives up after
``--give-up-hours``), then 30 minutes more, so the evicted copies are deleted
from the drained node and the fleet is at rest. One table, both runs:
namespace-minutes without a search target (every namespace checked at every
20 s tick from the request on) and dark searches; the highest share of its
disk any node reached from the request to the end, against the high
watermark (75 %); the time from the request to ``complete`` against the
physical bound, the drained node's index bytes ÷ (the indexing rate of one
task × the move slots: ``min(zoekt_move_max_per_source, zoekt_move_max_per_target
× targets, zoekt_move_max_in_cluster)``); bytes moved; moves parked and
fallen back; for the replace, the share of the moves that went to the named
node; and afterwards the busiest node's share of its disk against the lower
bound (the used bytes of the fleet over the capacity of the nodes left).
It writes a PNG chart of per-node disk (the drained node's line is its
bytes left) and the dark searches of each minute over simulated time
(``--chart``, default ``docs/replays/drain.png``).

Why 55 % and not 60 %: a move only goes to a node whose disk stays under
the high watermark less the hysteresis band (70 %, ``choose_target``), so
four nodes can take a fifth node's data only while the five hold at most
4 × 70 % ÷ 5 = 56 % each. At 60 % the four would end at 75 %, the high
watermark itself: the drain stalls (``drain_no_target``) with the last
indices still serving on the node, which is its documented answer (add a
node: that is the replace run). ``--fill 0.6`` shows it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.replay_rolling_restart import build_catalog
from bench.replays import (
    GIB,
    ROOT,
    clock_text,
    finish,
    held_progress,
    reset_database,
    run_all,
    setup_django,
    traffic_replay,
)

MIB = 1024**2
NODES = ("zoekt-0", "zoekt-1", "zoekt-2", "zoekt-3", "zoekt-4")
DRAINED = "zoekt-2"
NEW_NODE = "zoekt-5"
BUFFER = 3
NODE_CONCURRENCY = 8
AFTER_SECONDS = 30 * 60
OPERATOR = "replay-operator"

RUNS = (
    ("remove zoekt-2", {"type": "remove"}),
    ("replace zoekt-2 with a new node", {"type": "replace"}),
)


class Watch:
    """What the replay counts at every tick, at the instant searches are drawn: the
    namespaces without a search target, the highest disk share each node reached, and the
    drained node's bytes left (for the chart)."""

    def __init__(self, roots: dict[int, str]):
        self.roots = list(roots)
        self.measuring = False
        self.dark_seconds = 0.0
        self.peak_share: dict[str, float] = {}
        self.bytes_left: list[tuple[float, float]] = []
        self.drained: str | None = None

    def __call__(self, r) -> None:
        from zoekt.search_targets import search_targets_many

        if not self.measuring:
            return
        for name, node in r.nodes.items():
            if node.alive:
                share = node.fake.disk_used_bytes() / node.fake.config.disk_total_bytes
                self.peak_share[name] = max(self.peak_share.get(name, 0.0), share)
        if self.drained is not None:
            held = r.nodes[self.drained].fake.indexed_bytes()
            self.bytes_left.append((r.t, held / GIB))
        answers = search_targets_many(self.roots)
        dark = sum(1 for answer in answers.values() if not answer.targets)
        self.dark_seconds += dark * r.tick_seconds


def node_size(projects: list[tuple[int, int, int]], fill: float) -> int:
    """The disk of each of the five nodes so that the catalog's index bytes fill them to
    ``fill`` (rounded up to a GiB)."""
    total = sum(size * BUFFER for _, _, size in projects)
    return math.ceil(total / (len(NODES) * fill) / GIB) * GIB


def move_slots(settings, targets: int) -> int:
    """The moves a drain has building at once: the per-source throttle, the per-target
    one times the nodes it moves to, and the fleet's budget, whichever binds."""
    return min(
        settings.move_max_per_source,
        settings.move_max_per_target * targets,
        settings.move_max_in_cluster,
    )


def drain_summary(record, replay, option: dict) -> dict:
    """The drain's moves, as ``zoekt.drains.drain_progress`` and the move rows say."""
    from zoekt import drains
    from zoekt.models import Move

    progress = drains.drain_progress(record)
    moves = drains.drain_moves(record)
    done = progress["moves_done"]
    on_target = progress["moves_done_on_target"]
    return {
        "bytes_moved": progress["bytes_moved"],
        "moves_done": done,
        "moves_parked": moves.filter(state=Move.State.PARKED).count(),
        "moves_fallen_back": moves.filter(state=Move.State.FALLEN_BACK).count(),
        "moves_on_target": on_target,
        "share_on_target": (on_target / done) if option["type"] == "replace" and done else None,
        "moves_by_target": {
            name: moves.filter(state=Move.State.DONE, target_node_id=node.fake.node_id).count()
            for name, node in replay.nodes.items()
        },
    }


def fleet_after(replay, drained: str) -> dict:
    """The nodes left: each one's disk share, the busiest, and the lower bound (the used
    bytes of every node, the drained one included, over the capacity of the nodes left)."""
    left = {name: node for name, node in replay.nodes.items() if name != drained}
    used = sum(node.fake.disk_used_bytes() for node in replay.nodes.values())
    capacity = sum(node.fake.config.disk_total_bytes for node in left.values())
    shares = {
        name: node.fake.disk_used_bytes() / node.fake.config.disk_total_bytes
        for name, node in left.items()
    }
    return {
        "shares_after": shares,
        "busiest_after": max(shares.values()),
        "lower_bound": used / capacity,
        "drained_bytes_after": replay.nodes[drained].fake.indexed_bytes(),
    }


def request_shutdown(replay, option: dict, progress):
    """The operator's request; for a replace, the new node joins first and is waited for."""
    from zoekt import clock, shutdowns
    from zoekt.models import Node

    target_id = None
    if option["type"] == "replace":
        total = replay.nodes[NODES[0]].fake.config.disk_total_bytes
        replay.add_node(NEW_NODE, disk_total_bytes=total, disk_base_used_bytes=0)
        replay.event(f"{NEW_NODE} joins")
        replay.run(
            600,
            until=lambda r: (
                r.nodes[NEW_NODE].fake.node_id is not None
                and Node.objects.get(pk=r.nodes[NEW_NODE].fake.node_id).is_online(clock.now())
            ),
            progress=progress,
        )
        target_id = replay.nodes[NEW_NODE].fake.node_id
    record = shutdowns.do_request_node_shutdown(
        replay.nodes[DRAINED].fake.node_id,
        type=option["type"],
        reason="replay: " + option["type"],
        requested_by=OPERATOR,
        target_node_id=target_id,
    )
    replay.event(f"{option['type']} {DRAINED} requested")
    return record


def run_once(label: str, option: dict, args) -> tuple[object, dict]:
    from simulator.models import zipf_hotness
    from simulator.replay import catalog_rows
    from zoekt import app_settings
    from zoekt.models import NodeShutdown

    roots, projects = build_catalog(args.seed, args.groups)
    sizes = {project_id: size * BUFFER for project_id, _, size in projects}
    traffic = zipf_hotness(list(roots), s=1.0, seed=args.seed)
    disk = node_size(projects, args.fill)
    reset_database()
    started = time.perf_counter()
    replay = traffic_replay(args, sizes, traffic, node_concurrency=NODE_CONCURRENCY)
    watch = Watch(roots)
    statuses: list[tuple[float, str, str]] = []
    with replay:
        # The drain alone: the rebalance reconciler would start moving onto the new node
        # as soon as it joins (docs/operations.md, replacing a node).
        replay.settings(
            zoekt_indexing_enabled=True, zoekt_search_enabled=True, zoekt_rebalance_enabled=False
        )
        replay.load_catalog(*catalog_rows(roots, projects))
        for name in NODES:
            replay.add_node(name, disk_total_bytes=disk, disk_base_used_bytes=0)
        replay.enable(list(roots), label="namespaces enabled")
        replay.watch(watch)

        progress = held_progress(label, started, quiet=args.quiet, digits=0)

        ready = replay.run(6 * 3600, until=lambda r: r.converged(), progress=progress)
        ready_at = replay.t
        replay.run(args.calm_minutes * 60, progress=progress)
        before = {n: node.fake.disk_used_bytes() / disk for n, node in replay.nodes.items()}
        drained_bytes = replay.nodes[DRAINED].fake.indexed_bytes()
        watch.measuring = True
        watch.drained = DRAINED
        record = request_shutdown(replay, option, progress)
        requested_at = replay.t
        first_sample = len(replay.samples)

        def done(r) -> bool:
            record.refresh_from_db()
            if not statuses or statuses[-1][1:] != (record.status, record.status_reason):
                statuses.append((r.t, record.status, record.status_reason))
            return record.status == NodeShutdown.Status.COMPLETE

        complete = replay.run(args.give_up_hours * 3600, until=done, progress=progress)
        complete_at = replay.t if complete else math.nan
        replay.event(f"{DRAINED} drained" if complete else "gave up waiting")
        summary = drain_summary(record, replay, option)
        replay.run(AFTER_SECONDS, progress=progress)
        watch.measuring = False
        after = fleet_after(replay, DRAINED)
        targets = 1 if option["type"] == "replace" else len(NODES) - 1
        slots = move_slots(app_settings.current(), targets)
        wall = time.perf_counter() - started

    measured = replay.samples[first_sample:]
    searches = sum(s.searches for s in measured)
    dark = sum(s.dark for s in measured)
    bound = drained_bytes / (args.rate_mib * MIB * slots)
    return replay, {
        "label": label,
        "type": option["type"],
        "namespaces": len(roots),
        "projects": len(projects),
        "node_bytes": disk,
        "initial_ready": ready,
        "initial_ready_after_s": ready_at,
        "shares_before": before,
        "drained_bytes": drained_bytes,
        "complete": complete,
        "statuses": statuses,
        "time_to_complete_s": complete_at - requested_at,
        "move_slots": slots,
        "bound_s": bound,
        "dark_namespace_minutes": watch.dark_seconds / 60,
        "searches": searches,
        "dark_searches": dark,
        "peak_share": dict(watch.peak_share),
        "peak_share_max": max(share for name, share in watch.peak_share.items() if name != DRAINED),
        **summary,
        **after,
        "bytes_left_series": watch.bytes_left,
        "simulated_s": replay.t,
        "wall_s": wall,
    }


def print_table(results: list[dict], args) -> None:
    from zoekt import capacity

    first = results[0]
    high = capacity.WATERMARK_LIMIT_HIGH
    print()
    print(
        f"Drain replay: {len(NODES)} nodes of {first['node_bytes'] / GIB:.0f} GiB at "
        f"{100 * args.fill:.0f} % (the catalog's index bytes), {first['namespaces']} root "
        f"groups ({first['projects']} projects), one replica each; indexing "
        f"{args.rate_mib:g} MiB/s a task, {NODE_CONCURRENCY} tasks a node."
    )
    print(f"{DRAINED} taken out of service an hour after the fleet was ready.")
    print()
    rows = [
        ("dark namespace-minutes", lambda r: f"{r['dark_namespace_minutes']:,.1f}"),
        (
            "dark searches",
            lambda r: f"{r['dark_searches']:,} of {r['searches']:,}",
        ),
        (
            f"highest disk share of a node left (high {100 * high:.0f} %)",
            lambda r: f"{100 * r['peak_share_max']:.1f} %",
        ),
        ("drained node's index bytes", lambda r: f"{r['drained_bytes'] / GIB:,.1f} GiB"),
        (
            "time to complete",
            lambda r: "never" if not r["complete"] else clock_text(r["time_to_complete_s"]),
        ),
        (
            "  bound: bytes / (rate x slots)",
            lambda r: f"{clock_text(r['bound_s'])} ({r['move_slots']} slots)",
        ),
        (
            "  observed: bytes moved / time",
            lambda r: "-" if not r["complete"] else f"{_rate(r) / MIB:.1f} MiB/s",
        ),
        ("bytes moved", lambda r: f"{r['bytes_moved'] / GIB:,.1f} GiB"),
        ("moves done / parked / fallen back", _moves_cell),
        (
            "moves to the named node",
            lambda r: (
                "-"
                if r["share_on_target"] is None
                else f"{r['moves_on_target']} ({100 * r['share_on_target']:.0f} %)"
            ),
        ),
        ("busiest node after", lambda r: f"{100 * r['busiest_after']:.1f} %"),
        ("  lower bound: used / capacity left", lambda r: f"{100 * r['lower_bound']:.1f} %"),
        ("wall time", lambda r: f"{r['wall_s']:.0f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    header = f"{'':<{width}}" + "".join(f" {r['label'][:32]:>32}" for r in results)
    print(header)
    print("-" * len(header))
    for name, cell in rows:
        print(f"{name:<{width}}" + "".join(f" {cell(r):>32}" for r in results))
    for r in results:
        print(f"\n{r['label']}:")
        print("  disk before: " + _shares(r["shares_before"]))
        print("  peak during: " + _shares(r["peak_share"]))
        print("  after:       " + _shares(r["shares_after"]))
        print(f"  moves done by target: {r['moves_by_target']}")
        print("  record: " + ", ".join(f"{clock_text(t)} {s} {why}" for t, s, why in r["statuses"]))


def _rate(r: dict) -> float:
    return r["bytes_moved"] / r["time_to_complete_s"]


def _moves_cell(r: dict) -> str:
    return f"{r['moves_done']} / {r['moves_parked']} / {r['moves_fallen_back']}"


def _shares(shares: dict[str, float]) -> str:
    return ", ".join(f"{name} {100 * share:.1f} %" for name, share in shares.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument(
        "--fill", type=float, default=0.55, help="the catalog's share of the five nodes' disk"
    )
    parser.add_argument("--searches-per-minute", type=int, default=100)
    parser.add_argument("--rate-mib", type=float, default=20.0, help="MiB/s of index a task")
    parser.add_argument("--tick", type=float, default=20.0, help="simulated seconds per tick")
    parser.add_argument(
        "--calm-minutes", type=float, default=60.0, help="from all ready to the request"
    )
    parser.add_argument("--give-up-hours", type=float, default=12.0)
    parser.add_argument("--chart", type=Path, default=ROOT / "docs" / "replays" / "drain.png")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()

    setup_django("replay_drain")
    runs, results = run_all(RUNS, lambda label, option: run_once(label, option, args))
    print_table(results, args)
    finish(
        runs,
        results,
        chart=args.chart,
        json_path=args.json,
        title="Drain replay: per-node disk (the drained node's line is its bytes left) "
        "and dark searches",
        fields=("disk_used_bytes",),
        dark_per_minute=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
