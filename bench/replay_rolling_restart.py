"""Replay: a rolling restart of every node; GitLab's lost-node handling against restart records.

Run it with ``python -m config.devservers exec -- .venv/bin/python
bench/replay_rolling_restart.py`` (or with ``DATABASE_URL`` and ``REDIS_URL``
set); it uses the scratch database ``<name>_replay_restart``. Everything runs
through ``simulator.replay``: the real API, planner, scheduling, search
targets and database, fake nodes and a simulated clock; indexing takes time
(20 MiB/s of index a task, 8 tasks at a time a node, as the eviction replays).

The fleet: five nodes of 300 GiB; 100 root groups (log-normal sizes, about
1,500 projects, an index 3 × its repository), half of them (drawn by a
seeded shuffle, so size and traffic do not decide it) with two replicas
(``number_of_replicas_override`` 2, as an operator sets it through the API),
the others with the default one. Search traffic follows a Zipf law
(exponent 1), 100 searches a simulated minute. GitLab.com's lost-node
threshold, ``zoekt_lost_node_threshold`` 10m, in both runs; both place by the
product's balanced strategy, so that every node holds some of both kinds.

Once every namespace is ready and an hour has passed, the nodes are
restarted one after another, ``zoekt-0`` first: each stops (no heartbeat, no
callback) for 20 minutes, then starts again on the same disk, with the same
uuid and every byte it held (``Replay.start_node``). The next node goes
down once the previous one is back **and settled**: at least 10 minutes
after it came back, every namespace has all its replicas ready and no
shutdown record is live (or, should that never happen, two hours after it
came back). Two runs, each from an empty database:

* **GitLab's behaviour**: nothing is said before a node goes down. At the
  threshold ``lost_nodes_check`` deletes the node (its indices and
  repositories), the rollout places its namespaces again and they are
  re-indexed elsewhere; when the node comes back its heartbeat registers a
  new node row and the reply says ``truncate``, so the node wipes its data
  and starts empty;
* **the product**: before each node goes down the operator requests a
  restart (``zoekt.shutdowns.do_request_node_shutdown``, type ``restart``,
  the default 30-minute delay), as docs/operations.md says.

It prints one table with both runs: nodes handled as lost, bytes of index
built after the first node went down, namespace-minutes without a search
target (every namespace checked at every 20 s tick), split into one- and
two-replica namespaces, against the bound for one-replica namespaces
(each node's one-replica namespaces × its 20 minutes down), dark searches
(count, and share of the searches from the first stop to the end), and the
time from the first stop until the fleet is back as before (all five nodes
online, every namespace with all its replicas ready, no live shutdown
record). It writes a PNG chart of per-node disk and the dark searches of
each minute over simulated time (``--chart``, default
``docs/replays/rolling_restart.png``).
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
    traffic_replay,
)

MIB = 1024**2
ROOT_BASE = 800_000
NODES = ("zoekt-0", "zoekt-1", "zoekt-2", "zoekt-3", "zoekt-4")
NODE_GIB = 300
BUFFER = 3
NODE_CONCURRENCY = 8
DOWN_SECONDS = 20 * 60
SETTLE_SECONDS = 10 * 60
SETTLE_GIVE_UP_SECONDS = 2 * 3600
LOST_AFTER = "10m"
OPERATOR = "replay-operator"

RUNS = (
    ("GitLab's behaviour (lost after 10 min)", {"restart_records": False}),
    ("the product (a restart requested first)", {"restart_records": True}),
)


def build_catalog(seed: int, groups: int) -> tuple[dict[int, str], list[tuple[int, int, int]]]:
    """Root groups by id and their projects as ``(project id, root id, repository bytes)``."""
    rng = random.Random(seed)
    roots, projects, project_id = {}, [], 400_000
    for k in range(groups):
        root = ROOT_BASE + k
        roots[root] = f"group-{k:03d}"
        for _ in range(rng.randint(5, 25)):
            project_id += 1
            size = int(min(rng.lognormvariate(math.log(30 * MIB), 1.1), 4 * GIB))
            projects.append((project_id, root, size))
    return roots, projects


def two_replica_roots(roots: dict[int, str], seed: int) -> set[int]:
    """Half of the roots (a seeded shuffle, so neither size nor traffic decides it)."""
    order = sorted(roots)
    random.Random(seed * 7 + 1).shuffle(order)
    return set(order[: len(order) // 2])


class Watch:
    """What the replay counts at every tick, at the instant searches are drawn: the namespaces
    without a search target by replica count, the node rows deleted (handled as lost), and
    the index bytes the nodes built."""

    def __init__(self, replay, roots: dict[int, str], doubled: set[int]):
        self.replay = replay
        self.roots = list(roots)
        self.doubled = doubled
        self.measuring = False
        self.dark_seconds = {1: 0.0, 2: 0.0}
        self.routed_to_down_seconds = {1: 0.0, 2: 0.0}
        self.dark_by_turn: dict[str, float] = {}
        self.known_node_ids: set[int] = set()
        self.lost: list[tuple[float, int]] = []
        self.turn: str | None = None

    def __call__(self, r) -> None:
        from zoekt.models import Node
        from zoekt.search_targets import search_targets_many

        ids = set(Node.objects.values_list("id", flat=True))
        for gone in sorted(self.known_node_ids - ids):
            self.lost.append((r.t, gone))
            name = next((n for n, node in r.nodes.items() if node.fake.node_id == gone), gone)
            r.event(f"{name} deleted as lost")
        self.known_node_ids = ids
        if not self.measuring:
            return
        answers = search_targets_many(self.roots)
        running = {node.fake.node_id for node in r.nodes.values() if node.alive}
        for root, answer in answers.items():
            copies = 2 if root in self.doubled else 1
            if answer.targets:
                # Sent to a node that stopped but is not yet seen offline: it fails too.
                if any(target.node_id not in running for target in answer.targets):
                    self.routed_to_down_seconds[copies] += r.tick_seconds
                continue
            self.dark_seconds[copies] += r.tick_seconds
            if copies == 1 and self.turn is not None:
                self.dark_by_turn[self.turn] = self.dark_by_turn.get(self.turn, 0.0) + (
                    r.tick_seconds
                )

    def built_bytes(self) -> int:
        return sum(node.index_bytes_built() for node in self.replay.nodes.values())


def one_replica_namespaces_on(node_id: int | None, doubled: set[int]) -> int:
    """One-replica namespaces with an index on the node: each is dark while it is down."""
    from zoekt.models import Index

    if node_id is None:
        return 0
    roots = set(Index.objects.filter(zoekt_node_id=node_id).values_list("namespace_id", flat=True))
    return len(roots - doubled)


def fleet_back(r) -> bool:
    """All the nodes online, every namespace with all its replicas ready, no live record."""
    from zoekt import clock
    from zoekt.models import Node, NodeShutdown

    if any(not node.alive for node in r.nodes.values()):
        return False
    online = sum(1 for node in Node.objects.all() if node.is_online(clock.now()))
    return online >= len(r.nodes) and r.converged() and not NodeShutdown.objects.live().exists()


def restart_node(replay, name: str, watch: Watch, doubled: set[int], records: bool, progress):
    """One node's turn: (a restart requested,) down for 20 minutes, back, settled: the
    fleet back as before (``fleet_back``) and at least ``SETTLE_SECONDS`` since the node
    came back; or ``SETTLE_GIVE_UP_SECONDS`` after it came back, whichever is first."""
    from zoekt import shutdowns

    node = replay.nodes[name]
    node_id = node.fake.node_id
    turn = {"node": name, "node_id": node_id, "held_bytes": node.fake.indexed_bytes()}
    turn["one_replica_namespaces"] = one_replica_namespaces_on(node_id, doubled)
    if records:
        record = shutdowns.do_request_node_shutdown(
            node_id, type="restart", reason="rolling restart", requested_by=OPERATOR
        )
        turn["shutdown_id"] = record.id
    turn["down_at"] = replay.t
    replay.stop_node(name)
    watch.turn = name
    replay.run(DOWN_SECONDS, progress=progress)
    replay.start_node(name)
    back_at = turn["back_at"] = replay.t
    recovered = replay.run(SETTLE_GIVE_UP_SECONDS, until=fleet_back, progress=progress)
    turn["recovered_at"] = replay.t if recovered else math.nan
    if recovered and replay.t - back_at < SETTLE_SECONDS:
        replay.run(SETTLE_SECONDS - (replay.t - back_at), progress=progress)
    turn["settled"] = recovered
    turn["settled_after_s"] = replay.t - back_at
    turn["node_id_after"] = node.fake.node_id
    return turn


def run_once(label: str, option: dict, args) -> tuple[object, dict]:
    from simulator.models import zipf_hotness
    from simulator.replay import catalog_rows, fleet_state
    from zoekt import operator_actions
    from zoekt.models import NodeShutdown

    roots, projects = build_catalog(args.seed, args.groups)
    doubled = two_replica_roots(roots, args.seed)
    sizes = {project_id: size * BUFFER for project_id, _, size in projects}
    traffic = zipf_hotness(list(roots), s=1.0, seed=args.seed)
    records = option["restart_records"]
    reset_database()
    started = time.perf_counter()
    replay = traffic_replay(args, sizes, traffic, node_concurrency=NODE_CONCURRENCY)
    watch = Watch(replay, roots, doubled)
    with replay:
        replay.settings(
            zoekt_indexing_enabled=True,
            zoekt_search_enabled=True,
            zoekt_lost_node_threshold=LOST_AFTER,
            # Restarts alone (the reconciler has its own replay, bench/replay_rebalance.py).
            zoekt_rebalance_enabled=False,
        )
        replay.load_catalog(*catalog_rows(roots, projects))
        for name in NODES:
            replay.add_node(name, disk_total_bytes=NODE_GIB * GIB, disk_base_used_bytes=0)
        replay.enable(list(roots), label="namespaces enabled")
        for root in sorted(doubled):
            operator_actions.do_update_number_of_replicas_override(
                root, {"number_of_replicas_override": 2}
            )
        replay.watch(watch)

        def progress(r) -> None:
            if not args.quiet and int(r.t) % 1800 == 0:
                state = fleet_state()
                print(
                    f"  [{label[:20]}] {clock_text(r.t):>13}  short "
                    f"{state['namespaces_short']}/{state['namespaces']}  dark so far "
                    f"{sum(s.dark for s in r.samples)}  lost {len(watch.lost)}  "
                    f"wall {time.perf_counter() - started:.0f}s",
                    file=sys.stderr,
                )

        ready = replay.run(6 * 3600, until=lambda r: r.converged(), progress=progress)
        ready_at = replay.t
        replay.run(args.calm_minutes * 60, progress=progress)
        before = layout()
        first_down = replay.t
        built_before = watch.built_bytes()
        watch.measuring = True
        turns = [restart_node(replay, name, watch, doubled, records, progress) for name in NODES]
        back_at = turns[-1]["recovered_at"]
        replay.run(1800, progress=progress)  # steady state again
        watch.measuring = False
        watch.turn = None
        built = watch.built_bytes() - built_before
        after = layout()
        statuses = sorted(NodeShutdown.objects.values_list("status", "status_reason"))
        held_after = {name: node.fake.indexed_bytes() for name, node in replay.nodes.items()}
        wall = time.perf_counter() - started

    measured = [s for s in replay.samples if s.t >= first_down]
    searches = sum(s.searches for s in measured)
    dark = sum(s.dark for s in measured)
    bound_minutes = sum(turn["one_replica_namespaces"] for turn in turns) * DOWN_SECONDS / 60
    return replay, {
        "label": label,
        "restart_records": records,
        "namespaces": len(roots),
        "two_replica_namespaces": len(doubled),
        "projects": len(projects),
        "initial_ready": ready,
        "initial_ready_after_s": ready_at,
        "nodes_handled_as_lost": len(watch.lost),
        "bytes_reindexed": built,
        "dark_namespace_minutes_one_replica": watch.dark_seconds[1] / 60,
        "dark_namespace_minutes_two_replicas": watch.dark_seconds[2] / 60,
        "routed_to_down_namespace_minutes_one_replica": watch.routed_to_down_seconds[1] / 60,
        "routed_to_down_namespace_minutes_two_replicas": watch.routed_to_down_seconds[2] / 60,
        "one_replica_bound_minutes": bound_minutes,
        "one_replica_dark_minutes_by_turn": {
            name: seconds / 60 for name, seconds in watch.dark_by_turn.items()
        },
        "searches_after_first_down": searches,
        "dark_searches": dark,
        "dark_share": dark / searches if searches else 0.0,
        "back_as_before_after_s": back_at - first_down,
        "turns": turns,
        "layout_unchanged": before == after,
        "held_bytes_after": held_after,
        "shutdown_records": statuses,
        "simulated_s": replay.t,
        "wall_s": wall,
    }


def layout() -> list[tuple[int, int, str]]:
    """Every index as (namespace, node id, state): what 'as before' compares."""
    from zoekt.models import Index

    return sorted(Index.objects.values_list("namespace_id", "zoekt_node_id", "state"))


def print_table(results: list[dict], args) -> None:
    first = results[0]
    print()
    print(
        f"Rolling-restart replay: {len(NODES)} nodes of {NODE_GIB} GiB, {first['namespaces']} "
        f"root groups ({first['projects']} projects), {first['two_replica_namespaces']} with "
        "two replicas;"
    )
    print(
        f"indexing {args.rate_mib:g} MiB/s per task, {NODE_CONCURRENCY} tasks a node; lost "
        f"after {LOST_AFTER}. Every node down 20 min in turn; counted from the first stop."
    )
    print()
    rows = [
        ("nodes handled as lost", lambda r: f"{r['nodes_handled_as_lost']}"),
        ("bytes re-indexed", lambda r: f"{r['bytes_reindexed'] / GIB:,.1f} GiB"),
        (
            "dark namespace-minutes, 1 replica",
            lambda r: f"{r['dark_namespace_minutes_one_replica']:,.1f}",
        ),
        (
            "  bound: its node's time down",
            lambda r: f"{r['one_replica_bound_minutes']:,.0f}",
        ),
        (
            "dark namespace-minutes, 2 replicas",
            lambda r: f"{r['dark_namespace_minutes_two_replicas']:,.1f}",
        ),
        (
            "routed to a stopped node, 1 / 2 replicas",
            lambda r: (
                f"{r['routed_to_down_namespace_minutes_one_replica']:,.1f} / "
                f"{r['routed_to_down_namespace_minutes_two_replicas']:,.1f}"
            ),
        ),
        (
            "dark searches",
            lambda r: f"{r['dark_searches']:,} ({100 * r['dark_share']:.2f} %)",
        ),
        (
            "back as before, from the first stop",
            lambda r: (
                "never"
                if math.isnan(r["back_as_before_after_s"])
                else clock_text(r["back_as_before_after_s"])
            ),
        ),
        ("same indices on the same nodes", lambda r: "yes" if r["layout_unchanged"] else "no"),
        ("wall time", lambda r: f"{r['wall_s']:.0f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    header = f"{'':<{width}}" + "".join(f" {r['label'][:40]:>40}" for r in results)
    print(header)
    print("-" * len(header))
    for name, cell in rows:
        print(f"{name:<{width}}" + "".join(f" {cell(r):>40}" for r in results))
    for r in results:
        print(f"\n{r['label']}:")
        for turn in r["turns"]:
            dark = r["one_replica_dark_minutes_by_turn"].get(turn["node"], 0.0)
            recovered = turn["recovered_at"] - turn["back_at"]
            print(
                f"  {turn['node']}: down at {clock_text(turn['down_at'])} holding "
                f"{turn['held_bytes'] / GIB:.1f} GiB; "
                f"{turn['one_replica_namespaces']} one-replica namespaces on it, dark "
                f"{dark:.1f} namespace-minutes (bound "
                f"{turn['one_replica_namespaces'] * DOWN_SECONDS / 60:.0f}); as before "
                + ("never" if math.isnan(recovered) else clock_text(recovered))
                + " after it came back"
                + (
                    f"; back as node {turn['node_id_after']} (was {turn['node_id']})"
                    if turn["node_id_after"] != turn["node_id"]
                    else ""
                )
            )
        held = ", ".join(f"{n} {b / GIB:.1f}" for n, b in r["held_bytes_after"].items())
        print(f"  held at the end (GiB): {held}")
        print(f"  shutdown records: {r['shutdown_records']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--searches-per-minute", type=int, default=100)
    parser.add_argument("--rate-mib", type=float, default=20.0, help="MiB/s of index a task")
    parser.add_argument("--tick", type=float, default=20.0, help="simulated seconds per tick")
    parser.add_argument(
        "--calm-minutes", type=float, default=60.0, help="from all ready to the first restart"
    )
    parser.add_argument(
        "--chart", type=Path, default=ROOT / "docs" / "replays" / "rolling_restart.png"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()

    setup_django("replay_restart")
    runs, results = run_all(RUNS, lambda label, option: run_once(label, option, args))
    print_table(results, args)
    finish(
        runs,
        results,
        chart=args.chart,
        json_path=args.json,
        title="Rolling-restart replay: per-node disk and dark searches",
        fields=("disk_used_bytes",),
        dark_per_minute=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
