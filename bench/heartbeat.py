"""Heartbeat benchmark: the real endpoint beside a floor and a ceiling, then an open loop.

Run it with ``make bench`` (or ``python -m config.devservers exec -- python
bench/heartbeat.py``), which provides PostgreSQL and Redis. It creates a
scratch database ``<name>_bench``, starts gunicorn with the reference
endpoints mounted, and drives it from separate client processes:

(a) closed loop, ``--clients`` concurrent clients (32), each sending the next
    heartbeat as soon as the last one answered, against three endpoints in
    the same server, alternating F-C-R-R-C-F so drift hits all alike:
      floor    the same stack and body validation, no database
      ceiling  one raw-SQL upsert of the node row + one select of its tasks
      real     the heartbeat as nodes use it, with the product's hand-out
               (admission control), and "real (gitlab)" with GitLab's hand-out
               (``zoekt_indexing_admission`` ``gitlab``), the setting switched
               between rounds: F-C-R-G-G-R-C-F
    Each request comes from a different node of a pool large enough that
    every node is seen at most once per 5 s, as in a real fleet, so the real
    heartbeat writes its row every time (no debounce shortcut).
(b) open loop: ``--nodes`` nodes (1,000) each heartbeating every 5 s on a
    fixed schedule (200 requests/s) for ``--open-seconds`` (120). Latency is
    measured from each request's scheduled time, so a stall shows up in the
    percentiles instead of silently lowering the rate.

The results are printed as a Markdown table and written as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jwt
import psycopg
import requests

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scratch import recreate_database, scratch_database_url  # noqa: E402

GIB = 1024**3


# ----------------------------------------------------------------------------
# Bodies and tokens, as a node builds them
# ----------------------------------------------------------------------------


def node_body(i: int) -> dict:
    used = (20 + i % 50) * GIB
    return {
        "node.url": f"http://zoekt-{i}.zoekt:6065",
        "node.search_url": f"http://zoekt-{i}.zoekt:6070",
        "node.name": f"zoekt-{i}",
        "node.version": "v1.16.2",
        "node.schema_version": 2531,
        "node.concurrency": 8,
        "node.task_count": 0,
        "node.services": ["zoekt"],
        "disk.all": 200 * GIB,
        "disk.used": used,
        "disk.indexed": used // 2,
        "process_health": {
            "indexer": {
                "rss_bytes": 512 * 1024**2,
                "mmap_current": 200,
                "mmap_max": 262144,
                "restarts_1m": 0,
                "restarts_5m": 0,
                "restarts_15m": 0,
                "uptime_seconds": 86400,
            },
            "webserver": {
                "rss_bytes": (4 + i % 32) * GIB,
                "mmap_current": 12000 + i,
                "mmap_max": 262144,
                "restarts_1m": 0,
                "restarts_5m": 0,
                "restarts_15m": 0,
                "uptime_seconds": 86400,
                "shards_loaded": 100 + i % 400,
            },
        },
    }


class Tokens:
    """A fresh token every 20 s, as a node re-signs well inside the 60 s lifetime."""

    def __init__(self, secret: str):
        self.secret = secret
        self.token = ""
        self.at = 0.0

    def get(self) -> str:
        now = time.time()
        if now - self.at > 20:
            self.token = jwt.encode(
                {"iss": "gitlab-shell", "iat": int(now), "exp": int(now) + 60},
                self.secret,
                algorithm="HS256",
            )
            self.at = now
        return self.token


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# ----------------------------------------------------------------------------
# Closed loop
# ----------------------------------------------------------------------------


def _closed_worker(args) -> dict:
    base, path, secret, uuids, offset, stride, threads, seconds = args
    tokens = Tokens(secret)
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]
    bodies = [json.dumps(node_body(i)) for i in range(64)]
    deadline = time.perf_counter() + seconds

    def loop(thread_index: int) -> None:
        session = requests.Session()
        position = offset + thread_index
        mine: list[float] = []
        failed = 0
        while time.perf_counter() < deadline:
            node = uuids[position % len(uuids)]
            position += stride
            started = time.perf_counter()
            try:
                response = session.post(
                    f"{base}{path.format(uuid=node)}",
                    data=bodies[position % len(bodies)],
                    headers={
                        "Content-Type": "application/json",
                        "Gitlab-Shell-Api-Request": tokens.get(),
                    },
                    timeout=10,
                )
                if response.status_code != 200:
                    failed += 1
            except requests.RequestException:
                failed += 1
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)
            errors[0] += failed

    pool = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return {"latencies": latencies, "errors": errors[0]}


def closed_loop(base, path, secret, uuids, clients, processes, seconds) -> dict:
    threads = clients // processes
    jobs = [
        (base, path, secret, uuids, p * threads, clients, threads, seconds)
        for p in range(processes)
    ]
    started = time.perf_counter()
    with mp.get_context("spawn").Pool(processes) as pool:
        results = pool.map(_closed_worker, jobs)
    elapsed = time.perf_counter() - started
    latencies = [x for r in results for x in r["latencies"]]
    return {
        "requests": len(latencies),
        "errors": sum(r["errors"] for r in results),
        "seconds": seconds,
        "rps": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "wall_seconds": elapsed,
    }


# ----------------------------------------------------------------------------
# Open loop
# ----------------------------------------------------------------------------


def _open_worker(args) -> dict:
    base, secret, nodes, interval, seconds, start_at = args
    tokens = Tokens(secret)
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]
    sessions = threading.local()

    def send(node_uuid: str, index: int, scheduled: float) -> None:
        lag = time.time() - scheduled
        session = getattr(sessions, "session", None)
        if session is None:
            session = sessions.session = requests.Session()
        ok = False
        try:
            response = session.post(
                f"{base}/api/v4/internal/search/zoekt/{node_uuid}/heartbeat",
                json=node_body(index),
                headers={"Gitlab-Shell-Api-Request": tokens.get()},
                timeout=10,
            )
            ok = response.status_code == 200
        except requests.RequestException:
            ok = False
        latency = time.time() - scheduled
        with lock:
            latencies.append((scheduled - start_at, latency, lag))
            if not ok:
                errors[0] += 1

    schedule = []
    for node_uuid, index, phase in nodes:
        t = start_at + phase
        while t < start_at + seconds:
            schedule.append((t, node_uuid, index))
            t += interval
    schedule.sort()
    with ThreadPoolExecutor(max_workers=64) as executor:
        for scheduled, node_uuid, index in schedule:
            delay = scheduled - time.time()
            if delay > 0:
                time.sleep(delay)
            executor.submit(send, node_uuid, index, scheduled)
    return {"latencies": latencies, "errors": errors[0], "scheduled": len(schedule)}


def open_loop(base, secret, uuids, interval, seconds, processes) -> dict:
    start_at = time.time() + 2.0
    count = len(uuids)
    nodes = [(u, i, interval * i / count) for i, u in enumerate(uuids)]
    jobs = [
        (base, secret, nodes[p::processes], interval, seconds, start_at) for p in range(processes)
    ]
    with mp.get_context("spawn").Pool(processes) as pool:
        results = pool.map(_open_worker, jobs)
    timed = [x for r in results for x in r["latencies"]]
    latencies = [latency for _at, latency, _lag in timed]
    lags = [lag for _at, _latency, lag in timed]
    return {
        "nodes": count,
        "interval_seconds": interval,
        "target_rps": count / interval,
        "scheduled": sum(r["scheduled"] for r in results),
        "requests": len(latencies),
        "errors": sum(r["errors"] for r in results),
        "seconds": seconds,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "max_ms": max(latencies) * 1000 if latencies else float("nan"),
        # How late the client itself started a request (no thread free, or no CPU): part of
        # the latency that is the load generator's, on a machine it shares with the server.
        "client_lag_p99_ms": percentile(lags, 99) * 1000,
        "windows": latency_windows(
            [(at, latency) for at, latency, _lag in timed], OPEN_WINDOW_SECONDS
        ),
    }


#: The open loop's latency is also given per window of scheduled time, so steady queueing
#: (every window alike) and a stall (one window) can be told apart.
OPEN_WINDOW_SECONDS = 10


def latency_windows(timed: list[tuple[float, float]], width: float) -> list[dict]:
    """Per ``width`` seconds of scheduled time: requests, p50, p99, and the share over 100 ms."""
    buckets: dict[int, list[float]] = {}
    for at, latency in timed:
        buckets.setdefault(int(at // width), []).append(latency)
    return [
        {
            "from_s": key * width,
            "requests": len(values),
            "p50_ms": percentile(values, 50) * 1000,
            "p99_ms": percentile(values, 99) * 1000,
            "over_100ms": sum(1 for v in values if v > 0.1) / len(values),
        }
        for key, values in sorted(buckets.items())
    ]


# ----------------------------------------------------------------------------
# The server under test
# ----------------------------------------------------------------------------


def preregister(url: str, count: int) -> list[str]:
    """Insert the node pool directly; their rows are old enough to be written on first sight."""
    uuids = [str(uuid.uuid4()) for _ in range(count)]
    with (
        psycopg.connect(url) as conn,
        conn.cursor() as cursor,
        cursor.copy(
            "COPY zoekt_nodes (uuid, index_base_url, search_base_url, metadata, created_at, "
            "updated_at) FROM STDIN"
        ) as copy,
    ):
        for i, node_uuid in enumerate(uuids):
            copy.write_row(
                (
                    node_uuid,
                    f"http://zoekt-{i}:6065",
                    f"http://zoekt-{i}:6070",
                    json.dumps({"name": f"zoekt-{i}"}),
                    "2000-01-01T00:00:00Z",
                    "2000-01-01T00:00:00Z",
                )
            )
    return uuids


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(env: dict, port: int, workers: int, log: Path | None = None) -> subprocess.Popen:
    output = None if log is None else log.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=output,
        stderr=output,
        start_new_session=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/-/health", timeout=1).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            raise RuntimeError("gunicorn exited during start-up")
        time.sleep(0.2)
    raise RuntimeError("gunicorn did not become healthy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0, help="per closed-loop round")
    parser.add_argument("--pool", type=int, default=20000, help="nodes in the closed-loop pool")
    parser.add_argument("--nodes", type=int, default=1000, help="open-loop nodes")
    parser.add_argument("--interval", type=float, default=5.0, help="open-loop pull interval")
    parser.add_argument("--open-seconds", type=float, default=120.0)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn workers")
    parser.add_argument("--skip-open", action="store_true")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--skip-gitlab", action="store_true", help="leave out the rounds with GitLab's hand-out"
    )
    args = parser.parse_args()

    url, name = scratch_database_url(os.environ["DATABASE_URL"], "bench")
    print(f"scratch database {name}", file=sys.stderr)
    recreate_database(url, name)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "ZOEKT_BENCH_ENDPOINTS": "1",
        "LOG_LEVEL": "WARNING",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    secret_file = env["GITLAB_SHELL_SECRET_FILE"].split(",")[0]
    secret = Path(secret_file).read_text().rstrip("\r\n")
    pool = preregister(url, args.pool)
    open_nodes = preregister(url, args.nodes)
    port = free_port()
    server = start_server(env, port, args.workers)
    base = f"http://127.0.0.1:{port}"
    paths = {
        "floor": "/bench/floor/{uuid}/heartbeat",
        "ceiling": "/bench/ceiling/{uuid}/heartbeat",
        "real": "/api/v4/internal/search/zoekt/{uuid}/heartbeat",
        "real (gitlab)": "/api/v4/internal/search/zoekt/{uuid}/heartbeat",
    }
    order = ["floor", "ceiling", "real", "real (gitlab)"]
    if args.skip_gitlab:
        order.remove("real (gitlab)")
        del paths["real (gitlab)"]
    mode = "admission"

    def hand_out(wanted: str) -> None:
        """Switch the hand-out for the rounds that follow (the save drops the cached copies;
        the server's workers hold theirs for a second)."""
        nonlocal mode
        if wanted == mode:
            return
        subprocess.run(
            [
                sys.executable,
                "manage.py",
                "shell",
                "-c",
                "from zoekt import app_settings; "
                f"app_settings.update(zoekt_indexing_admission={wanted!r})",
            ],
            cwd=ROOT,
            env=env,
            check=True,
        )
        time.sleep(2)
        mode = wanted

    results: dict = {"closed": {k: [] for k in paths}, "config": vars(args) | {"json": None}}
    try:
        closed_loop(base, paths["floor"], secret, pool, args.clients, args.client_processes, 3)
        for which in order + order[::-1]:
            hand_out("gitlab" if which == "real (gitlab)" else "admission")
            print(f"closed loop: {which} for {args.seconds:.0f} s", file=sys.stderr)
            results["closed"][which].append(
                closed_loop(
                    base,
                    paths[which],
                    secret,
                    pool,
                    args.clients,
                    args.client_processes,
                    args.seconds,
                )
            )
        if not args.skip_open:
            print(
                f"open loop: {args.nodes} nodes every {args.interval:g} s for "
                f"{args.open_seconds:.0f} s",
                file=sys.stderr,
            )
            results["open"] = open_loop(
                base, secret, open_nodes, args.interval, args.open_seconds, args.client_processes
            )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)

    summary = {}
    for which, rounds in results["closed"].items():
        summary[which] = {
            "rps": statistics.mean(r["rps"] for r in rounds),
            "p50_ms": statistics.mean(r["p50_ms"] for r in rounds),
            "p99_ms": statistics.mean(r["p99_ms"] for r in rounds),
            "errors": sum(r["errors"] for r in rounds),
            "requests": sum(r["requests"] for r in rounds),
        }
    results["summary"] = summary
    ceiling = summary["ceiling"]["rps"]
    print("\n| endpoint | requests/s | p50 ms | p99 ms | errors | of ceiling |")
    print("|---|---:|---:|---:|---:|---:|")
    for which in order:
        s = summary[which]
        print(
            f"| {which} | {s['rps']:.0f} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} | "
            f"{s['errors']} | {s['rps'] / ceiling:.0%} |"
        )
    if "open" in results:
        o = results["open"]
        print(
            f"\nopen loop: {o['nodes']} nodes every {o['interval_seconds']:g} s "
            f"({o['target_rps']:.0f} req/s) for {o['seconds']:.0f} s: {o['requests']} requests "
            f"of {o['scheduled']} scheduled, {o['errors']} errors, p50 {o['p50_ms']:.1f} ms, "
            f"p99 {o['p99_ms']:.1f} ms, max {o['max_ms']:.1f} ms; the clients' own lag "
            f"before sending, p99 {o['client_lag_p99_ms']:.1f} ms"
        )
        print(
            f"per {OPEN_WINDOW_SECONDS} s, p99 ms (share over 100 ms): "
            + ", ".join(f"{w['p99_ms']:.0f} ({w['over_100ms']:.0%})" for w in o["windows"])
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
