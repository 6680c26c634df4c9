"""Lifecycle benchmark: namespaces and projects from enable to all ready, on fake nodes.

Run it with ``python -m config.devservers exec -- .venv/bin/python bench/lifecycle.py``
(which provides PostgreSQL and Redis) or with ``DATABASE_URL`` and
``REDIS_URL`` set. Defaults: 1,000 namespaces of 50 projects each (50,000
projects) on 10 fake nodes; ``--namespaces``, ``--projects-per-namespace``
and ``--nodes`` scale it down.

Everything runs as in production, on one machine:

* a scratch database ``<name>_lifecycle``, migrated;
* gunicorn serving the real API (``--workers``);
* one Celery worker (``--worker-concurrency``) on a queue of its own;
* the fake nodes (``simulator.fakenode``) in one process, heartbeating and
  calling back over HTTP, each with ``--node-concurrency`` task slots;
* this process as the operator and as beat: it loads the catalog through
  ``POST /api/v1/catalog/bulk_upsert``, enables every namespace through
  ``PUT /api/v4/admin/zoekt/shards/0/indexed_namespaces/<id>``, and then,
  every ``--tick-seconds`` while the worker's queue is short, sends what beat
  sends: ``zoekt.rollout`` and one ``zoekt.run_scheduled_task`` per scheduled
  task, with the throttles bypassed (beat ticks once a minute; the benchmark
  compresses time, not work).

Both hand-outs run in one invocation, one after the other from an empty
scratch database (``--modes``, default ``gitlab,admission``: the setting
``zoekt_indexing_admission``), each in a process of its own, and a table
compares them at the end. In the ``gitlab`` mode initial indexing takes one
pending index per node per tick (GitLab's limit), so the tick rate bounds that
phase; admission control starts pending indices as the nodes' queues drain.

The clock starts at the first enable and stops when every namespace has a
ready replica (every index ready, every repository ready). It prints the wall
time, the phases (all enabled, all rolled out, all repositories created, all
indexed, all ready), the tasks done and tasks per second (over the wall time,
and over the indexing span: first task created to last task done), and
writes JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench.heartbeat import free_port, start_server  # noqa: E402
from bench.scratch import recreate_database, scratch_database_url  # noqa: E402

KIB = 1024
MIB = 1024**2
# Rows per table per catalog request. The API takes 10,000, but such a body is past Django's
# DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB), which answers 400; 4,000 rows stay under it.
CATALOG_ROWS = 4_000


def repository_size(project_id: int) -> int:
    """Planned Gitaly size of a project: 512 KiB to 4.5 MiB, fixed per id."""
    digest = hashlib.sha256(f"bench-project-{project_id}".encode()).digest()
    return 512 * KIB + int.from_bytes(digest[:4], "big") % (4 * MIB)


def catalog_batches(namespaces: int, projects_per_namespace: int, first_id: int):
    """Catalog requests: whole root namespaces with their projects, under the row limit."""
    per_batch = max(1, CATALOG_ROWS // (projects_per_namespace + 1))
    roots = []
    for r in range(namespaces):
        roots.append(first_id + r * (projects_per_namespace + 1))
    for start in range(0, len(roots), per_batch):
        ns_rows, project_rows, stat_rows = [], [], []
        for root in roots[start : start + per_batch]:
            ns_rows.append(_ns(root, None, "Group"))
            for k in range(projects_per_namespace):
                pn = root + 1 + k
                ns_rows.append(_ns(pn, root, "Project"))
                project_rows.append(_project(pn, root, pn))
                size = repository_size(pn)
                stat_rows.append({"project_id": pn, "repository_size": size, "storage_size": size})
        yield {"namespaces": ns_rows, "projects": project_rows, "project_statistics": stat_rows}


def _ns(nid: int, parent: int | None, kind: str) -> dict:
    return {
        "id": nid,
        "name": f"ns {nid}",
        "path": f"ns-{nid}",
        "type": kind,
        "parent_id": parent,
        "visibility_level": 20,
        "archived": False,
    }


def _project(pid: int, namespace_id: int, project_namespace_id: int) -> dict:
    return {
        "id": pid,
        "name": f"project {pid}",
        "path": f"project-{pid}",
        "namespace_id": namespace_id,
        "project_namespace_id": project_namespace_id,
        "visibility_level": 20,
        "archived": False,
        "repository_storage": "default",
        "repository_access_level": 20,
        "forked_from_project_id": None,
    }


def drop_database(url: str, name: str) -> None:
    admin = urlunsplit(urlsplit(url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def spawn(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def worker_argv(concurrency: int, queue: str) -> list[str]:
    """One Celery worker of the benchmarks: prefork, on one queue, no gossip."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "--loglevel",
        "INFO",
        "--pool",
        "prefork",
        "--concurrency",
        str(concurrency),
        "-Q",
        queue,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


def cpu_seconds(procs: dict[str, subprocess.Popen]) -> dict[str, float]:
    """CPU seconds (user and system) used so far by each part of the stack: the processes
    the benchmark started, with their children, PostgreSQL's and Redis's processes, and
    the benchmark itself (the operator and beat)."""
    import psutil

    def times(process: psutil.Process, *fields: str) -> float:
        try:
            measured = process.cpu_times()
        except psutil.Error:
            return 0.0
        return sum(getattr(measured, field) for field in fields)

    def used(process: psutil.Process) -> float:
        return times(process, "user", "system")

    def reaped(process: psutil.Process) -> float:
        """What the process's children that have exited used (PostgreSQL's backends)."""
        return times(process, "children_user", "children_system")

    def tree(pid: int) -> list[psutil.Process]:
        try:
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    seconds = {label: sum(used(p) for p in tree(proc.pid)) for label, proc in procs.items()}
    for label, name in (("postgres", "postgres"), ("redis", "redis-server")):
        group = [p for p in psutil.process_iter(["name", "ppid"]) if p.info["name"] == name]
        pids = {p.pid for p in group}
        seconds[label] = sum(used(p) for p in group) + sum(
            reaped(p) for p in group if p.info["ppid"] not in pids
        )
    seconds["bench"] = used(psutil.Process())
    return seconds


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespaces", type=int, default=1_000)
    parser.add_argument("--projects-per-namespace", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--node-concurrency", type=int, default=20, help="task slots per node")
    parser.add_argument("--task-delay", type=float, default=0.0, help="seconds per task")
    parser.add_argument("--workers", type=int, default=3, help="gunicorn workers")
    parser.add_argument("--worker-concurrency", type=int, default=2, help="Celery processes")
    parser.add_argument("--tick-seconds", type=float, default=1.0, help="beat tick, compressed")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after (s)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database and logs")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--modes",
        default="gitlab,admission",
        help="the hand-outs to compare (zoekt_indexing_admission), one run each",
    )
    parser.add_argument("--mode", choices=("gitlab", "admission"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode is None:
        return compare(args)
    return run_mode(args)


def compare(args: argparse.Namespace) -> int:
    """One run per mode, each in its own process, then one table."""
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    runs = {}
    argv = []
    for key in (
        "namespaces",
        "projects_per_namespace",
        "nodes",
        "node_concurrency",
        "task_delay",
        "workers",
        "worker_concurrency",
        "tick_seconds",
        "timeout",
    ):
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    if args.keep:
        argv.append("--keep")
    for mode in modes:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
            path = Path(out.name)
        print(f"=== hand-out {mode} ===", file=sys.stderr)
        subprocess.run(
            [sys.executable, __file__, *argv, "--mode", mode, "--json", str(path)],
            check=True,
        )
        runs[mode] = json.loads(path.read_text())
        path.unlink()
    print()
    print(
        "| hand-out | enable → all ready | all repositories created | all indexed "
        "| tasks done | tasks/s (wall) | ticks |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, r in runs.items():
        phases = r["phases_seconds"]
        print(
            f"| {mode} | {r['wall_seconds']:.1f} s | {phases.get('repositories_created', 0):.1f} s "
            f"| {phases.get('indexed', 0):.1f} s | {r['tasks_done']:,} "
            f"| {r['tasks_per_second']:.0f} | {r['ticks']} |"
        )
    print()
    labels = sorted({k for r in runs.values() for k in r.get("cpu_seconds", {})})
    print("| hand-out | " + " | ".join(f"CPU s: {k}" for k in labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for mode, r in runs.items():
        cpu = r.get("cpu_seconds", {})
        print(f"| {mode} | " + " | ".join(f"{cpu.get(k, 0):.0f}" for k in labels) + " |")
    if {"gitlab", "admission"} <= runs.keys():
        ratio = runs["gitlab"]["wall_seconds"] / runs["admission"]["wall_seconds"]
        print(f"\nenable → all ready, GitLab's rule ÷ admission control: {ratio:.2f}×")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2, default=str))
    return 0


def run_mode(args: argparse.Namespace) -> int:
    """One run of the lifecycle with the hand-out ``args.mode``."""
    url, name = scratch_database_url(os.environ["DATABASE_URL"], "lifecycle")
    print(f"scratch database {name}", file=sys.stderr)
    recreate_database(url, name)
    queue = f"bench-lifecycle-{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-lifecycle-"))
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "CELERY_QUEUE": queue,
        "LOG_LEVEL": "WARNING",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    env.pop("ZOEKT_CLOCK_OFFSET_SECONDS", None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    os.environ.update({k: v for k, v in env.items() if k != "LOG_LEVEL"})
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db.models import Max, Min
    from rest_framework.authtoken.models import Token

    from config.celery import app as celery_app
    from zoekt import app_settings
    from zoekt.models import EnabledNamespace, Node, Replica, Repository, Task
    from zoekt.scheduling.service import TASKS

    row = app_settings.load_row()
    row.zoekt_indexing_enabled = True
    row.zoekt_search_enabled = True
    row.zoekt_indexing_admission = args.mode
    row.save()
    user = get_user_model().objects.create_user("bench", password=uuid.uuid4().hex, is_staff=True)
    token = Token.objects.create(user=user).key
    secret_file = env["GITLAB_SHELL_SECRET_FILE"].split(",")[0]

    procs: dict[str, subprocess.Popen] = {}
    results: dict = {"config": {**vars(args), "json": None}}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    try:
        procs["gunicorn"] = start_server(env, port, args.workers)

        started = time.perf_counter()
        projects_total = args.namespaces * args.projects_per_namespace
        for body in catalog_batches(args.namespaces, args.projects_per_namespace, 1_000_000):
            reply = session.post(f"{base}/api/v1/catalog/bulk_upsert", json=body, timeout=600)
            if reply.status_code != 200:
                raise RuntimeError(f"catalog: {reply.status_code} {reply.text[:2000]}")
        results["catalog_seconds"] = time.perf_counter() - started
        print(f"catalog loaded in {results['catalog_seconds']:.1f} s", file=sys.stderr)

        procs["nodes"] = spawn(
            [
                sys.executable,
                "-m",
                "simulator.fakenode",
                "--url",
                base,
                "--secret-file",
                secret_file,
                "--count",
                str(args.nodes),
                "--concurrency",
                str(args.node_concurrency),
                "--delay",
                str(args.task_delay),
                "--state-dir",
                str(workdir / "nodes"),
            ],
            env,
            workdir / "nodes.log",
        )
        deadline = time.monotonic() + 60
        while Node.objects.online().count() < args.nodes:
            if time.monotonic() > deadline:
                raise RuntimeError("the fake nodes did not register")
            time.sleep(0.2)
        procs["worker"] = spawn(
            worker_argv(args.worker_concurrency, queue),
            {**env, "LOG_LEVEL": "INFO"},
            workdir / "worker.log",
        )

        broker = celery_app.connection_for_write()
        channel = broker.default_channel
        redis = channel.client

        def send_tick() -> None:
            celery_app.send_task("zoekt.rollout", queue=queue)
            for task in TASKS:
                celery_app.send_task(
                    "zoekt.run_scheduled_task",
                    args=(task,),
                    kwargs={"bypass_throttle": True},
                    queue=queue,
                )

        # --- the clock starts: enable every namespace through the operator API ------------
        t0 = time.perf_counter()
        roots = [1_000_000 + r * (args.projects_per_namespace + 1) for r in range(args.namespaces)]

        def enable(root: int) -> None:
            reply = session.put(
                f"{base}/api/v4/admin/zoekt/shards/0/indexed_namespaces/{root}", timeout=60
            )
            reply.raise_for_status()

        cpu_at_start = cpu_seconds(procs)
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(enable, roots))
        phases = {"enabled": time.perf_counter() - t0}
        print(f"enabled {len(roots)} namespaces in {phases['enabled']:.1f} s", file=sys.stderr)

        ticks = 0
        last_tick = 0.0
        last_report = 0.0
        done_at = None
        while time.perf_counter() - t0 < args.timeout:
            now = time.perf_counter()
            if now - last_tick >= args.tick_seconds and redis.llen(queue) < 2 * len(TASKS):
                send_tick()
                ticks += 1
                last_tick = now
            if now - last_report >= 2.0:
                last_report = now
                elapsed = now - t0
                replicas = Replica.objects.count()
                ready = Replica.objects.filter(state=Replica.State.READY).count()
                repositories = Repository.objects.count()
                indexed = Repository.objects.filter(state=Repository.State.READY).count()
                rolled_out = (
                    EnabledNamespace.objects.filter(replicas__isnull=False).distinct().count()
                )
                if "rolled_out" not in phases and rolled_out >= args.namespaces:
                    phases["rolled_out"] = elapsed
                if "repositories_created" not in phases and repositories >= projects_total:
                    phases["repositories_created"] = elapsed
                if "indexed" not in phases and indexed >= projects_total:
                    phases["indexed"] = elapsed
                print(
                    f"{elapsed:7.1f} s  ticks {ticks:4d}  replicas {replicas}/{args.namespaces} "
                    f"(ready {ready})  repositories {repositories}/{projects_total} "
                    f"(ready {indexed})",
                    file=sys.stderr,
                )
                if ready >= args.namespaces and indexed >= projects_total:
                    done_at = elapsed
                    phases["ready"] = elapsed
                    break
                for label, proc in procs.items():
                    if proc.poll() is not None:
                        raise RuntimeError(f"{label} exited (see {workdir})")
            time.sleep(0.05)
        if done_at is None:
            raise RuntimeError(f"not all ready after {args.timeout:.0f} s (see {workdir})")
        cpu_at_end = cpu_seconds(procs)
        cpu = {k: cpu_at_end.get(k, 0.0) - cpu_at_start.get(k, 0.0) for k in cpu_at_end}

        done = Task.objects.filter(state=Task.State.DONE)
        tasks_done = done.count()
        tasks_total = Task.objects.count()
        span = done.aggregate(first=Min("created_at"), last=Max("updated_at"))
        span_seconds = (span["last"] - span["first"]).total_seconds() if tasks_done else 0.0
        log_lines = (workdir / "worker.log").read_text(errors="replace").splitlines()
        jobs = {
            kind: sum(1 for line in log_lines if f'"event": "{kind}"' in line)
            for kind in ("scheduled_task", "scheduling_event", "rollout")
        }
        results.update(
            {
                "wall_seconds": done_at,
                "phases_seconds": phases,
                "ticks": ticks,
                "namespaces": args.namespaces,
                "projects": projects_total,
                "nodes": args.nodes,
                "tasks_done": tasks_done,
                "tasks_total": tasks_total,
                "tasks_per_second": tasks_done / done_at,
                "indexing_span_seconds": span_seconds,
                "tasks_per_second_indexing_span": tasks_done / span_seconds if span_seconds else 0,
                "job_runs": jobs,
                "cpu_seconds": cpu,
            }
        )
        print(
            f"\n{args.namespaces:,} namespaces, {projects_total:,} projects, {args.nodes} nodes: "
            f"enable to all ready in {done_at:.1f} s; {tasks_done:,} tasks done, "
            f"{tasks_done / done_at:.0f} tasks/s over the wall time, "
            f"{results['tasks_per_second_indexing_span']:.0f} tasks/s over the indexing span "
            f"({span_seconds:.1f} s); {ticks} ticks"
        )
        print(
            "phases (s from the first enable): "
            + json.dumps({k: round(v, 1) for k, v in phases.items()})
        )
        print("job runs logged by the worker: " + json.dumps(jobs))
        print(
            "CPU seconds from enable to all ready: "
            + json.dumps({k: round(v) for k, v in cpu.items()})
        )
    finally:
        session.close()
        for label in ("nodes", "worker", "gunicorn"):
            stop(procs.get(label))
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_database(url, name)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    print(f"logs in {workdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
