"""Faults: the whole pipeline on real processes, under worker crashes, outages and load.

    .venv/bin/python bench/faults.py kill   [--kills 50]
    .venv/bin/python bench/faults.py outage --service postgres|redis --seconds 20
    .venv/bin/python bench/faults.py load   [--nodes 1000 --minutes 10]

Each run builds a ``bench.stack.Stack`` in a scratch directory: its own
PostgreSQL and Redis (so that they can really be stopped), gunicorn, one
Celery worker, fake nodes over HTTP, and this process as the operator and as
a compressed beat. The scenario is the same in all three: a catalog loaded
through the bulk API, namespaces enabled through the operator API (in
waves, so rollouts keep finding work), the fake nodes indexing what they are
given (each task takes ``--task-delay`` to ``--task-delay-max`` seconds),
then one node's disk filling past the high watermark (its fake node is
restarted with more bytes used besides its indices): after the sustain
period (1 min here) node-level eviction chooses what to take off it and
moves it, building each replacement on another node before the old copy
is retired.

``kill``: SIGKILL of the worker's process group ``--kills`` times, each at a
random point of a job of one of four kinds in turn (a rollout, the eviction
trigger, a move step, a scheduling task): the harness waits for the worker
to receive such a job and kills it after a delay drawn up to that kind's
longest run so far. The worker is started again a second later, as a
process manager would. After every kill the fleet's invariants
(``tests/invariants.py``) are checked; after the last, the harness waits,
still ticking, until the work is complete (every namespace searchable,
every index ready, no live move, no pending task), and reports how long
that took.

``outage``: once the fleet is indexed and a move is building, PostgreSQL or
Redis is stopped for ``--seconds``, then started again. It reports what
the nodes got before, during and after, whether any acknowledged heartbeat
or callback was lost (each acknowledged callback's task must be finished
in the database; each node's row must hold what one of its last
acknowledged heartbeats said), and whether the moves completed.

``load``: ``--nodes`` fake nodes (in four processes) heartbeat at GitLab's
5 s for ``--minutes`` while namespaces are enabled, rolled out, indexed,
evicted and moved; it reports errors and the node-observed p50/p99 of the
heartbeat and the callback, then, in the same stack, the real heartbeat's
rate beside the raw-SQL ceiling's (``bench/heartbeat.py``'s closed loop).

Results print as Markdown and are written as JSON with ``--json``. The
scratch directory is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.heartbeat import closed_loop, percentile, preregister  # noqa: E402
from bench.stack import (  # noqa: E402
    GIB,
    TASK_LINE,
    LogTail,
    Stack,
    Ticker,
    roots_of,
)

#: The four kinds of job a kill aims at, in turn.
KILL_KINDS = ("rollout", "eviction", "move", "scheduling")
#: What the filled node's disk holds: over the high watermark (75 %), under the critical (85 %).
FILL_FRACTION = 0.78


def say(text: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {text}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# The scenario
# ----------------------------------------------------------------------------


def node_options(args) -> dict:
    return {
        "disk_total_gib": args.disk_total_gib,
        "disk_used_gib": args.disk_used_gib,
        "delay": args.task_delay,
        "delay_max": args.task_delay_max,
        "concurrency": 4,
    }


def build(args, workdir: Path, *, nodes: int, processes: int = 1, bench_endpoints=False) -> Stack:
    stack = Stack(
        workdir,
        web_workers=args.web_workers,
        worker_concurrency=args.worker_concurrency,
        bench_endpoints=bench_endpoints,
    )
    say(f"scratch directory {workdir}")
    stack.start_postgres()
    stack.start_redis()
    stack.migrate_and_setup()
    stack.configure(
        zoekt_indexing_enabled=True,
        zoekt_search_enabled=True,
        zoekt_node_level_eviction_enabled=True,
        zoekt_eviction_sustain_period="1m",
        zoekt_eviction_cooldown="30m",
    )
    stack.operator_token()
    stack.start_web()
    say(f"web at {stack.base}; loading {args.namespaces} namespaces")
    stack.load_catalog(args.namespaces, args.projects)
    options = node_options(args)
    # zoekt-0 is the node whose disk fills; the rest in ``processes`` processes.
    stack.start_nodes("full", 1, 0, **options)
    per = -(-(nodes - 1) // processes)
    for p in range(processes):
        first = 1 + p * per
        count = min(per, nodes - first)
        if count > 0:
            stack.start_nodes(f"fleet{p}", count, first, **options)
    stack.wait_nodes_online(nodes)
    say(f"{nodes} nodes online")
    stack.start_worker()
    return stack


#: zoekt-0 fills once its indices take this share of its disk (so moving them relieves it).
FILL_INDICES_SHARE = 0.15


def _node(index: int):
    from zoekt.models import Node

    return Node.objects.filter(metadata__name=f"zoekt-{index}").first()


def indexed_share(index: int) -> float:
    node = _node(index)
    return node.indexed_bytes / node.total_bytes if node and node.total_bytes else 0.0


def live_moves() -> int:
    from zoekt.models import Move

    return Move.objects.filter(state__in=Move.LIVE).count()


def fill(stack: Stack, args, index: int = 0) -> dict:
    """Restart zoekt-<index> with enough bytes used besides its indices to stand at 78 %."""
    node = _node(index)
    total = int(args.disk_total_gib * GIB)
    other = max(0, int(FILL_FRACTION * total) - node.indexed_bytes)
    # Kill runs give each node its own process (``build(..., processes=nodes - 1)``).
    label = "full" if index == 0 else f"fleet{index - 1}"
    stack.stop_nodes(label)
    options = {**node_options(args), "disk_used_gib": other / GIB}
    stack.start_nodes(label, 1, index, **options)
    out = {
        "node_id": node.id,
        "indexed_bytes": node.indexed_bytes,
        "other_bytes": other,
        "indices": node.indices.count(),
    }
    say(
        f"zoekt-{index} fills: {node.indexed_bytes / 2**20:.0f} MiB of indices "
        f"({node.indices.count()}) + {other / 2**20:.0f} MiB else of {total / 2**20:.0f} MiB"
    )
    return out


class Waves(threading.Thread):
    """Enable the namespaces in waves, so rollouts keep finding work."""

    def __init__(self, stack: Stack, roots: list[int], size: int, seconds: float) -> None:
        super().__init__(daemon=True, name="waves")
        self.stack, self.roots, self.size, self.seconds = stack, roots, size, seconds
        self.enabled = 0
        self.errors = 0

    def run(self) -> None:
        for start in range(0, len(self.roots), self.size):
            for _attempt in range(30):
                try:
                    self.stack.enable(self.roots[start : start + self.size])
                    break
                except Exception:  # an outage: the operator tries again
                    self.errors += 1
                    time.sleep(2)
            self.enabled = min(len(self.roots), start + self.size)
            time.sleep(self.seconds)


def fleet_state() -> dict:
    from tests.invariants import searchable_roots
    from zoekt.models import EnabledNamespace, Index, Move, Task

    enabled = set(EnabledNamespace.objects.values_list("root_namespace_id", flat=True))
    return {
        "enabled": len(enabled),
        "searchable": len(searchable_roots() & enabled),
        "indices_not_ready": Index.objects.exclude(state=Index.State.READY).count(),
        "live_moves": Move.objects.filter(state__in=Move.LIVE).count(),
        "moves_done": Move.objects.filter(state=Move.State.DONE).count(),
        "moves_other_end": Move.objects.exclude(state__in=[*Move.LIVE, Move.State.DONE]).count(),
        "live_tasks": Task.objects.filter(
            state__in=[Task.State.PENDING, Task.State.PROCESSING]
        ).count(),
    }


def converged(state: dict, expected: int) -> bool:
    return (
        not state.get("over_high_watermark")
        and state["enabled"] == expected
        and state["searchable"] == expected
        and state["indices_not_ready"] == 0
        and state["live_moves"] == 0
        and state["live_tasks"] == 0
    )


def state_text(state: dict) -> str:
    return (
        "".join(
            f"zoekt-{n} over the high watermark, " for n in state.get("over_high_watermark", ())
        )
        + f"searchable {state['searchable']}/{state['enabled']}, "
        f"indices not ready {state['indices_not_ready']}, live moves {state['live_moves']} "
        f"(done {state['moves_done']}), live tasks {state['live_tasks']}"
    )


def wait_converged(
    stack: Stack,
    expected: int,
    timeout: float,
    *,
    every: float = 2.0,
    relieved: list[int] = (),
) -> float:
    """Seconds until the fleet converged (raises after ``timeout``), and until each fake
    node of ``relieved`` is back under the high watermark."""
    from django.db import close_old_connections

    started = time.monotonic()
    last_say = 0.0
    while True:
        stack.check_alive()
        close_old_connections()
        state = fleet_state()
        state["over_high_watermark"] = [n for n in relieved if _node(n).high_watermark_exceeded()]
        now = time.monotonic()
        if converged(state, expected):
            return now - started
        if now - last_say >= 15:
            say(state_text(state))
            last_say = now
        if now - started > timeout:
            raise RuntimeError(f"not converged after {timeout:.0f} s: {state_text(state)}")
        time.sleep(every)


def wait_for_move(stack: Stack, timeout: float) -> None:
    """Until a move is building and its replacement's tasks are out on a node."""
    from zoekt.models import Index, Move, Task

    deadline = time.monotonic() + timeout

    def building() -> bool:
        targets = Move.objects.filter(state=Move.State.BUILDING).values("replacement_index_id")
        replicas = Index.objects.filter(id__in=targets).values("zoekt_node_id")
        return Task.objects.filter(state=Task.State.PROCESSING, zoekt_node_id__in=replicas).exists()

    while not building():
        if time.monotonic() > deadline:
            raise RuntimeError("no move started building")
        stack.check_alive()
        time.sleep(1)


# ----------------------------------------------------------------------------
# kill
# ----------------------------------------------------------------------------


class WorkerWatch(threading.Thread):
    """Reads the current worker's log: when each task was received and when it ended."""

    def __init__(self, stack: Stack, ticker: Ticker) -> None:
        super().__init__(daemon=True, name="worker-watch")
        self.stack, self.ticker = stack, ticker
        self.received: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.durations: dict[str, list[float]] = {}
        self.tails: dict[Path, LogTail] = {}
        self.stopped = threading.Event()
        self.lock = threading.Lock()

    def kind(self, task_id: str) -> str | None:
        label = self.ticker.label(task_id)
        if label is None:
            return None
        return "scheduling" if label.startswith("scheduling:") else label

    def run(self) -> None:
        while not self.stopped.wait(0.01):
            path = self.stack.worker_logs[-1]
            tail = self.tails.setdefault(path, LogTail(path))
            for line in tail.read():
                match = TASK_LINE.search(line)
                if match is None:
                    continue
                now = time.monotonic()
                with self.lock:
                    if match["what"] == "received":
                        self.received[match["id"]] = now
                    else:
                        self.ended[match["id"]] = now
                        kind = self.kind(match["id"])
                        if kind and match["seconds"]:
                            runs = self.durations.setdefault(kind, [])
                            runs.append(float(match["seconds"]))
                            del runs[:-20]

    def next_received(self, kind: str, after: float, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for task_id, at in self.received.items():
                    if at >= after and task_id not in self.ended and self.kind(task_id) == kind:
                        return task_id
            time.sleep(0.005)
        return None

    def typical(self, kind: str) -> float:
        """How long this kind's recent runs took (their 75th percentile; 0.2 s at first)."""
        with self.lock:
            runs = list(self.durations.get(kind, ()))
        return max(0.02, percentile(runs, 75)) if runs else 0.2

    def has_ended(self, task_id: str) -> bool:
        with self.lock:
            return task_id in self.ended


def wait_worker_ready(stack: Stack, timeout: float = 60.0) -> float:
    started = time.monotonic()
    path = stack.worker_logs[-1]
    while time.monotonic() - started < timeout:
        if path.exists() and " ready." in path.read_text(errors="replace"):
            return time.monotonic() - started
        stack.check_alive()
        time.sleep(0.1)
    raise RuntimeError("the worker did not become ready")


def run_kill(args, workdir: Path) -> dict:
    stack = build(args, workdir, nodes=args.nodes, processes=args.nodes - 1)
    from django.db import close_old_connections

    from tests.invariants import searchable_roots, violations

    results: dict = {"mode": "kill", "config": {**vars(args), "json": None}, "kills": []}
    try:
        wait_worker_ready(stack)
        ticker = Ticker(args.tick_seconds)
        ticker.start()
        watch = WorkerWatch(stack, ticker)
        watch.start()
        roots = roots_of(args.namespaces, args.projects)
        waves = Waves(stack, roots, args.wave_size, args.wave_seconds)
        waves.start()
        rng = random.Random(args.seed)
        started = time.monotonic()
        # zoekt-0 fills after 30 % of the kills, zoekt-1 after 60 %: two waves of moves.
        fill_at = (args.kills * 3 // 10, args.kills * 6 // 10)
        broken: list[str] = []
        last_restart = time.monotonic()
        for i in range(args.kills):
            for node, at in enumerate(fill_at):
                label = f"fill zoekt-{node}"
                if i >= at and label not in results and indexed_share(node) >= FILL_INDICES_SHARE:
                    results[label] = fill(stack, args, node)
            time.sleep(max(0.0, args.kill_every - (time.monotonic() - last_restart)))
            kind = KILL_KINDS[i % len(KILL_KINDS)]
            task_id = watch.next_received(kind, time.monotonic(), timeout=60)
            if task_id is None:
                say(f"kill {i + 1}: no {kind} job within 60 s; killing where the worker stands")
            delay = rng.uniform(0, watch.typical(kind))
            time.sleep(delay)
            mid = task_id is not None and not watch.has_ended(task_id)
            close_old_connections()
            before = searchable_roots()
            moving = live_moves()
            stack.kill_worker()
            killed_at = time.monotonic()
            found = violations(searchable_before=before)
            broken += [f"kill {i + 1}: {v}" for v in found]
            results["kills"].append(
                {
                    "at_seconds": round(killed_at - started, 2),
                    "kind": kind,
                    "delay_seconds": round(delay, 3),
                    "mid_job": mid,
                    "live_moves": moving,
                    "violations": found,
                }
            )
            say(
                f"kill {i + 1}/{args.kills}: {kind}, {delay * 1000:.0f} ms after it was received, "
                f"{'mid-job' if mid else 'after it ended'}, {moving} live moves; "
                f"{len(found)} violations"
            )
            time.sleep(args.down_seconds)
            stack.start_worker()
            wait_worker_ready(stack)
            last_restart = time.monotonic()
        last_kill = time.monotonic()
        say("last kill; waiting for the work to complete")
        filled = [n for n in range(len(fill_at)) if f"fill zoekt-{n}" in results]
        if not filled:
            raise RuntimeError("no node held enough to fill: more kills or namespaces")
        completion = wait_converged(stack, len(roots), args.timeout, relieved=filled)
        close_old_connections()
        final = violations(reserved=True)
        broken += [f"at the end: {v}" for v in final]
        results.update(
            {
                "completion_after_last_kill_seconds": round(completion, 1),
                "run_seconds": round(time.monotonic() - started, 1),
                "kill_span_seconds": round(last_kill - started, 1),
                "mid_job_kills": sum(k["mid_job"] for k in results["kills"]),
                "kills_during_moves": sum(1 for k in results["kills"] if k["live_moves"]),
                "kills_by_kind": {
                    kind: sum(1 for k in results["kills"] if k["kind"] == kind)
                    for kind in KILL_KINDS
                },
                "mid_job_by_kind": {
                    kind: sum(1 for k in results["kills"] if k["kind"] == kind and k["mid_job"])
                    for kind in KILL_KINDS
                },
                "violations": broken,
                "final_state": fleet_state(),
                "ticks": ticker.ticks,
            }
        )
        ticker.stop()
        watch.stopped.set()
    finally:
        stack.close()
    return results


def print_kill(results: dict) -> None:
    kills = results["kills"]
    print(
        f"\n{len(kills)} SIGKILLs of the worker in {results['kill_span_seconds']:.0f} s, "
        f"{results['mid_job_kills']} of them mid-job, {results['kills_during_moves']} while "
        f"moves were live; "
        f"invariants broken: {len(results['violations'])}"
    )
    print("\n| job killed | kills | mid-job |")
    print("|---|---:|---:|")
    for kind in KILL_KINDS:
        print(f"| {kind} | {results['kills_by_kind'][kind]} | {results['mid_job_by_kind'][kind]} |")
    state = results["final_state"]
    print(
        f"\nwork complete {results['completion_after_last_kill_seconds']:.0f} s after the last "
        f"kill, without a manual step: {state_text(state)}"
    )
    for line in results["violations"]:
        print(f"  violation: {line}")


# ----------------------------------------------------------------------------
# outage
# ----------------------------------------------------------------------------


def _ts(record: dict) -> float:
    """When the request was sent (the record is written when it ended)."""
    ended = datetime.fromisoformat(record["ts"]).timestamp()
    return ended - (record.get("latency_ms") or 0) / 1000


def _window(at: float, stopped: float, started: float) -> str:
    return "before" if at < stopped else ("during" if at <= started else "after")


def run_outage(args, workdir: Path) -> dict:
    stack = build(args, workdir, nodes=args.nodes)
    from django.db import close_old_connections

    from tests.invariants import violations

    results: dict = {"mode": "outage", "config": {**vars(args), "json": None}}
    try:
        wait_worker_ready(stack)
        ticker = Ticker(args.tick_seconds)
        ticker.start()
        roots = roots_of(args.namespaces, args.projects)
        stack.enable(roots)
        results["indexed_seconds"] = round(wait_converged(stack, len(roots), args.timeout), 1)
        say("fleet indexed")
        results["fill zoekt-0"] = fill(stack, args)
        wait_for_move(stack, timeout=300)
        say(f"a move is building; stopping {args.service} for {args.seconds:g} s")
        close_old_connections()
        from django.db import connections

        connections.close_all()
        stopped = time.time()
        if args.service == "postgres":
            stack.stop_postgres()
        else:
            stack.stop_redis()
        worker_restarts = 0
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            time.sleep(0.5)
        if args.service == "postgres":
            stack.restart_postgres()
        else:
            stack.start_redis()
        started = time.time()
        say(f"{args.service} is back")
        if stack.procs["worker"].poll() is not None:
            # What a process manager would do; reported, not hidden.
            worker_restarts += 1
            stack.procs.pop("worker")
            stack.start_worker()
        completion = wait_converged(stack, len(roots), args.timeout, relieved=[0])
        say("moves complete; stopping the nodes")
        ticker.stop()
        stack.stop_all_nodes()
        close_old_connections()
        results.update(
            analyse_outage(stack, stopped, started)
            | {
                "service": args.service,
                "outage_seconds": round(started - stopped, 1),
                "completion_after_restart_seconds": round(completion, 1),
                "worker_restarts": worker_restarts,
                "final_state": fleet_state(),
                "violations": violations(),
            }
        )
    finally:
        stack.close()
    return results


def analyse_outage(stack: Stack, stopped: float, started: float) -> dict:
    from zoekt.models import Node, Task

    events = stack.node_events()
    heartbeats: dict[str, dict[str, int]] = {}
    callbacks: dict[str, dict[str, int]] = {}
    acked_callbacks: dict[int, bool] = {}
    acked_beats: dict[str, list[tuple[float, int]]] = {}
    after_errors: list[float] = []
    for record in events:
        kind = record["event"]
        if kind not in {"heartbeat", "heartbeat_error", "callback"}:
            continue
        at = _ts(record)
        window = _window(at, stopped, started)
        status = str(record.get("status") or "no answer")
        table = callbacks if kind == "callback" else heartbeats
        table.setdefault(window, {}).setdefault(status, 0)
        table[window][status] += 1
        if window == "after" and not status.startswith("2"):
            after_errors.append(at - started)
        if kind == "heartbeat":
            acked_beats.setdefault(record["uuid"], []).append(
                (datetime.fromisoformat(record["ts"]).timestamp(), record["disk_used"])
            )
        elif kind == "callback" and str(record.get("status", "")).startswith("2"):
            acked_callbacks[int(record["task_id"])] = bool(record["success"])
    finished = {Task.State.DONE, Task.State.FAILED, Task.State.SKIPPED, Task.State.ORPHANED}
    states = dict(Task.objects.filter(id__in=list(acked_callbacks)).values_list("id", "state"))
    lost_callbacks = [t for t in acked_callbacks if t in states and states[t] not in finished]
    missing_tasks = [t for t in acked_callbacks if t not in states]
    lost_beats = []
    rows = {str(n.uuid): n for n in Node.objects.filter(uuid__in=list(acked_beats))}
    for node_uuid, beats in acked_beats.items():
        last = max(at for at, _ in beats)
        recent = {used for at, used in beats if at >= last - 6}
        row = rows.get(node_uuid)
        seen = row.last_seen_at.timestamp() if row else 0
        if row is None or row.used_bytes not in recent or seen < last - 6:
            lost_beats.append(node_uuid)
    return {
        "heartbeats": heartbeats,
        "callbacks": callbacks,
        "non_2xx_after_restart": len(after_errors),
        "non_2xx_after_restart_within_seconds": round(max(after_errors), 1) if after_errors else 0,
        "acknowledged_callbacks": len(acked_callbacks),
        "lost_callbacks": len(lost_callbacks),
        "callbacks_of_tasks_gone": len(missing_tasks),
        "nodes": len(acked_beats),
        "nodes_whose_last_heartbeat_was_lost": len(lost_beats),
    }


def print_outage(results: dict) -> None:
    print(
        f"\n{results['service']} stopped for {results['outage_seconds']:.0f} s while a move built "
        f"({results['config']['nodes']} nodes heartbeating every 5 s)"
    )
    print("\n| requests | window | answers |")
    print("|---|---|---|")
    for what in ("heartbeats", "callbacks"):
        for window in ("before", "during", "after"):
            answers = results[what].get(window, {})
            text = ", ".join(f"{k}: {v:,}" for k, v in sorted(answers.items())) or "none"
            print(f"| {what} | {window} | {text} |")
    print(
        f"\nnot 2xx after the restart: {results['non_2xx_after_restart']}"
        + (
            f" (all within {results['non_2xx_after_restart_within_seconds']} s)"
            if results["non_2xx_after_restart"]
            else ""
        )
    )
    print(
        f"acknowledged callbacks {results['acknowledged_callbacks']:,}, lost "
        f"{results['lost_callbacks']}; nodes {results['nodes']}, whose last acknowledged "
        f"heartbeat is not in the database {results['nodes_whose_last_heartbeat_was_lost']}"
    )
    state = results["final_state"]
    print(
        f"complete {results['completion_after_restart_seconds']:.0f} s after the restart, "
        f"worker restarts {results['worker_restarts']}: {state_text(state)}; "
        f"invariants broken {len(results['violations'])}"
    )


# ----------------------------------------------------------------------------
# load
# ----------------------------------------------------------------------------


def run_load(args, workdir: Path) -> dict:
    stack = build(args, workdir, nodes=args.nodes, processes=4, bench_endpoints=True)
    from django.db import close_old_connections

    from eviction.models import EvictionDecision
    from tests.invariants import violations
    from zoekt.models import Move, Task

    results: dict = {"mode": "load", "config": {**vars(args), "json": None}}
    try:
        wait_worker_ready(stack)
        ticker = Ticker(args.tick_seconds)
        ticker.start()
        roots = roots_of(args.namespaces, args.projects)
        window_start = time.time()
        waves = Waves(stack, roots, args.wave_size, args.wave_seconds)
        waves.start()
        seconds = args.minutes * 60
        filled = False
        while time.time() - window_start < seconds:
            stack.check_alive()
            if not filled and time.time() - window_start >= seconds * 0.3:
                results["fill zoekt-0"] = fill(stack, args)
                filled = True
            time.sleep(5)
            close_old_connections()
            say(state_text(fleet_state()))
        window_end = time.time()
        say("load window over; stopping the nodes")
        stack.stop_all_nodes()
        close_old_connections()
        events = stack.node_events()
        window = [e for e in events if "latency_ms" in e and window_start <= _ts(e) <= window_end]
        beats = [e for e in window if e["event"].startswith("heartbeat")]
        calls = [e for e in window if e["event"] == "callback"]
        beat_ok = [e["latency_ms"] for e in beats if e["event"] == "heartbeat"]
        call_ok = [e["latency_ms"] for e in calls if str(e.get("status", "")).startswith("2")]
        state = fleet_state()
        results.update(
            {
                "window_seconds": round(window_end - window_start, 1),
                "heartbeats": len(beats),
                "heartbeat_errors": len(beats) - len(beat_ok),
                "heartbeat_p50_ms": percentile(beat_ok, 50),
                "heartbeat_p99_ms": percentile(beat_ok, 99),
                "callbacks": len(calls),
                "callback_errors": len(calls) - len(call_ok),
                "callback_p50_ms": percentile(call_ok, 50),
                "callback_p99_ms": percentile(call_ok, 99),
                "rollouts_enabled": waves.enabled,
                "tasks_done": Task.objects.filter(state=Task.State.DONE).count(),
                "evictions": EvictionDecision.objects.count(),
                "moves_started": Move.objects.count(),
                "moves_done": Move.objects.filter(state=Move.State.DONE).count(),
                "final_state": state,
                "violations": violations(),
            }
        )
        # The ratio, in the same stack (worker still ticking), with the nodes stopped.
        secret = stack.shell_secret.read_text().strip()
        pool = preregister(stack.env["DATABASE_URL"], 20_000)
        rounds: dict[str, list[dict]] = {"ceiling": [], "real": []}
        paths = {
            "ceiling": "/bench/ceiling/{uuid}/heartbeat",
            "real": "/api/v4/internal/search/zoekt/{uuid}/heartbeat",
        }
        for which in ("ceiling", "real", "real", "ceiling"):
            say(f"closed loop: {which}")
            rounds[which].append(closed_loop(stack.base, paths[which], secret, pool, 32, 4, 10))
        ticker.stop()
        rps = {k: sum(r["rps"] for r in v) / len(v) for k, v in rounds.items()}
        results["closed_loop"] = {k: v for k, v in rounds.items()}
        results["real_over_ceiling"] = rps["real"] / rps["ceiling"]
        results["closed_rps"] = rps
    finally:
        stack.close()
    return results


def print_load(results: dict) -> None:
    c = results["config"]
    print(
        f"\n{c['nodes']:,} fake nodes every 5 s for {results['window_seconds']:.0f} s, "
        f"with rollouts, evictions and moves running"
    )
    print("\n| request | sent | errors | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for what in ("heartbeat", "callback"):
        print(
            f"| {what} | {results[what + 's']:,} | {results[what + '_errors']} | "
            f"{results[what + '_p50_ms']:.1f} | {results[what + '_p99_ms']:.1f} |"
        )
    print(
        f"\nnamespaces enabled {results['rollouts_enabled']:,}, tasks done "
        f"{results['tasks_done']:,}, eviction decisions {results['evictions']}, moves "
        f"{results['moves_started']} (done {results['moves_done']}); invariants broken "
        f"{len(results['violations'])}"
    )
    rps = results["closed_rps"]
    print(
        f"closed loop in the same stack: ceiling {rps['ceiling']:.0f} req/s, real "
        f"{rps['real']:.0f} req/s: real at {results['real_over_ceiling']:.0%} of the ceiling"
    )


# ----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("kill", "outage", "load"))
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--down-seconds", type=float, default=1.0, help="worker down per kill")
    parser.add_argument("--kill-every", type=float, default=8.0, help="seconds between kills")
    parser.add_argument("--service", choices=("postgres", "redis"), default="postgres")
    parser.add_argument("--seconds", type=float, default=20.0, help="outage length")
    parser.add_argument("--minutes", type=float, default=10.0, help="load window")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--namespaces", type=int, default=None)
    parser.add_argument("--projects", type=int, default=3, help="projects per namespace")
    parser.add_argument("--wave-size", type=int, default=None)
    parser.add_argument("--wave-seconds", type=float, default=5.0)
    parser.add_argument("--disk-total-gib", type=float, default=None)
    parser.add_argument("--disk-used-gib", type=float, default=None)
    parser.add_argument("--task-delay", type=float, default=None, help="seconds (0.5)")
    parser.add_argument("--task-delay-max", type=float, default=None, help="seconds (2)")
    parser.add_argument(
        "--tick-seconds", type=float, default=None, help="compressed beat (2; load: 15)"
    )
    parser.add_argument("--web-workers", type=int, default=None)
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    defaults = {
        "kill": dict(nodes=5, namespaces=120, wave_size=10, disk_total_gib=1.2, disk_used_gib=0.25),
        # Tasks long enough that callbacks are due while a server is down.
        "outage": dict(
            nodes=50,
            namespaces=300,
            wave_size=300,
            disk_total_gib=0.25,
            disk_used_gib=0.02,
            task_delay=5.0,
            task_delay_max=30.0,
        ),
        # Beat every 15 s, not 2: the jobs run 4x beat's pace, not 30x, beside the nodes.
        "load": dict(
            nodes=1000,
            namespaces=3000,
            wave_size=100,
            disk_total_gib=0.5,
            disk_used_gib=0.1,
            tick_seconds=15.0,
        ),
    }[args.mode]
    defaults.setdefault("web_workers", 4 if args.mode == "load" else 2)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.tick_seconds = 2.0 if args.tick_seconds is None else args.tick_seconds
    args.task_delay = 0.5 if args.task_delay is None else args.task_delay
    args.task_delay_max = 2.0 if args.task_delay_max is None else args.task_delay_max
    workdir = Path(tempfile.mkdtemp(prefix=f"zoekt-faults-{args.mode}-"))
    runner, printer = {
        "kill": (run_kill, print_kill),
        "outage": (run_outage, print_outage),
        "load": (run_load, print_load),
    }[args.mode]
    try:
        results = runner(args, workdir)
    except BaseException:
        print(f"logs kept in {workdir}", file=sys.stderr)
        raise
    printer(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    if args.keep:
        print(f"logs in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if not results.get("violations") else 1


if __name__ == "__main__":
    sys.exit(main())
