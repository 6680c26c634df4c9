"""A fake Zoekt node speaking GitLab's node protocol over HTTP (reference 3.1–3.4, 7.2–7.5).

One ``FakeNode`` behaves as a ``gitlab-zoekt-indexer`` does towards GitLab:

* its uuid lives in ``<state_dir>/<name>.uuid``, created on first start and
  reused afterwards, so a restarted node is the same row on the server;
* what it holds (each repository's index bytes, index files and root
  namespace) lives in ``<state_dir>/<name>.holdings.json`` next to it, so a
  restarted node holds, reports and is sized by what it indexed before
  (``save_holdings``: written atomically, at most every
  ``holdings_save_interval`` seconds while it changes, and on ``stop()``;
  loaded on start when it names the node's uuid);
* every request carries a fresh HS256 JWT (``iss`` ``gitlab-shell``, ``iat``,
  ``exp`` 60 s later) in the ``Gitlab-Shell-Api-Request`` header, signed with
  the GitLab Shell secret read from a file;
* a heartbeat posts GitLab's literally dotted keys (``node.url``,
  ``disk.used``, ...) plus ``process_health``; the reply is followed:
  ``truncate`` wipes the repositories held, ``stop_indexing`` stops new index
  tasks (delete tasks still run), ``pull_frequency`` (a Go duration such as
  ``"5s"`` or ``"500ms"``) sets the time to the next heartbeat;
* handed tasks are de-duplicated by task id: the server re-sends a
  ``processing`` task on every heartbeat until its callback arrives, so a task
  that is running, or whose result was already reported, is not run again. A
  task whose *failure* was reported is run again when a heartbeat sent after
  that report offers it once more (that is the server's retry);
* each accepted task runs after its delay, succeeds with probability
  ``success_rate`` (drawn from a seeded ``random.Random`` when the task is
  accepted, so outcomes do not depend on thread timing), changes the
  repositories held and is reported to ``/callback``. A callback the server
  did not receive (network error, 5xx) is posted again before the next
  heartbeat.

Disk and memory follow a small model: ``disk.indexed`` is the sum of the
repositories held, ``disk.used`` is a base plus that, and the webserver's RSS
is a base plus ``k`` × the indexed bytes, with ``shards_loaded`` the number of
repositories held; ``index_bytes_built`` counts the bytes of index the node's
successful index tasks wrote since it started. Two optional hooks of
``FakeNodeConfig`` replace the models (see ``simulator.models``):
``disk_model`` (a ``DiskModel``: deletions freed after a delay, injected
spikes) and ``namespace_memory`` (a ``NamespaceMemoryModel``: RSS from shards
loaded and the hotness of the namespaces held).

An operator (``manage.py zoekt_demo_incident``) can change what a running
node reports without restarting it: ``<state_dir>/<name>.override.json``, a
``NodeOverride``, is read again on every heartbeat when it changed. It adds
other files to the disk (``extra_disk_bytes``, until a wall-clock time when
``until`` is set: a transient spike clears by itself) and resident memory to
namespaces the node holds (``extra_rss_bytes``, by root namespace id: it
leaves with the namespace). No file, or one that does not parse, changes
nothing.

Tasks are instant by default. With ``indexing_bytes_per_second`` set, the
deterministic ``step()`` mode gives them time on the node's clock (a replay's
simulated one): an index task takes its index bytes ÷ that rate, a delete a
small fixed time, ``concurrency`` at a time with the rest in a FIFO queue.

Nothing here imports Django or the rest of the project: only the standard
library and PyJWT. Run ``python -m simulator.fakenode --help`` for the CLI.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import heapq
import http.client
import json
import math
import os
import random
import re
import signal
import sys
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jwt

from simulator.models import DiskModel, NamespaceMemoryModel, ZipfHotness

HEADER = "Gitlab-Shell-Api-Request"
ISSUER = "gitlab-shell"
ALGORITHM = "HS256"
TOKEN_LIFETIME_SECONDS = 60
API_PREFIX = "/api/v4/internal/search/zoekt"

DEFAULT_VERSION = "v1.16.2"
DEFAULT_SCHEMA_VERSION = 2531
DEFAULT_PULL_FREQUENCY = "5s"
DEFAULT_FAILURE_ERROR = "simulated indexing failure"

KIB = 1024
MIB = 1024**2
GIB = 1024**3

# How many reported task ids are remembered for de-duplication.
REPORTED_MEMORY = 100_000

# The holdings file's format; a file of another format is not loaded.
HOLDINGS_FORMAT = 1


# --- Go durations -----------------------------------------------------------------


_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,  # Go accepts both the micro sign and the Greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_go_duration(text: str) -> float:
    """Seconds in a Go ``time.ParseDuration`` string: ``"500ms"``, ``"5s"``, ``"1h30m"``, ``"0"``.

    Raises ``ValueError`` for anything Go would refuse (a number without a
    unit, an unknown unit, an empty string).
    """
    if not isinstance(text, str):
        raise ValueError(f"duration must be a string, not {type(text).__name__}")
    rest = text.strip()
    sign = 1.0
    if rest[:1] in {"+", "-"}:
        sign = -1.0 if rest[0] == "-" else 1.0
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    position = 0
    while position < len(rest):
        match = _GO_DURATION_PART.match(rest, position)
        if match is None:
            raise ValueError(f"invalid duration {text!r}")
        total += float(match.group(1)) * _GO_DURATION_UNITS[match.group(2)]
        position = match.end()
    return sign * total


# --- models of what a node holds -------------------------------------------------------


def default_index_size(repo_id: int) -> int:
    """Bytes written when indexing ``repo_id``: 256 KiB to ~8.25 MiB, fixed per id."""
    digest = hashlib.sha256(f"zoekt-repo-{repo_id}".encode()).digest()
    return 256 * KIB + int.from_bytes(digest[:4], "big") % (8 * MIB)


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    """How ``process_health`` follows what the node holds.

    The webserver's RSS is ``webserver_base_rss_bytes`` plus
    ``webserver_rss_per_indexed_byte`` × the indexed bytes (Zoekt maps its
    shards), ``shards_loaded`` is the number of repositories held and
    ``mmap_current`` grows by ``mmaps_per_index_file`` per index file. The
    indexer's RSS grows with the tasks it is running. Both processes report
    GitLab's ``process_metrics`` keys: ``restarts_1m``, ``restarts_5m`` and
    ``restarts_15m`` are 0 (a fake process never restarts) and
    ``uptime_seconds`` is whole seconds since the node started.
    """

    webserver_base_rss_bytes: int = 200 * MIB
    webserver_rss_per_indexed_byte: float = 0.3
    webserver_mmap_base: int = 500
    mmaps_per_index_file: int = 4
    mmap_max: int = 262_144
    indexer_base_rss_bytes: int = 100 * MIB
    indexer_rss_per_running_task_bytes: int = 50 * MIB
    indexer_mmap_base: int = 200
    memory_limit_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class NodeOverride:
    """What an operator adds to a running node's report: ``<name>.override.json``.

    ``extra_disk_bytes`` are other files on the node's disk (a temporary clone,
    a log that grew), counted in ``disk.used`` until the wall-clock time
    ``until`` (seconds since the epoch; None: until the file changes).
    ``extra_rss_bytes`` maps a root namespace id to resident bytes the
    webserver holds for it besides the memory model's, counted only while the
    node holds an index of that namespace. ``note`` says who wrote it and why.
    """

    extra_disk_bytes: int = 0
    until: float | None = None
    extra_rss_bytes: dict[int, int] = dataclasses.field(default_factory=dict)
    note: str = ""

    def disk_bytes(self, now: float) -> int:
        """The extra disk bytes at wall-clock time ``now`` (0 once ``until`` passed)."""
        if self.until is not None and now >= self.until:
            return 0
        return self.extra_disk_bytes

    def rss_bytes(self, held_namespaces) -> int:
        """The extra resident bytes of the namespaces in ``held_namespaces``."""
        return sum(size for ns, size in self.extra_rss_bytes.items() if ns in held_namespaces)

    def to_json(self) -> dict:
        return {
            "extra_disk_bytes": self.extra_disk_bytes,
            "until": self.until,
            "extra_rss_bytes": {str(ns): size for ns, size in self.extra_rss_bytes.items()},
            "note": self.note,
        }

    @classmethod
    def from_json(cls, raw: Any) -> NodeOverride:
        """Parse the file's object; raises ``ValueError`` naming the field that is wrong."""
        if not isinstance(raw, dict):
            raise ValueError("an override file holds a JSON object")
        extra = raw.get("extra_disk_bytes", 0)
        if not isinstance(extra, int) or isinstance(extra, bool) or extra < 0:
            raise ValueError("extra_disk_bytes must be a whole number >= 0")
        until = raw.get("until")
        if until is not None and (not isinstance(until, int | float) or isinstance(until, bool)):
            raise ValueError("until must be seconds since the epoch, or null")
        rss = raw.get("extra_rss_bytes", {})
        if not isinstance(rss, dict):
            raise ValueError("extra_rss_bytes must map namespace ids to bytes")
        parsed = byte_counts(rss, "extra_rss_bytes", "namespace")
        return cls(extra, None if until is None else float(until), parsed, str(raw.get("note", "")))


def byte_counts(raw: dict, label: str, noun: str) -> dict[int, int]:
    """A JSON object ``{"<id>": bytes}`` as ``{id: bytes}``; raises ``ValueError`` naming
    the entry that is not a whole number >= 0, or the key that is not an id."""
    parsed: dict[int, int] = {}
    for key, value in raw.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{label}[{key!r}] must be a whole number >= 0")
        try:
            parsed[int(key)] = value
        except ValueError:
            raise ValueError(f"{label}: {key!r} is not a {noun} id") from None
    return parsed


def override_path(state_dir: str | Path, name: str) -> Path:
    """Where node ``name`` of ``state_dir`` reads its ``NodeOverride``."""
    return Path(state_dir) / f"{name}.override.json"


def write_override(path: str | Path, override: NodeOverride | None) -> None:
    """Write (atomically) or, with None, remove a node's override file."""
    path = Path(path)
    if override is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    scratch.write_text(json.dumps(override.to_json(), indent=2) + "\n")
    os.replace(scratch, path)


@dataclasses.dataclass
class FakeNodeConfig:
    """Everything a fake node needs; only ``base_url`` and a secret are required.

    ``task_delay`` is seconds, or a ``(min, max)`` range drawn uniformly per
    task. ``success_rate`` is the probability a task succeeds, drawn from
    ``random.Random(seed)``. ``index_size`` maps a RepoId to the bytes its
    index takes; ``index_file_bytes`` is the size of one index file (shard).
    """

    base_url: str
    secret_file: str | Path | None = None
    secret: str | None = None
    state_dir: str | Path = "var/fakenodes"
    name: str = "zoekt-0"
    index_url: str | None = None
    search_url: str | None = None
    disk_total_bytes: int = 100 * GIB
    disk_base_used_bytes: int = 10 * GIB
    concurrency: int = 4
    version: str = DEFAULT_VERSION
    schema_version: int = DEFAULT_SCHEMA_VERSION
    services: tuple[str, ...] = ("zoekt",)
    task_delay: float | tuple[float, float] = 0.0
    success_rate: float = 1.0
    seed: int | None = 0
    failure_error: str = DEFAULT_FAILURE_ERROR
    index_size: Callable[[int], int] = default_index_size
    index_file_bytes: int = 100 * MIB
    memory: MemoryModel = dataclasses.field(default_factory=MemoryModel)
    # Optional hooks (simulator.models); None keeps the simple models above.
    disk_model: DiskModel | None = None
    namespace_memory: NamespaceMemoryModel | None = None
    request_timeout: float = 10.0
    # What the node holds survives a restart (``<state_dir>/<name>.holdings.json``): written
    # at most every ``holdings_save_interval`` seconds while it changes (0: on every change),
    # and on ``stop()``. False keeps it in memory only.
    persist_holdings: bool = True
    holdings_save_interval: float = 1.0
    log: Callable[[dict], None] | None = None
    # Task time in ``step()`` mode. None: a task completes within the step that accepted it
    # (instant). A rate: an index task takes ``task_delay`` + its index bytes ÷ this many
    # seconds, a delete ``delete_task_seconds``, at most ``concurrency`` at a time (the rest
    # wait in a FIFO queue), measured on ``clock``; each completes (and calls back) at the
    # first ``step()`` at or after its end.
    indexing_bytes_per_second: float | None = None
    delete_task_seconds: float = 1.0
    # A build writes its new shards before the old ones go: while an index task runs, the
    # disk holds this many bytes per byte of its index beside what the node holds, freed
    # when it finishes (the shape of the 2026-10-20 incident). 0 leaves builds weightless.
    temporary_space_factor: float = 1.0
    # Seconds for the task timing above; None: the disk model's clock, else time.monotonic.
    clock: Callable[[], float] | None = None
    # Where requests go: None is HTTP to ``base_url``. A replay passes an object with
    # ``post_json(path, body, headers) -> (status, parsed body)`` and ``close()`` that calls
    # the application in the same process (``simulator.replay``); it raises
    # ``TransportError`` when no response came.
    transport: Any = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.success_rate <= 1.0:
            raise ValueError("success_rate must be within 0..1")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        low, high = _delay_range(self.task_delay)
        if low < 0 or high < low:
            raise ValueError("task_delay must be >= 0 seconds, or a (min, max) range with min<=max")
        if self.secret is None and self.secret_file is None:
            raise ValueError("a secret or a secret_file is needed to sign requests")
        if self.holdings_save_interval < 0:
            raise ValueError("holdings_save_interval must be >= 0 seconds")
        if self.indexing_bytes_per_second is not None and self.indexing_bytes_per_second <= 0:
            raise ValueError("indexing_bytes_per_second must be > 0 (or None: instant)")
        if self.delete_task_seconds < 0:
            raise ValueError("delete_task_seconds must be >= 0")

    def resolved_secret(self) -> str:
        if self.secret is not None:
            return self.secret
        return read_secret(self.secret_file)

    def resolved_index_url(self) -> str:
        return self.index_url or f"http://{self.name}:6065"

    def resolved_search_url(self) -> str:
        return self.search_url or f"http://{self.name}:6070"


def read_secret(path: str | Path) -> str:
    """GitLab Shell's secret file: its content with the trailing newline stripped."""
    value = Path(path).read_text().rstrip("\r\n")
    if not value:
        raise ValueError(f"secret file {str(path)!r} is empty")
    return value


def encode_node_token(secret: str, *, now: float | None = None) -> str:
    """The JWT a node signs (the same three claims as ``api.authentication.encode_node_token``)."""
    issued = int(now if now is not None else time.time())
    return jwt.encode(
        {"iss": ISSUER, "iat": issued, "exp": issued + TOKEN_LIFETIME_SECONDS},
        secret,
        algorithm=ALGORITHM,
    )


def _ms_since(started: float) -> float:
    """Milliseconds since the monotonic time ``started``, rounded for the log."""
    return round((time.monotonic() - started) * 1000, 2)


def _delay_range(delay: float | tuple[float, float]) -> tuple[float, float]:
    if isinstance(delay, tuple | list):
        low, high = delay
        return float(low), float(high)
    return float(delay), float(delay)


# --- HTTP -------------------------------------------------------------------------------


class TransportError(Exception):
    """The request did not get an HTTP response."""


class _Transport:
    """JSON POSTs over keep-alive connections, one per thread (http.client is not thread-safe)."""

    def __init__(self, base_url: str, timeout: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=self._timeout)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def post_json(self, path: str, body: dict, headers: dict[str, str]) -> tuple[int, Any]:
        data = json.dumps(body).encode()
        all_headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "zoekt-control-fakenode/1",
            **headers,
        }
        for attempt in range(2):
            conn = self._connection()
            reused = conn.sock is not None
            try:
                conn.request("POST", self._prefix + path, body=data, headers=all_headers)
                response = conn.getresponse()
                raw = response.read()
            except (http.client.HTTPException, OSError) as exc:
                conn.close()
                # A keep-alive connection the server closed while idle: retry once on a new one.
                if reused and attempt == 0:
                    continue
                raise TransportError(f"{type(exc).__name__}: {exc}") from exc
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode(errors="replace")
            return response.status, parsed
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            connections, self._all = self._all, []
        for conn in connections:
            conn.close()
        self._local = threading.local()


# --- the node ---------------------------------------------------------------------------


def _root_namespace(payload: dict) -> int | None:
    """The root namespace of an index task: the first of its ``traversal_ids`` (``"9-12-"``)."""
    traversal = str((payload.get("Metadata") or {}).get("traversal_ids") or "")
    first = traversal.split("-", 1)[0]
    return int(first) if first.isdigit() else None


@dataclasses.dataclass(frozen=True)
class HeldRepo:
    size_bytes: int
    index_file_count: int


@dataclasses.dataclass
class Job:
    """One accepted task: what to do, when, and how it will end."""

    task_id: int
    name: str
    repo_id: int
    payload: dict
    callback: dict
    delay: float
    succeed: bool
    generation: int
    after: threading.Event | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    # Timed step mode: when it was accepted, started and is due to end (the node's clock).
    accepted_at: float = 0.0
    started_at: float | None = None
    ends_at: float | None = None


@dataclasses.dataclass
class HeartbeatOutcome:
    status: int | None
    reply: Any
    accepted: list[Job] = dataclasses.field(default_factory=list)
    duplicates: list[int] = dataclasses.field(default_factory=list)
    declined: list[int] = dataclasses.field(default_factory=list)
    error: str | None = None


@dataclasses.dataclass
class CallbackOutcome:
    task_id: int
    name: str
    success: bool
    status: int | None
    body: dict
    error: str | None = None

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclasses.dataclass
class StepResult:
    heartbeat: HeartbeatOutcome
    callbacks: list[CallbackOutcome]


class FakeNode:
    """A fake ``gitlab-zoekt-indexer`` node.

    ``step()`` is one deterministic iteration (redeliver pending callbacks,
    heartbeat, run the accepted tasks in order, call back) for tests;
    ``start()`` / ``stop()`` / ``run_for(seconds)`` run the same loop in a
    thread, with tasks executed by ``concurrency`` worker threads and the next
    heartbeat after ``pull_frequency``.
    """

    def __init__(self, config: FakeNodeConfig) -> None:
        self.config = config
        self._secret = config.resolved_secret()
        self._http = config.transport or _Transport(config.base_url, config.request_timeout)
        self._rng = random.Random(config.seed)
        self._lock = threading.RLock()
        self._uuid: uuidlib.UUID | None = None
        self._repos: dict[int, HeldRepo] = {}
        self._repo_root: dict[int, int | None] = {}  # RepoId -> root namespace id
        self._inflight: dict[int, Job] = {}
        self._reported: collections.OrderedDict[int, tuple[bool, float]] = collections.OrderedDict()
        self._outbox: collections.OrderedDict[int, tuple[Job, dict]] = collections.OrderedDict()
        self._repo_tail: dict[int, threading.Event] = {}
        # Timed step mode: accepted tasks waiting for a slot (FIFO), the running ones as a
        # heap of (ends at, order, job), the times the free slots became free, and when
        # each repository's last task ended.
        self._queue: collections.deque[Job] = collections.deque()
        self._timed_running: list[tuple[float, int, Job]] = []
        self._free_slots: list[float] = [float("-inf")] * config.concurrency
        # Task id → temporary bytes of the index builds running now.
        self._building: dict[int, int] = {}
        self._repo_ended_at: dict[int, float] = {}
        self._job_order = 0
        self._running_count = 0
        self._generation = 0
        self._started_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.pull_frequency = DEFAULT_PULL_FREQUENCY
        self.pull_frequency_seconds = parse_go_duration(DEFAULT_PULL_FREQUENCY)
        self.stop_indexing = False
        self.node_id: int | None = None
        self.heartbeats = 0
        # Bytes of index this process built (index tasks that succeeded), for the replays.
        self.index_bytes_built = 0
        self.extra_used_bytes = 0  # other files on the disk; tests raise it to fill the disk
        # The operator's override file, as last read, and the mtime it was read at.
        self.override = NodeOverride()
        self._override_stamp: tuple[int, int] | None = None
        # The holdings file: the version of ``_repos`` in memory and the one last written.
        self._save_lock = threading.Lock()
        self._holdings_version = 0
        self._saved_version = 0
        self._saved_at: float | None = None
        self._load_holdings()

    # --- identity -----------------------------------------------------------

    @property
    def uuid_path(self) -> Path:
        return Path(self.config.state_dir) / f"{self.config.name}.uuid"

    @property
    def uuid(self) -> uuidlib.UUID:
        """The node's uuid, from its file; the file is created the first time."""
        with self._lock:
            if self._uuid is None:
                self._uuid = self._load_or_create_uuid()
            return self._uuid

    def _load_or_create_uuid(self) -> uuidlib.UUID:
        path = self.uuid_path
        if path.exists():
            text = path.read_text().strip()
            try:
                return uuidlib.UUID(text)
            except ValueError:
                raise ValueError(f"{path} does not hold a uuid: {text[:40]!r}") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        value = uuidlib.uuid4()
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(f"{value}\n")
        os.replace(temporary, path)
        return value

    # --- what the node holds, across restarts ------------------------------

    @property
    def holdings_path(self) -> Path:
        return Path(self.config.state_dir) / f"{self.config.name}.holdings.json"

    def _load_holdings(self) -> None:
        """Hold again what the holdings file lists, when it is this node's (same uuid).

        A node without a uuid file yet is new: a holdings file beside it is
        not its own. A file that does not parse, is of another format or names
        another uuid is left alone and the node starts empty, as a node whose
        disk was lost (and says so in its log).
        """
        if not self.config.persist_holdings or not self.holdings_path.exists():
            return
        if not self.uuid_path.exists():
            self._emit("holdings_ignored", reason="no_uuid_file", path=str(self.holdings_path))
            return
        try:
            data = json.loads(self.holdings_path.read_text())
            if not isinstance(data, dict) or data.get("format") != HOLDINGS_FORMAT:
                raise ValueError(f"not a holdings file of format {HOLDINGS_FORMAT}")
            repos: dict[int, HeldRepo] = {}
            roots: dict[int, int | None] = {}
            for key, entry in dict(data.get("repos") or {}).items():
                repo_id = int(key)
                repos[repo_id] = HeldRepo(int(entry["size_bytes"]), int(entry["index_file_count"]))
                root = entry.get("root_namespace_id")
                roots[repo_id] = None if root is None else int(root)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            self._emit("holdings_unreadable", path=str(self.holdings_path), error=str(exc))
            return
        if data.get("uuid") != str(self.uuid):
            self._emit("holdings_ignored", reason="other_uuid", path=str(self.holdings_path))
            return
        with self._lock:
            self._repos = repos
            self._repo_root = roots
            if self.config.disk_model is not None:
                for repo_id, repo in repos.items():
                    self.config.disk_model.index(repo_id, repo.size_bytes)
        self._emit(
            "holdings_loaded",
            repos_held=len(repos),
            indexed_bytes=sum(repo.size_bytes for repo in repos.values()),
        )

    def _holdings_changed(self) -> None:
        """Call with ``_lock`` held after changing ``_repos``; the file follows (throttled)."""
        self._holdings_version += 1

    def save_holdings(self, *, force: bool = False) -> bool:
        """Write what the node holds to its holdings file if it changed since the last write.

        At most once every ``holdings_save_interval`` seconds unless ``force``:
        a change inside the interval is written by a later call (the next
        change, heartbeat or step, or ``stop()``). The file is written to a
        temporary name and renamed over the old one, so a reader (or a node
        killed mid-write) sees the old holdings or the new, never half.
        Returns whether it wrote.
        """
        if not self.config.persist_holdings:
            return False
        # One writer at a time. A call that is not forced leaves the work to the writer of
        # the moment, which looks again after letting go, so no change is left unwritten.
        wrote = False
        while self._save_due(force):
            if not self._save_lock.acquire(blocking=force):
                break
            try:
                while self._save_due(force):
                    if not self._write_holdings():
                        return wrote
                    wrote = True
                    force = False
            finally:
                self._save_lock.release()
        return wrote

    def _save_due(self, force: bool) -> bool:
        """The holdings changed since the last write, and the interval allows one now."""
        with self._lock:
            if self._holdings_version == self._saved_version:
                return False
            recent = (
                self._saved_at is not None
                and time.monotonic() - self._saved_at < self.config.holdings_save_interval
            )
            return force or not recent

    def _write_holdings(self) -> bool:
        """Write the holdings file (temporary file, then rename); call under ``_save_lock``."""
        with self._lock:
            version = self._holdings_version
            repos = {
                str(repo_id): {
                    "size_bytes": repo.size_bytes,
                    "index_file_count": repo.index_file_count,
                    "root_namespace_id": self._repo_root.get(repo_id),
                }
                for repo_id, repo in sorted(self._repos.items())
            }
        data = {"format": HOLDINGS_FORMAT, "uuid": str(self.uuid), "repos": repos}
        path = self.holdings_path
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            temporary.write_text(json.dumps(data, separators=(",", ":")))
            os.replace(temporary, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            self._emit("holdings_save_error", path=str(path), error=str(exc))
            return False
        with self._lock:
            self._saved_version = version
            self._saved_at = time.monotonic()
        return True

    # --- the models ---------------------------------------------------------

    @property
    def repos(self) -> dict[int, HeldRepo]:
        """A copy of the repositories held, by RepoId."""
        with self._lock:
            return dict(self._repos)

    def indexed_bytes(self) -> int:
        with self._lock:
            return sum(repo.size_bytes for repo in self._repos.values())

    @property
    def override_path(self) -> Path:
        return override_path(self.config.state_dir, self.config.name)

    def read_override(self) -> NodeOverride:
        """Read the override file again when it changed (or went); returns what is in force.

        A file that does not parse is logged once and counts as no file.
        """
        try:
            stat = self.override_path.stat()
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._override_stamp:
            return self.override
        self._override_stamp = stamp
        override = NodeOverride()
        if stamp is not None:
            try:
                override = NodeOverride.from_json(json.loads(self.override_path.read_text()))
            except (OSError, ValueError) as exc:
                self._emit("override_ignored", path=str(self.override_path), error=str(exc))
        if override != self.override:
            self._emit("override", **override.to_json())
        self.override = override
        return override

    def disk_used_bytes(self) -> int:
        model = self.config.disk_model
        held = model.used_bytes() if model is not None else self.indexed_bytes()
        extra = self.extra_used_bytes + self.override.disk_bytes(time.time())
        used = self.config.disk_base_used_bytes + extra + held
        return min(used + self.temporary_bytes(), self.config.disk_total_bytes)

    def temporary_bytes(self) -> int:
        """The temporary space of the builds running now."""
        with self._lock:
            return sum(self._building.values())

    def _build_started(self, job: Job) -> None:
        """Count a starting index build's temporary bytes; call under ``_lock``."""
        if job.name == "index" and not job.payload.get("MissingRepo"):
            size = int(self.config.index_size(job.repo_id))
            self._building[job.task_id] = int(size * self.config.temporary_space_factor)

    def uptime_seconds(self) -> int:
        """Whole seconds since the node started (GitLab's ``process_metrics`` are integers)."""
        if self._started_at is None:
            return 0
        return max(int(time.monotonic() - self._started_at), 0)

    def process_health(self) -> dict:
        model = self.config.memory
        with self._lock:
            indexed = sum(repo.size_bytes for repo in self._repos.values())
            shards = len(self._repos)
            files = sum(repo.index_file_count for repo in self._repos.values())
            running = self._running_count
            by_namespace: collections.Counter = collections.Counter()
            for repo_id, repo in self._repos.items():
                by_namespace[self._repo_root.get(repo_id)] += repo.size_bytes
        uptime = self.uptime_seconds()
        hooked = self.config.namespace_memory
        if hooked is not None:
            rss = hooked.rss_bytes(shards, by_namespace)
        else:
            rss = int(
                model.webserver_base_rss_bytes + model.webserver_rss_per_indexed_byte * indexed
            )
        rss += self.override.rss_bytes(by_namespace)
        webserver = {
            "rss_bytes": rss,
            "mmap_current": min(
                model.webserver_mmap_base + model.mmaps_per_index_file * files, model.mmap_max
            ),
            "mmap_max": model.mmap_max,
            "restarts_1m": 0,
            "restarts_5m": 0,
            "restarts_15m": 0,
            "uptime_seconds": uptime,
            "shards_loaded": shards,
        }
        limit = model.memory_limit_bytes
        if hooked is not None and hooked.memory_limit_bytes is not None:
            limit = hooked.memory_limit_bytes
        if limit is not None:
            webserver["memory_limit_bytes"] = limit
        indexer = {
            "rss_bytes": model.indexer_base_rss_bytes
            + model.indexer_rss_per_running_task_bytes * running,
            "mmap_current": model.indexer_mmap_base,
            "mmap_max": model.mmap_max,
            "restarts_1m": 0,
            "restarts_5m": 0,
            "restarts_15m": 0,
            "uptime_seconds": uptime,
        }
        return {"indexer": indexer, "webserver": webserver}

    def heartbeat_body(self) -> dict:
        """GitLab's heartbeat parameters, with their literally dotted names."""
        config = self.config
        self.read_override()
        with self._lock:
            task_count = len(self._inflight)
        indexed = self.indexed_bytes()
        return {
            "node.url": config.resolved_index_url(),
            "node.search_url": config.resolved_search_url(),
            "node.name": config.name,
            "node.version": config.version,
            "node.schema_version": config.schema_version,
            "node.concurrency": config.concurrency,
            "node.task_count": task_count,
            "node.services": list(config.services),
            "disk.all": config.disk_total_bytes,
            "disk.used": self.disk_used_bytes(),
            "disk.indexed": indexed,
            "process_health": self.process_health(),
        }

    # --- protocol -----------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {HEADER: encode_node_token(self._secret)}

    def _post(self, endpoint: str, body: dict) -> tuple[int, Any]:
        return self._http.post_json(f"{API_PREFIX}/{self.uuid}/{endpoint}", body, self._headers())

    def heartbeat(self) -> HeartbeatOutcome:
        """Send one heartbeat and follow the reply; returns the tasks accepted (not yet run)."""
        if self._started_at is None:
            self._started_at = time.monotonic()
        body = self.heartbeat_body()
        sent_at = time.monotonic()
        try:
            status, reply = self._post("heartbeat", body)
        except TransportError as exc:
            outcome = HeartbeatOutcome(status=None, reply=None, error=str(exc))
            self._emit("heartbeat_error", error=outcome.error, latency_ms=_ms_since(sent_at))
            return outcome
        latency_ms = _ms_since(sent_at)
        self.heartbeats += 1
        if status != 200 or not isinstance(reply, dict):
            error = reply.get("error") if isinstance(reply, dict) else str(reply)[:200]
            outcome = HeartbeatOutcome(status=status, reply=reply, error=error)
            self._emit("heartbeat_error", status=status, error=error, latency_ms=latency_ms)
            return outcome
        outcome = self.handle_reply(reply, sent_at=sent_at)
        outcome.status = status
        if reply.get("truncate"):
            self.save_holdings(force=True)
        self._emit(
            "heartbeat",
            status=status,
            node_id=self.node_id,
            truncate=bool(reply.get("truncate")),
            stop_indexing=self.stop_indexing,
            pull_frequency=self.pull_frequency,
            tasks_received=len(reply.get("tasks") or []),
            accepted=[job.task_id for job in outcome.accepted],
            duplicates=outcome.duplicates,
            declined=outcome.declined,
            repos_held=len(self.repos),
            disk_indexed=body["disk.indexed"],
            disk_used=body["disk.used"],
            latency_ms=latency_ms,
        )
        return outcome

    def handle_reply(self, reply: dict, *, sent_at: float) -> HeartbeatOutcome:
        """Follow a heartbeat reply received for a request sent at ``sent_at`` (monotonic)."""
        outcome = HeartbeatOutcome(status=200, reply=reply)
        with self._lock:
            self.node_id = reply.get("id", self.node_id)
            if reply.get("truncate"):
                # A new registration: whatever was held belongs to no index on this server,
                # and task ids from an earlier server mean nothing here.
                self._repos.clear()
                self._repo_root.clear()
                self._holdings_changed()
                if self.config.disk_model is not None:
                    self.config.disk_model.clear()
                self._reported.clear()
                self._generation += 1
            frequency = reply.get("pull_frequency") or DEFAULT_PULL_FREQUENCY
            try:
                self.pull_frequency_seconds = max(parse_go_duration(frequency), 0.0)
                self.pull_frequency = frequency
            except ValueError:
                self._emit("pull_frequency_invalid", pull_frequency=frequency)
            self.stop_indexing = bool(reply.get("stop_indexing"))
            for task in reply.get("tasks") or []:
                job = self._accept(task, sent_at, outcome)
                if job is not None:
                    outcome.accepted.append(job)
        return outcome

    def _accept(self, task: dict, sent_at: float, outcome: HeartbeatOutcome) -> Job | None:
        name = task.get("name")
        payload = task.get("payload") or {}
        callback = payload.get("Callback") or {}
        task_id = (callback.get("payload") or {}).get("task_id")
        if name not in {"index", "delete"} or not isinstance(task_id, int):
            self._emit("task_unreadable", task=task)
            return None
        if task_id in self._inflight or task_id in self._outbox:
            outcome.duplicates.append(task_id)
            return None
        reported = self._reported.get(task_id)
        if reported is not None:
            succeeded, reported_at = reported
            # A success is final. A failure is retried by the server once its perform_at
            # passes: an offer in a reply to a heartbeat sent after the report is that retry.
            if succeeded or sent_at <= reported_at:
                outcome.duplicates.append(task_id)
                return None
        if name == "index" and self.stop_indexing:
            outcome.declined.append(task_id)
            return None
        low, high = _delay_range(self.config.task_delay)
        delay = low if high == low else self._rng.uniform(low, high)
        succeed = self._rng.random() < self.config.success_rate
        repo_id = int(payload.get("RepoId", 0))
        job = Job(
            task_id=task_id,
            name=name,
            repo_id=repo_id,
            payload=payload,
            callback=callback,
            delay=delay,
            succeed=succeed,
            generation=self._generation,
            after=self._repo_tail.get(repo_id),
            accepted_at=self.now() if self.timed else 0.0,
        )
        # Tasks for one repository run one after another, in the order they were handed out.
        self._repo_tail[repo_id] = job.done
        self._inflight[task_id] = job
        return job

    def execute(self, job: Job) -> CallbackOutcome | None:
        """Run one accepted task: wait its delay, apply it, call back. None if stopped first."""
        with self._lock:
            self._running_count += 1
            self._build_started(job)
        try:
            while job.after is not None and not job.after.wait(0.05):
                if self._stop.is_set():
                    return self._abandon(job)
            stopped = self._stop.wait(job.delay) if job.delay > 0 else self._stop.is_set()
            if stopped:
                return self._abandon(job)
            body = self._apply(job)
        finally:
            with self._lock:
                self._running_count -= 1
                self._building.pop(job.task_id, None)
        return self._deliver(job, body)

    def _abandon(self, job: Job) -> None:
        with self._lock:
            self._inflight.pop(job.task_id, None)
            self._release_tail(job)
        return None

    def _release_tail(self, job: Job) -> None:
        job.done.set()
        if self._repo_tail.get(job.repo_id) is job.done:
            del self._repo_tail[job.repo_id]

    def _apply(self, job: Job) -> dict:
        body: dict = {
            "name": job.callback.get("name", job.name),
            "success": job.succeed,
            "payload": job.callback.get("payload") or {},
        }
        with self._lock:
            current = job.generation == self._generation
            if not job.succeed:
                body["error"] = self.config.failure_error
            elif job.name == "delete":
                if current:
                    self._drop_repo(job.repo_id)
            elif job.payload.get("MissingRepo"):
                # Nothing to index: the repository's shards are removed.
                if current:
                    self._drop_repo(job.repo_id)
                body["additional_payload"] = {
                    "repo_stats": {"size_in_bytes": 0, "index_file_count": 0}
                }
            else:
                size = int(self.config.index_size(job.repo_id))
                files = max(1, math.ceil(size / self.config.index_file_bytes))
                if current:
                    self.index_bytes_built += size
                    self._repos[job.repo_id] = HeldRepo(size, files)
                    self._repo_root[job.repo_id] = _root_namespace(job.payload)
                    self._holdings_changed()
                    if self.config.disk_model is not None:
                        self.config.disk_model.index(job.repo_id, size)
                body["additional_payload"] = {
                    "repo_stats": {"size_in_bytes": size, "index_file_count": files}
                }
            self._release_tail(job)
        # Written before the callback tells the server (unless a write was made just now).
        self.save_holdings()
        return body

    def _drop_repo(self, repo_id: int) -> None:
        if self._repos.pop(repo_id, None) is not None:
            self._holdings_changed()
        self._repo_root.pop(repo_id, None)
        if self.config.disk_model is not None:
            self.config.disk_model.delete(repo_id)

    def _deliver(self, job: Job, body: dict) -> CallbackOutcome:
        outcome = CallbackOutcome(
            task_id=job.task_id, name=body["name"], success=body["success"], status=None, body=body
        )
        sent_at = time.monotonic()
        try:
            status, reply = self._post("callback", body)
            outcome.status = status
            if not 200 <= status < 300:
                outcome.error = reply.get("error") if isinstance(reply, dict) else str(reply)
        except TransportError as exc:
            outcome.error = str(exc)
        # Not received, or refused for a reason that may pass: post it again later.
        retry = outcome.status is None or outcome.status >= 500 or outcome.status in {401, 429}
        with self._lock:
            if retry:
                self._inflight.pop(job.task_id, None)
                self._outbox[job.task_id] = (job, body)
            else:
                # Delivered, or refused for good (400, 422): either way it is not run again.
                self._inflight.pop(job.task_id, None)
                self._outbox.pop(job.task_id, None)
                self._reported[job.task_id] = (job.succeed, time.monotonic())
                self._reported.move_to_end(job.task_id)
                while len(self._reported) > REPORTED_MEMORY:
                    self._reported.popitem(last=False)
        stats = (body.get("additional_payload") or {}).get("repo_stats") or {}
        self._emit(
            "callback",
            task_id=job.task_id,
            name=body["name"],
            repo_id=job.repo_id,
            success=body["success"],
            status=outcome.status,
            size_in_bytes=stats.get("size_in_bytes"),
            error=outcome.error,
            will_retry=retry,
            latency_ms=_ms_since(sent_at),
        )
        return outcome

    def flush_outbox(self) -> list[CallbackOutcome]:
        """Post again the callbacks the server did not receive."""
        with self._lock:
            pending = list(self._outbox.values())
        return [self._deliver(job, body) for job, body in pending]

    # --- running ------------------------------------------------------------

    def step(self) -> StepResult:
        """One deterministic iteration: redeliver, heartbeat, run the tasks in order, call back.

        With ``indexing_bytes_per_second`` set (timed), the tasks that ended by
        now on the node's clock call back first, then the heartbeat; accepted
        tasks join the queue and start as slots free up, at the time the slot
        freed (so a slot does not idle until the next step).
        """
        if self.running:
            raise RuntimeError("step() drives a node that is not running in its own thread")
        if self._stop.is_set():
            self._stop = threading.Event()
        callbacks = self.flush_outbox()
        if self.timed:
            callbacks.extend(self._advance())
            outcome = self.heartbeat()
            self._queue.extend(outcome.accepted)
            callbacks.extend(self._advance())
        else:
            outcome = self.heartbeat()
            for job in outcome.accepted:
                result = self.execute(job)
                if result is not None:
                    callbacks.append(result)
        self.save_holdings()
        return StepResult(heartbeat=outcome, callbacks=callbacks)

    # --- task time (timed step mode) ------------------------------------------

    @property
    def timed(self) -> bool:
        return self.config.indexing_bytes_per_second is not None

    def now(self) -> float:
        """Seconds on the node's clock (the task timing's)."""
        clock = self.config.clock
        if clock is None and self.config.disk_model is not None:
            clock = self.config.disk_model.clock
        return (clock or time.monotonic)()

    def task_seconds(self, job: Job) -> float:
        """How long ``job`` runs: bytes ÷ rate for an index task, a fixed time for a delete."""
        if job.name == "index" and not job.payload.get("MissingRepo"):
            size = int(self.config.index_size(job.repo_id))
            return job.delay + size / float(self.config.indexing_bytes_per_second)
        return job.delay + self.config.delete_task_seconds

    @property
    def queued_tasks(self) -> int:
        """Accepted tasks waiting for a slot (timed step mode)."""
        with self._lock:
            return len(self._queue)

    def _advance(self) -> list[CallbackOutcome]:
        """Start queued tasks in free slots and finish those that ended by now, in time order."""
        now = self.now()
        callbacks: list[CallbackOutcome] = []
        while True:
            self._start_queued(now)
            if not self._timed_running or self._timed_running[0][0] > now:
                break
            ends_at, _, job = heapq.heappop(self._timed_running)
            heapq.heappush(self._free_slots, ends_at)
            self._running_count = len(self._timed_running)
            body = self._apply(job)
            with self._lock:
                self._building.pop(job.task_id, None)
            self._repo_ended_at[job.repo_id] = ends_at
            callbacks.append(self._deliver(job, body))
        return callbacks

    def _start_queued(self, now: float) -> None:
        """Fill the free slots from the queue: first come first served, a repository's
        tasks one after another (a task whose predecessor still runs waits its turn)."""
        with self._lock:
            while self._free_slots and self._queue:
                job = next((j for j in self._queue if j.after is None or j.after.is_set()), None)
                if job is None:
                    return
                self._queue.remove(job)
                free_at = heapq.heappop(self._free_slots)
                start = max(free_at, job.accepted_at)
                if job.after is not None:
                    start = max(start, self._repo_ended_at.get(job.repo_id, start))
                job.started_at = min(start, now)
                job.ends_at = job.started_at + self.task_seconds(job)
                self._build_started(job)
                self._job_order += 1
                heapq.heappush(self._timed_running, (job.ends_at, self._job_order, job))
                self._running_count = len(self._timed_running)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        _ = self.uuid
        if self._started_at is None:
            self._started_at = time.monotonic()
        self._stop = threading.Event()
        self._executor = ThreadPoolExecutor(
            max_workers=self.config.concurrency, thread_name_prefix=f"{self.config.name}-task"
        )
        self._thread = threading.Thread(
            target=self._loop, name=f"{self.config.name}-heartbeat", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.save_holdings()
                self.flush_outbox()
                outcome = self.heartbeat()
                for job in outcome.accepted:
                    self._executor.submit(self._execute_logged, job)
            except Exception as exc:  # keep the node alive, as a real one would
                self._emit("loop_error", error=f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.pull_frequency_seconds)

    def _execute_logged(self, job: Job) -> None:
        try:
            self.execute(job)
        except Exception as exc:
            self._emit("task_error", task_id=job.task_id, error=f"{type(exc).__name__}: {exc}")
            self._abandon(job)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop heartbeating; tasks still waiting out their delay are dropped."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        with self._lock:
            for job in list(self._inflight.values()):
                self._abandon(job)
            self._queue.clear()
            self._timed_running.clear()
            self._building.clear()
            self._free_slots = [float("-inf")] * self.config.concurrency
            self._running_count = 0
        self.save_holdings(force=True)
        self._http.close()

    def run_for(self, seconds: float) -> None:
        """Run the loop in its thread for ``seconds``, then stop."""
        self.start()
        try:
            time.sleep(seconds)
        finally:
            self.stop()

    # --- logging ------------------------------------------------------------

    def _emit(self, event: str, **fields: Any) -> None:
        if self.config.log is None:
            return
        record = {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "event": event,
            "node": self.config.name,
            "uuid": str(self._uuid) if self._uuid else None,
            **fields,
        }
        self.config.log(record)


# --- CLI ------------------------------------------------------------------------------------


_print_lock = threading.Lock()


def print_json_line(record: dict) -> None:
    line = json.dumps(record, default=str, separators=(",", ":"))
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulator.fakenode",
        description="Run fake Zoekt nodes against a control plane until Ctrl-C.",
    )
    parser.add_argument("--url", required=True, help="control plane base URL")
    parser.add_argument("--secret-file", required=True, help="GitLab Shell secret file")
    parser.add_argument("--count", type=int, default=1, help="number of nodes (default 1)")
    parser.add_argument(
        "--state-dir", default="var/fakenodes", help="where uuid and holdings files live"
    )
    parser.add_argument("--name-prefix", default="zoekt", help="nodes are <prefix>-<i>")
    parser.add_argument("--first-index", type=int, default=0, help="i of the first node")
    parser.add_argument(
        "--index-url", default="http://{name}:6065", help="node.url template ({name}, {i})"
    )
    parser.add_argument(
        "--search-url", default="http://{name}:6070", help="node.search_url template"
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--disk-total-gib", type=float, default=100.0)
    parser.add_argument("--disk-used-gib", type=float, default=10.0, help="used besides indexes")
    parser.add_argument("--delay", type=float, default=0.05, help="task delay, seconds")
    parser.add_argument("--delay-max", type=float, default=None, help="draw delays up to this")
    parser.add_argument("--success-rate", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="node i uses seed+i")
    parser.add_argument("--node-version", default=DEFAULT_VERSION, help="node.version")
    parser.add_argument("--schema-version", type=int, default=DEFAULT_SCHEMA_VERSION)
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    parser.add_argument(
        "--disk-free-delay",
        type=float,
        default=None,
        help="use the disk model: deleted indexes are freed after this many seconds",
    )
    parser.add_argument(
        "--memory-limit-gib",
        type=float,
        default=None,
        help="use the hotness memory model and report this webserver memory limit",
    )
    parser.add_argument("--per-shard-rss-mib", type=float, default=2.0, help="memory model")
    parser.add_argument("--zipf-s", type=float, default=1.0, help="memory model: Zipf exponent")
    parser.add_argument(
        "--hotness-scale",
        type=float,
        default=1.0,
        help="memory model: resident bytes per index byte, averaged over the Zipf ranks",
    )
    parser.add_argument(
        "--index-sizes",
        metavar="FILE",
        default=None,
        help="JSON object repo id -> index bytes; repositories not in it get the default size",
    )
    return parser


def load_index_sizes(path: str | Path) -> Callable[[int], int]:
    """An ``index_size`` for ``FakeNodeConfig`` from a JSON object ``{"<repo id>": bytes}``.

    A repository the file does not name gets ``default_index_size``.
    """
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read index sizes from {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object of repo id -> bytes")
    sizes = byte_counts(raw, str(path), "repo")

    def index_size(repo_id: int) -> int:
        size = sizes.get(repo_id)
        return default_index_size(repo_id) if size is None else size

    return index_size


def configs_from_args(args: argparse.Namespace, log: Callable[[dict], None] | None) -> list:
    delay: float | tuple[float, float] = args.delay
    if args.delay_max is not None:
        delay = (args.delay, args.delay_max)
    secret = read_secret(args.secret_file)
    free_delay = getattr(args, "disk_free_delay", None)
    memory_limit = getattr(args, "memory_limit_gib", None)
    sizes_file = getattr(args, "index_sizes", None)
    index_size = default_index_size if sizes_file is None else load_index_sizes(sizes_file)
    hotness = ZipfHotness(s=args.zipf_s, seed=args.seed, scale=getattr(args, "hotness_scale", 1.0))
    configs = []
    for i in range(args.first_index, args.first_index + args.count):
        name = f"{args.name_prefix}-{i}"
        configs.append(
            FakeNodeConfig(
                base_url=args.url,
                secret=secret,
                state_dir=args.state_dir,
                name=name,
                index_url=args.index_url.format(name=name, i=i),
                search_url=args.search_url.format(name=name, i=i),
                disk_total_bytes=int(args.disk_total_gib * GIB),
                disk_base_used_bytes=int(args.disk_used_gib * GIB),
                concurrency=args.concurrency,
                version=args.node_version,
                schema_version=args.schema_version,
                task_delay=delay,
                success_rate=args.success_rate,
                seed=args.seed + i,
                index_size=index_size,
                log=log,
                disk_model=None if free_delay is None else DiskModel(free_delay=free_delay),
                namespace_memory=None
                if memory_limit is None
                else NamespaceMemoryModel(
                    per_shard_base_bytes=int(args.per_shard_rss_mib * MIB),
                    hotness=hotness,
                    memory_limit_bytes=int(memory_limit * GIB),
                ),
            )
        )
    return configs


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None, *, log: Callable[[dict], None] = print_json_line) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM (a process manager stopping the fleet) stops the nodes as Ctrl-C does, so
    # each writes what it holds before the process ends.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt)
    nodes = [FakeNode(config) for config in configs_from_args(args, log)]
    for node in nodes:
        node.start()
        log({"event": "started", "node": node.config.name, "uuid": str(node.uuid)})
    deadline = None if args.duration is None else time.monotonic() + args.duration
    try:
        while deadline is None or time.monotonic() < deadline:
            remaining = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            time.sleep(max(remaining, 0))
    except KeyboardInterrupt:
        pass
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                node.stop()
            log(
                {
                    "event": "stopped",
                    "node": node.config.name,
                    "heartbeats": node.heartbeats,
                    "repos_held": len(node.repos),
                }
            )
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
