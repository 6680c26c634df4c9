"""Replay: two empty nodes join a fleet at 70 %; the rebalance reconciler converges.

Run it with ``python -m config.devservers exec -- .venv/bin/python
bench/replay_rebalance.py`` (or with ``DATABASE_URL`` and ``REDIS_URL``
set); it uses the scratch database ``<name>_replay_rebalance``. Everything
runs through ``simulator.replay``: the real API, planner, scheduling, moves,
the reconciler's beat entry (``rebalance-fleet``, every 5 minutes, and once
after a node joins), search targets and database, fake nodes and a simulated
clock; indexing takes time (20 MiB/s of index a task, 8 tasks at a time a
node, as the other replays).

The catalog is the rolling-restart replay's: 100 root groups (log-normal
sizes, about 1,500 projects, an index 3 × its repository), one replica each,
placed by the product's balanced strategy on three nodes. Search traffic
follows a Zipf law (exponent 1), 100 searches a simulated minute. Once every
namespace is ready and an hour has passed, two empty nodes of the same size
join. The replay then runs until the reconciler has converged (the desired
balance asks for no move and no rebalance move is live) and then 24
simulated hours more (at 2-minute ticks, every beat entry still at its own
period), to count the moves made after convergence. Two runs, each from an
empty database:

* **disk**: three nodes whose disk the catalog fills to 70 %; no memory
  budget. Judged on disk.
* **memory**: a memory budget per node (``zoekt_node_memory_budget_bytes``,
  ``zoekt_memory_ratio`` 1.5) that the catalog's estimates fill to 70 % on
  three nodes, on disks it fills to 45 %; the webserver RSS of each index
  follows a Zipf law over the namespaces (memory factor 0.125 plus 0.6 over
  the namespace's rank: a few hot namespaces hold most of the memory).
  Judged on memory: the product's estimate (what it balances) and the RSS
  the fake nodes report.

One table, both runs: the busiest node over the lower bound right after the
join and after convergence (the lower bound: the fleet's use over its
capacity, per dimension, the dominant one taken, ``docs/balance.md``);
namespace-minutes without a search target (every namespace, every 20 s tick,
from the join on) and dark searches; the moves after the join, whatever
started them (at 70 % some indices are over their index watermark with no
node to take them: eviction's moves go first once the nodes join, and the
reconciler stands aside until they are done); indices moved more than once;
bytes moved against the minimum that must leave the nodes above the mean
(each node's bytes over the fleet's mean share of its capacity, summed); the
time from the join to convergence; and the moves started in the 24 hours
after. Capacity (docs/capacity.md): the node history is sampled as beat's
``record-node-history`` does; the time the three nodes' disk first reached the low
watermark is set against the forecasts ``planner.provisioning`` made from the history
before it, and the what-if "add 2 nodes" asked just before the join
(``dashboard.capacity.capacity_report``) against the moves and bytes the fleet then
made. It writes a PNG chart of per-node disk (and RSS) and the dark searches
of each minute (``--chart``, default ``docs/replays/rebalance.png``).
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
    MIB,
    ROOT,
    clock_text,
    finish,
    held_progress,
    reset_database,
    run_all,
    setup_django,
)

OLD_NODES = ("zoekt-0", "zoekt-1", "zoekt-2")
NEW_NODES = ("zoekt-3", "zoekt-4")
BUFFER = 3
NODE_CONCURRENCY = 8
MEMORY_RATIO = 1.5
SMALL_FACTOR = 0.125
HOT_SPREAD = 0.6
AFTER_TICK = 120.0

RUNS = (
    ("disk: 3 nodes at 70 %, 2 join", {"memory": False}),
    ("memory: budgets at 70 %, Zipf-hot, 2 join", {"memory": True}),
)


class Watch:
    """Counted at every tick, at the instant searches are drawn: the namespaces without a
    search target."""

    def __init__(self, roots: dict[int, str]):
        self.roots = list(roots)
        self.measuring = False
        self.dark_seconds = 0.0

    def __call__(self, r) -> None:
        from zoekt.search_targets import search_targets_many

        if not self.measuring:
            return
        answers = search_targets_many(self.roots)
        dark = sum(1 for answer in answers.values() if not answer.targets)
        self.dark_seconds += dark * r.tick_seconds


def zipf_memory_factors(roots: dict[int, str], traffic: dict[int, float]) -> dict[int, float]:
    """Each namespace's resident bytes per index byte: 0.125 plus 0.6 over its rank in the
    search traffic (the hottest searched is the hottest in memory)."""
    ranked = sorted(roots, key=lambda root: (-traffic.get(root, 0.0), root))
    return {root: SMALL_FACTOR + HOT_SPREAD / rank for rank, root in enumerate(ranked, start=1)}


def fleet_figures(replay, memory_budget: int | None) -> dict:
    """From the fake nodes: each node's disk share (used over its disk) and, with a budget,
    its RSS share; the busiest; the lower bound (use over capacity, per dimension); and the
    bytes of index that must leave the nodes above the mean at the least."""
    nodes = replay.nodes
    disk = {n: node.fake.disk_used_bytes() for n, node in nodes.items()}
    size = {n: node.fake.config.disk_total_bytes for n, node in nodes.items()}
    held = {n: node.fake.indexed_bytes() for n, node in nodes.items()}
    out = {
        "disk_share": {n: disk[n] / size[n] for n in nodes},
        "disk_lower_bound": sum(disk.values()) / sum(size.values()),
    }
    mean = sum(held.values()) / sum(size.values())
    out["min_bytes_to_move"] = sum(max(0.0, held[n] - mean * size[n]) for n in nodes)
    out["disk_busiest"] = max(out["disk_share"].values())
    if memory_budget:
        rss = {
            n: int(node.fake.process_health()["webserver"]["rss_bytes"])
            for n, node in nodes.items()
        }
        out["rss_share"] = {n: rss[n] / memory_budget for n in nodes}
        out["rss_lower_bound"] = sum(rss.values()) / (memory_budget * len(nodes))
        out["rss_busiest"] = max(out["rss_share"].values())
    return out


def product_figures() -> dict:
    """The product's own balance report (``eviction.rebalance.balance_report``): the busiest
    node's dominant share now and the lower bound, and whether it has converged."""
    from eviction.rebalance import balance_report
    from zoekt.models import Move

    _, _, report = balance_report()
    live = Move.objects.live().filter(trigger="rebalance").count()
    shares = [n["now"]["dominant_share"] for n in report["nodes"] if n["now"]["dominant_share"]]
    settling = report["reconciler"]["settling_node_ids"]
    return {
        # The desired balance asks for no move, none is live, and no node is settling (its
        # reported disk may still count a copy it deleted).
        "converged": bool(report["converged"]) and live == 0 and not settling,
        "busiest": max(shares, default=0.0),
        "lower_bound": report["lower_bound"]["dominant"] or 0.0,
        "moves_planned": len(report["moves"]),
        "live": live,
    }


def move_figures(since) -> dict:
    """Every move since the join, whatever started it (the reconciler, or eviction's index
    watermark moves that had no target until the new nodes came): done, by trigger, bytes
    moved, parked and fallen back, and the indices moved more than once (a move whose source
    a move of the window had built)."""
    from django.db.models import Count, Q

    from zoekt.models import Move

    # A move planned before the join (an index-watermark move waiting for a target) that
    # builds after it counts too.
    moves = Move.objects.filter(Q(created_at__gte=since) | Q(building_at__gte=since))
    built = set(
        moves.exclude(replacement_index_id=None).values_list("replacement_index_id", flat=True)
    )
    again = moves.filter(source_index_ref__in=built).exclude(state=Move.State.CANCELLED)
    done = moves.filter(state=Move.State.DONE)
    return {
        "moves": moves.count(),
        "moves_done": done.count(),
        "moves_by_trigger": dict(
            done.values_list("trigger").annotate(n=Count("id")).values_list("trigger", "n")
        ),
        "moves_parked": moves.filter(state=Move.State.PARKED).count(),
        "moves_fallen_back": moves.filter(state=Move.State.FALLEN_BACK).count(),
        "moved_more_than_once": again.count(),
        "bytes_moved": sum(done.values_list("bytes", flat=True)),
    }


def sample_history(_r) -> None:
    """The dashboard's node history, as beat's ``record-node-history`` writes it: one row
    per node per 5-minute interval of simulated time (a second call in it writes nothing)."""
    from dashboard.history import sample_nodes

    sample_nodes()


def forecast_figures() -> dict:
    """The capacity forecast (``planner.provisioning``) against the history: the time the
    three nodes' disk first reached the low watermark, and the forecasts made from the
    history up to each earlier sample (the first at a quarter of the way, the last one
    before the crossing), each with its error."""
    from dashboard.capacity import fleet_history
    from planner import provisioning as p
    from zoekt import clock
    from zoekt.clock import EPOCH

    now = clock.now()
    history = fleet_history(now, 24 * 3600)
    totals = {round((at - EPOCH).total_seconds()): total for at, total in _disk_totals(now)}
    low = p.ProvisioningOptions().low_watermark
    crossed = next(
        (
            s.at
            for s in history
            if totals.get(round(s.at)) and s.used_bytes / totals[round(s.at)] >= low
        ),
        None,
    )
    made = []
    for k, sample in enumerate(history):
        if crossed is None or sample.at >= crossed or k < 2:
            continue
        total = totals[round(sample.at)]
        fleet = p.Fleet(
            nodes=len(OLD_NODES),
            disk_bytes=total,
            memory_budget_bytes=None,
            used_bytes=sample.used_bytes,
            indexed_bytes=sample.indexed_bytes,
            memory_bytes=0,
            node_size=p.NodeSize(total // len(OLD_NODES)),
        )
        result = p.provisioning(fleet, history[: k + 1], sample.at)
        days = result.low_watermark[0].days
        forecast = None if days is None else sample.at + days * p.DAY_SECONDS
        made.append(
            {
                "made_at_s": sample.at - history[0].at,
                "share_then": sample.used_bytes / total,
                "forecast_s": None if forecast is None else forecast - history[0].at,
                "error_s": None if forecast is None else forecast - crossed,
            }
        )
    return {
        "first_sample_at": history[0].at if history else None,
        "crossed_s": None if crossed is None else crossed - history[0].at,
        "forecasts": made,
    }


def _disk_totals(now):
    """The three nodes' summed disk size at each sample time."""
    from datetime import timedelta

    from django.db.models import Sum

    from dashboard.models import NodeSample

    rows = (
        NodeSample.objects.filter(sampled_at__gt=now - timedelta(days=1))
        .values("sampled_at")
        .annotate(total=Sum("total_bytes"))
        .order_by("sampled_at")
        .values_list("sampled_at", "total")
    )
    return list(rows)


def what_if_figures() -> dict:
    """``zoekt_capacity --add-nodes 2``, asked just before the two nodes join: the moves
    and bytes it says the fleet will take, and the busiest node it expects after."""
    from dashboard.capacity import capacity_report
    from planner.provisioning import WhatIf

    report = capacity_report(WhatIf(add_nodes=len(NEW_NODES)))
    w = report["what_if"]
    return {
        "moves": w["move_count"],
        "bytes": w["bytes_to_move"],
        "busiest_after": w["busiest_over_lower_bound"]["desired"]["busiest"],
        "status_before": report["status"],
        "status_after": w["provisioning_after"]["status"],
    }


def run_once(label: str, option: dict, args) -> tuple[object, dict]:
    from simulator.models import zipf_hotness
    from simulator.replay import Replay, catalog_rows
    from zoekt import clock
    from zoekt.models import Move

    memory = option["memory"]
    roots, projects = build_catalog(args.seed, args.groups)
    sizes = {project_id: size * BUFFER for project_id, _, size in projects}
    repository_bytes = sum(size for _, _, size in projects)
    traffic = zipf_hotness(list(roots), s=1.0, seed=args.seed)
    fill = args.disk_fill_memory if memory else args.fill
    disk = math.ceil(repository_bytes * BUFFER / (len(OLD_NODES) * fill) / GIB) * GIB
    budget = (
        math.ceil(repository_bytes * MEMORY_RATIO / (len(OLD_NODES) * args.fill) / GIB) * GIB
        if memory
        else None
    )
    reset_database()
    started = time.perf_counter()
    replay = Replay(
        index_size=lambda repo_id: sizes.get(repo_id, MIB),
        traffic=traffic,
        hotness=zipf_memory_factors(roots, traffic) if memory else None,
        searches_per_sample=args.searches_per_minute,
        tick_seconds=args.tick,
        indexing_bytes_per_second=args.rate_mib * MIB,
        node_concurrency=NODE_CONCURRENCY,
        seed=args.seed,
    )
    watch = Watch(roots)
    with replay:
        replay.settings(
            zoekt_indexing_enabled=True,
            zoekt_search_enabled=True,
            zoekt_rebalance_enabled=True,
            zoekt_node_memory_budget_bytes=budget,
            zoekt_memory_ratio=MEMORY_RATIO,
        )
        replay.load_catalog(*catalog_rows(roots, projects))
        for name in OLD_NODES:
            replay.add_node(
                name, disk_total_bytes=disk, disk_base_used_bytes=0, memory_limit_bytes=budget
            )
        replay.enable(list(roots), label="namespaces enabled")
        replay.watch(watch)
        replay.watch(sample_history)

        progress = held_progress(label, started, quiet=args.quiet, digits=1)

        ready = replay.run(8 * 3600, until=lambda r: r.converged(), progress=progress)
        replay.run(args.calm_minutes * 60, progress=progress)
        before_join = fleet_figures(replay, budget)
        product_before_join = product_figures()
        forecast = forecast_figures()
        what_if = what_if_figures()
        joined_at = clock.now()
        first_sample = len(replay.samples)
        built_before = sum(node.index_bytes_built() for node in replay.nodes.values())
        for name in NEW_NODES:
            replay.add_node(
                name, disk_total_bytes=disk, disk_base_used_bytes=0, memory_limit_bytes=budget
            )
        replay.event("two empty nodes join")
        join_t = replay.t
        watch.measuring = True
        replay.run(600, until=lambda r: all(r.nodes[n].fake.node_id for n in NEW_NODES))
        at_join = fleet_figures(replay, budget)
        product_at_join = product_figures()

        def converged(r) -> bool:
            return r.converged() and product_figures()["converged"]

        done = replay.run(args.give_up_hours * 3600, until=converged, progress=progress)
        converged_at = clock.now()
        converge_s = replay.t - join_t if done else math.nan
        replay.event("converged" if done else "gave up waiting")
        after = fleet_figures(replay, budget)
        product_after = product_figures()
        moved = move_figures(joined_at)
        # What the nodes really built from the join to convergence: the moves' replacements,
        # and any re-indexing besides (none in the full catalog's runs).
        moved["bytes_built"] = (
            sum(node.index_bytes_built() for node in replay.nodes.values()) - built_before
        )
        measured = replay.samples[first_sample:]
        # 24 hours more at coarser ticks: the moves the reconciler starts after convergence.
        replay.tick_seconds = AFTER_TICK
        replay.run(args.after_hours * 3600, progress=progress)
        watch.measuring = False
        later = Move.objects.filter(created_at__gt=converged_at).count()
        end = fleet_figures(replay, budget)
        wall = time.perf_counter() - started

    searches = sum(s.searches for s in measured)
    dark = sum(s.dark for s in measured)
    return replay, {
        "label": label,
        "memory": memory,
        "namespaces": len(roots),
        "projects": len(projects),
        "node_disk_bytes": disk,
        "memory_budget_bytes": budget,
        "initial_ready": ready,
        "before_join": before_join,
        "product_before_join": product_before_join,
        "forecast": forecast,
        "what_if": what_if,
        "at_join": at_join,
        "product_at_join": product_at_join,
        "converged": done,
        "time_to_converge_s": converge_s,
        "after": after,
        "product_after": product_after,
        "end": end,
        **moved,
        "moves_in_24h_after": later,
        "dark_namespace_minutes": watch.dark_seconds / 60,
        "searches": searches,
        "dark_searches": dark,
        "simulated_s": replay.t,
        "wall_s": wall,
    }


def _ratio(busiest: float, bound: float) -> str:
    return (
        "-"
        if not bound
        else f"{busiest / bound:.2f}× ({100 * busiest:.1f} % / {100 * bound:.1f} %)"
    )


def _at(seconds: float | None) -> str:
    return "never" if seconds is None else f"at {clock_text(seconds)}"


def _forecast(r: dict, which: int) -> str:
    made = r["forecast"]["forecasts"]
    if not made:
        return "-"
    if which == 0:
        quarter = [m for m in made if m["share_then"] >= 0.15]
        entry = quarter[0] if quarter else made[0]
    else:
        entry = made[-1]
    if entry["forecast_s"] is None:
        return f"made at {clock_text(entry['made_at_s'])}: not growing"
    sign = "+" if entry["error_s"] >= 0 else "-"
    return (
        f"made at {clock_text(entry['made_at_s'])} ({100 * entry['share_then']:.0f} %): "
        f"{clock_text(entry['forecast_s'])} ({sign}{clock_text(abs(entry['error_s']))})"
    )


def print_table(results: list[dict], args) -> None:
    print()
    first = results[0]
    print(
        f"Rebalance replay: {len(OLD_NODES)} nodes, then {len(NEW_NODES)} empty ones join; "
        f"{first['namespaces']} root groups ({first['projects']} projects), one replica each; "
        f"indexing {args.rate_mib:g} MiB/s a task, {NODE_CONCURRENCY} tasks a node."
    )
    print()

    def judged(r: dict, when: str) -> str:
        figures = r[when]
        if r["memory"]:
            return _ratio(figures["rss_busiest"], figures["rss_lower_bound"])
        return _ratio(figures["disk_busiest"], figures["disk_lower_bound"])

    def product(r: dict, when: str) -> str:
        figures = r["product_" + when]
        return _ratio(figures["busiest"], figures["lower_bound"])

    rows = [
        ("busiest / lower bound at the join (disk; RSS)", lambda r: judged(r, "at_join")),
        ("  after convergence (target ≤ 1.10×)", lambda r: judged(r, "after")),
        ("  the product's measure at the join", lambda r: product(r, "at_join")),
        ("  the product's measure after", lambda r: product(r, "after")),
        ("dark namespace-minutes (target 0)", lambda r: f"{r['dark_namespace_minutes']:,.1f}"),
        ("dark searches", lambda r: f"{r['dark_searches']:,} of {r['searches']:,}"),
        (
            "moves done / parked / fallen back",
            lambda r: f"{r['moves_done']} / {r['moves_parked']} / {r['moves_fallen_back']}",
        ),
        (
            "  done, by trigger",
            lambda r: ", ".join(f"{n} {t}" for t, n in sorted(r["moves_by_trigger"].items())),
        ),
        ("indices moved more than once (target 0)", lambda r: f"{r['moved_more_than_once']}"),
        ("bytes moved (index the nodes built)", lambda r: f"{r['bytes_built'] / GIB:,.1f} GiB"),
        (
            "  / minimum leaving the nodes above the mean (≤ 1.25×)",
            lambda r: (
                f"{r['bytes_built'] / r['at_join']['min_bytes_to_move']:.2f}× of "
                f"{r['at_join']['min_bytes_to_move'] / GIB:,.1f} GiB"
            ),
        ),
        ("  the moves' recorded bytes", lambda r: f"{r['bytes_moved'] / GIB:,.1f} GiB"),
        (
            "time from the join to convergence",
            lambda r: clock_text(r["time_to_converge_s"]) if r["converged"] else "never",
        ),
        (
            f"moves in the {args.after_hours:g} hours after (target 0)",
            lambda r: f"{r['moves_in_24h_after']}",
        ),
        (
            "low watermark reached (fleet's disk, 60 %)",
            lambda r: _at(r["forecast"]["crossed_s"]),
        ),
        ("  forecast a quarter of the way (error)", lambda r: _forecast(r, 0)),
        ("  forecast at the last sample before (error)", lambda r: _forecast(r, -1)),
        (
            "what-if 'add 2 nodes': moves / bytes",
            lambda r: f"{r['what_if']['moves']} / {r['what_if']['bytes'] / GIB:,.1f} GiB",
        ),
        (
            "  what the fleet then did: moves / bytes",
            lambda r: f"{r['moves_done']} / {r['bytes_moved'] / GIB:,.1f} GiB",
        ),
        (
            "  busiest after: what-if / product's measure",
            lambda r: (
                f"{100 * r['what_if']['busiest_after']:.1f} % / "
                f"{100 * r['product_after']['busiest']:.1f} %"
            ),
        ),
        ("wall time", lambda r: f"{r['wall_s']:.0f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    cell_width = 44
    header = f"{'':<{width}}" + "".join(
        f" {r['label'][:cell_width]:>{cell_width}}" for r in results
    )
    print(header)
    print("-" * len(header))
    for name, cell in rows:
        print(f"{name:<{width}}" + "".join(f" {cell(r):>{cell_width}}" for r in results))
    for r in results:
        print(f"\n{r['label']}:")
        for when in ("before_join", "at_join", "after", "end"):
            shares = r[when]["disk_share"]
            line = ", ".join(f"{n} {100 * s:.1f} %" for n, s in shares.items())
            print(f"  disk {when:<12} {line}")
            if r["memory"]:
                rss = r[when]["rss_share"]
                line = ", ".join(f"{n} {100 * s:.1f} %" for n, s in rss.items())
                print(f"  RSS  {when:<12} {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument(
        "--fill",
        type=float,
        default=0.70,
        help="the catalog's share of the three nodes (disk; memory in the memory run)",
    )
    parser.add_argument(
        "--disk-fill-memory", type=float, default=0.45, help="the disk share in the memory run"
    )
    parser.add_argument("--searches-per-minute", type=int, default=100)
    parser.add_argument("--rate-mib", type=float, default=20.0, help="MiB/s of index a task")
    parser.add_argument("--tick", type=float, default=20.0, help="simulated seconds per tick")
    parser.add_argument("--calm-minutes", type=float, default=60.0)
    parser.add_argument("--give-up-hours", type=float, default=12.0)
    parser.add_argument(
        "--after-hours", type=float, default=24.0, help="run on after convergence, counting moves"
    )
    parser.add_argument("--only", choices=("disk", "memory"), help="one run only")
    parser.add_argument("--chart", type=Path, default=ROOT / "docs" / "replays" / "rebalance.png")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()

    setup_django("replay_rebalance")
    specs = [
        spec for spec in RUNS if args.only is None or spec[1]["memory"] == (args.only == "memory")
    ]
    runs, results = run_all(specs, lambda label, option: run_once(label, option, args))
    print_table(results, args)
    finish(
        runs,
        results,
        chart=args.chart,
        json_path=args.json,
        title="Rebalance replay: per-node disk and RSS, and dark searches",
        fields=("disk_used_bytes", "rss_bytes"),
        dark_per_minute=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
