"""Replays: the whole control plane and a simulated fleet in one process, on a simulated clock.

A replay runs hours of a fleet's life in minutes, with nothing mocked
between the nodes and the database:

* the fake nodes (``simulator.fakenode``) send their heartbeats and callbacks
  through Django's request handling in this process (``InProcessTransport``:
  URL routing, JWT authentication, the API views, PostgreSQL), each with a
  ``DiskModel`` and a ``NamespaceMemoryModel`` whose clock is the replay's;
* ``zoekt.clock`` is frozen at the replay's start and stepped by
  ``tick_seconds`` per tick, so every time-based rule (online and lost
  thresholds, the heartbeat debounce, webserver staleness) sees simulated
  time;
* beat's jobs run at their own periods *in simulated time*: the rollout
  (600 s), one scheduling pass a minute with every scheduled task, the
  throttled ones at their GitLab periods (``zoekt.scheduling.service.PERIODS``),
  moves, the shutdown records' settle job and the lost-index-data check every
  minute, memory-pressure moves, the end of spent eviction cooldowns and the
  rebalance reconciler every 5 minutes, the buffer factor and memory
  calibration hourly. Celery runs eagerly, so
  the events a job emits run right after it commits;
* nodes stop (``stop_node``: no heartbeat, no callback) and start again
  (``start_node``: a new process on the same disk, the same uuid and what it
  held), so lost nodes and restarts are replayed;
* search traffic: every ``traffic_every`` seconds, ``searches_per_sample``
  searches are drawn over the enabled namespaces in proportion to their
  traffic weight (``simulator.models.generate_searches``), each answered by
  the real ``zoekt.search_targets`` (``search_targets_many``: every
  namespace's answer at that instant); a search with no target is dark.

By default tasks take no simulated time: a node runs what a heartbeat hands
it before the next tick, and the replay's times are the control plane's own
(detection, planning, hand-out and state changes). With
``indexing_bytes_per_second`` each node indexes at that rate per task,
``node_concurrency`` tasks at a time with the rest queued (a delete takes
``delete_task_seconds``), on the replay's clock, so the time a namespace
waits for its index is measured too. With ``temporary_space_factor`` a
running build also takes that share of its index's bytes on its node's disk
until it finishes (the fake node's model of a rebuild's temporary space); the
replays that predate admission control run without it, as recorded.

The rollout re-enqueues itself while a batch came back full (GitLab's
``RolloutWorker``); the replay runs those re-enqueued runs one after another
in the same tick, rather than nested inside each other.

Needs Django set up against a database the replay may write (a bench's
scratch database, or a test database with ``transaction=True``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import tempfile
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

from simulator.fakenode import GIB, MIB, FakeNode, FakeNodeConfig, TransportError
from simulator.models import DiskModel, NamespaceMemoryModel, generate_searches

START = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)
ROLLOUT_PERIOD = 600
SCHEDULING_PERIOD = 60
HOURLY = 3600
#: A rollout re-enqueued more often than this in one tick waits for its next period.
MAX_ROLLOUT_RUNS_PER_TICK = 10_000


class InProcessTransport:
    """The fake node's transport, calling the application in this process."""

    def __init__(self) -> None:
        from django.test import Client

        self._client = Client(SERVER_NAME="127.0.0.1")

    def post_json(self, path: str, body: dict, headers: dict[str, str]) -> tuple[int, Any]:
        try:
            response = self._client.post(
                path, data=json.dumps(body), content_type="application/json", headers=headers
            )
        except Exception as exc:  # what a real node would see as a dropped connection
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        try:
            parsed: Any = response.json()
        except ValueError:
            parsed = response.content.decode(errors="replace")
        return response.status_code, parsed

    def close(self) -> None:
        pass


@dataclasses.dataclass
class ReplayNode:
    name: str
    fake: FakeNode
    disk: DiskModel
    memory: NamespaceMemoryModel
    alive: bool = True
    stopped_at: float | None = None
    started_at: float | None = None
    #: Index bytes built by the node's earlier processes (before its restarts).
    built_before_bytes: int = 0

    def rss_bytes(self) -> int:
        return int(self.fake.process_health()["webserver"]["rss_bytes"])

    def index_bytes_built(self) -> int:
        """Bytes of index the node built since it was added, across its restarts."""
        return self.built_before_bytes + self.fake.index_bytes_built


@dataclasses.dataclass(frozen=True)
class NodeSample:
    disk_used_bytes: int
    rss_bytes: int
    shards_loaded: int
    alive: bool


@dataclasses.dataclass(frozen=True)
class Sample:
    t: float  # simulated seconds since the start
    nodes: dict[str, NodeSample]
    searches: int = 0
    dark: int = 0


@dataclasses.dataclass
class BeatJob:
    """A beat entry in simulated time: ``run`` every ``period`` seconds, the first at 0."""

    name: str
    period: float
    run: Callable[[], Any]
    last: float | None = None

    def due(self, t: float) -> bool:
        return self.last is None or t - self.last >= self.period - 1e-9


def catalog_rows(
    roots: Mapping[int, str], projects: Iterable[tuple[int, int, int]]
) -> tuple[list[dict], list[dict], list[dict]]:
    """Rows for ``do_bulk_upsert_catalog``: root groups by id → path, and projects as
    ``(project_id, root id, repository_size)`` (each gets a project namespace of its own,
    id ``10_000_000 + project_id``)."""
    from zoekt.catalog_rows import group_row, project_rows

    tables: tuple[list[dict], list[dict], list[dict]] = (
        [group_row(root_id, path) for root_id, path in roots.items()],
        [],
        [],
    )
    for project_id, root_id, size in projects:
        rows = project_rows(
            project_id,
            f"project-{project_id}",
            namespace_id=root_id,
            project_namespace_id=10_000_000 + project_id,
            repository_size=size,
        )
        for table, row in zip(tables, rows, strict=True):
            table.append(row)
    return tables


class Replay:
    """A simulated fleet against the real control plane; use as a context manager.

    ``hotness`` maps a root namespace id to its memory factor (resident bytes
    per index byte held, ``NamespaceMemoryModel``); ``traffic`` maps it to its
    share of searches. ``index_size`` gives the bytes a repository's index
    takes on a node (``RepoId`` is the project id).
    """

    def __init__(
        self,
        *,
        index_size: Callable[[int], int],
        hotness: Mapping[int, float] | None = None,
        default_hotness: float = 0.0,
        traffic: Mapping[int, float] | None = None,
        tick_seconds: float = 20.0,
        traffic_every: float = 60.0,
        searches_per_sample: int = 100,
        per_shard_base_bytes: int = 2 * MIB,
        free_delay: float = 300.0,
        node_concurrency: int = 50,
        indexing_bytes_per_second: float | None = None,
        delete_task_seconds: float = 1.0,
        temporary_space_factor: float = 0.0,
        start: datetime = START,
        seed: int = 0,
        state_dir: str | Path | None = None,
    ) -> None:
        if tick_seconds <= 0:
            raise ValueError("tick_seconds must be > 0")
        self.index_size = index_size
        self.hotness = dict(hotness or {})
        self.default_hotness = default_hotness
        self.traffic = dict(traffic or {})
        self.tick_seconds = float(tick_seconds)
        self.traffic_every = float(traffic_every)
        self.searches_per_sample = searches_per_sample
        self.per_shard_base_bytes = per_shard_base_bytes
        self.free_delay = free_delay
        self.node_concurrency = node_concurrency
        self.indexing_bytes_per_second = indexing_bytes_per_second
        self.delete_task_seconds = delete_task_seconds
        self.temporary_space_factor = temporary_space_factor
        self.start = start
        self.seed = seed
        self._state_dir = state_dir
        self.t = 0.0
        self.nodes: dict[str, ReplayNode] = {}
        self.samples: list[Sample] = []
        self.jobs: list[BeatJob] = []
        self.events: list[tuple[float, str]] = []
        self.job_runs: collections.Counter = collections.Counter()
        self._last_traffic: float | None = None
        self._rollout_again = False
        self._stack = contextlib.ExitStack()
        self._watchers: list[Callable[[Replay], None]] = []

    # --- set-up -------------------------------------------------------------------------

    def __enter__(self) -> Replay:
        from celery import current_app as celery_app
        from django.conf import settings

        from zoekt import clock

        stack = self._stack = contextlib.ExitStack()
        if self._state_dir is None:
            self._state_dir = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="zoekt-replay-")
            )
        stack.enter_context(clock.frozen(self.start))
        # Events run as their job commits; the in-process client's host is allowed.
        stack.callback(
            setattr, celery_app.conf, "task_always_eager", celery_app.conf.task_always_eager
        )
        celery_app.conf.task_always_eager = True
        stack.callback(setattr, settings, "ALLOWED_HOSTS", list(settings.ALLOWED_HOSTS))
        if "127.0.0.1" not in settings.ALLOWED_HOSTS:
            settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "127.0.0.1"]
        stack.callback(self._stop_nodes)
        # A rollout that asks to run again is run again by its beat job, not nested.
        from planner.tasks import rollout_task

        stack.enter_context(
            mock.patch.object(rollout_task, "apply_async", self._rollout_re_enqueued)
        )
        self.jobs = self.beat_jobs()
        return self

    def _rollout_re_enqueued(self, *args, **kwargs) -> None:
        self._rollout_again = True

    def _rollout(self) -> Any:
        from planner.tasks import rollout_task

        runs = 0
        while True:
            self._rollout_again = False
            result = rollout_task()
            runs += 1
            if not self._rollout_again or runs >= MAX_ROLLOUT_RUNS_PER_TICK:
                return result

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def _stop_nodes(self) -> None:
        for node in self.nodes.values():
            node.fake.stop()

    def beat_jobs(self) -> list[BeatJob]:
        """Beat's entries that shape a fleet, at their production periods."""
        from zoekt.scheduling.service import PERIODS, TASKS
        from zoekt.scheduling.tasks import run_scheduled_task
        from zoekt.tasks import calibrate_memory_ratio_task, refresh_buffer_factor_task

        jobs = [BeatJob("refresh_buffer_factor", HOURLY, refresh_buffer_factor_task)]
        # Scheduled tasks run under their lock; the throttle periods are kept here in
        # simulated time (the production throttle counts real seconds in Redis).
        for name in TASKS:
            jobs.append(
                BeatJob(
                    name,
                    PERIODS.get(name, SCHEDULING_PERIOD),
                    lambda name=name: run_scheduled_task(name, bypass_throttle=True),
                )
            )
        jobs.append(BeatJob("rollout", ROLLOUT_PERIOD, self._rollout))
        from eviction.beat import (
            ADVANCE_MOVES_SECONDS,
            DRAIN_NODES_SECONDS,
            END_COOLDOWNS_SECONDS,
            MEMORY_PRESSURE_SECONDS,
            REBALANCE_FLEET_SECONDS,
        )
        from eviction.tasks import (
            advance_moves_task,
            drain_nodes_task,
            end_cooldowns_task,
            memory_pressure_task,
            rebalance_fleet_task,
        )

        jobs.append(BeatJob("advance_moves", ADVANCE_MOVES_SECONDS, advance_moves_task))
        jobs.append(BeatJob("memory_pressure", MEMORY_PRESSURE_SECONDS, memory_pressure_task))
        jobs.append(BeatJob("drain_nodes", DRAIN_NODES_SECONDS, drain_nodes_task))
        jobs.append(BeatJob("end_cooldowns", END_COOLDOWNS_SECONDS, end_cooldowns_task))
        jobs.append(BeatJob("rebalance_fleet", REBALANCE_FLEET_SECONDS, rebalance_fleet_task))
        jobs.append(BeatJob("calibrate_memory_ratio", HOURLY, calibrate_memory_ratio_task))
        # A node back under its uuid: its restart record settles, or its lost data is
        # re-indexed (docs/operations.md, docs/scheduling.md).
        from zoekt.scheduling.lost_index_data import reindex_lost_index_data_task
        from zoekt.tasks import settle_node_shutdowns_task

        jobs.append(BeatJob("settle_node_shutdowns", SCHEDULING_PERIOD, settle_node_shutdowns_task))
        jobs.append(
            BeatJob("reindex_lost_index_data", SCHEDULING_PERIOD, reindex_lost_index_data_task)
        )
        return jobs

    def settings(self, **values: Any) -> None:
        """Set application settings (``zoekt_*`` columns) as an operator would."""
        from zoekt import app_settings

        app_settings.update(validate=True, **values)

    def load_catalog(self, namespaces: list, projects: list, statistics: list) -> dict:
        from zoekt.catalog import do_bulk_upsert_catalog

        return do_bulk_upsert_catalog(namespaces, projects, statistics)

    def enable(self, root_ids: Iterable[int], *, search: bool = True, label: str = "") -> None:
        """Enable root namespaces for indexing (and search), as the admin API does."""
        from zoekt import operator_actions

        ids = list(root_ids)
        for root_id in ids:
            operator_actions.do_enable_namespace(0, root_id, search=search)
        self.event(label or f"{len(ids)} namespaces enabled")

    def add_node(
        self,
        name: str,
        *,
        disk_total_bytes: int,
        disk_base_used_bytes: int = 0,
        memory_limit_bytes: int | None = None,
    ) -> ReplayNode:
        from django.conf import settings

        disk = DiskModel(free_delay=self.free_delay, clock=lambda: self.t)
        memory = NamespaceMemoryModel(
            per_shard_base_bytes=self.per_shard_base_bytes,
            hotness=self.hotness,
            default_hotness=self.default_hotness,
            memory_limit_bytes=memory_limit_bytes,
        )
        fake = FakeNode(
            FakeNodeConfig(
                base_url="http://127.0.0.1",
                secret=settings.GITLAB_SHELL_SECRETS[0],
                state_dir=self._state_dir,
                name=name,
                disk_total_bytes=disk_total_bytes,
                disk_base_used_bytes=disk_base_used_bytes,
                concurrency=self.node_concurrency,
                indexing_bytes_per_second=self.indexing_bytes_per_second,
                delete_task_seconds=self.delete_task_seconds,
                temporary_space_factor=self.temporary_space_factor,
                clock=lambda: self.t,
                seed=self.seed + len(self.nodes),
                index_size=self.index_size,
                disk_model=disk,
                namespace_memory=memory,
                transport=InProcessTransport(),
            )
        )
        node = ReplayNode(name=name, fake=fake, disk=disk, memory=memory)
        self.nodes[name] = node
        return node

    def stop_node(self, name: str) -> None:
        """The node stops (its process dies): no heartbeat, no callback from now on."""
        node = self.nodes[name]
        node.alive = False
        node.stopped_at = self.t
        self.event(f"{name} stopped")

    def start_node(self, name: str) -> None:
        """The stopped node's process starts again on the same disk: a new ``FakeNode`` on
        the replay's state directory, so it has the same uuid and holds, reports and serves
        what its holdings file lists (``FakeNode`` saves it when it stops, as an indexer
        restarted by its supervisor does). What the old process had in memory is gone:
        tasks it had accepted and not finished, callbacks not yet delivered, its disk
        model's deleted bytes not yet freed and spikes. Its first heartbeat is at the
        next tick."""
        node = self.nodes[name]
        if node.alive:
            raise ValueError(f"{name} is running; stop_node it first")
        node.fake.stop()
        node.built_before_bytes += node.fake.index_bytes_built
        disk = DiskModel(free_delay=self.free_delay, clock=lambda: self.t)
        config = dataclasses.replace(node.fake.config, disk_model=disk)
        node.fake = FakeNode(config)
        node.disk = disk
        node.alive = True
        node.started_at = self.t
        self.event(f"{name} started")

    def spike(self, name: str, extra_bytes: int, duration: float, *, ramp: float = 0.0) -> None:
        """Temporary data on a node's disk: ``extra_bytes`` growing over ``ramp`` seconds,
        cleared ``duration`` seconds from now (``DiskModel.inject_spike``)."""
        self.nodes[name].disk.inject_spike(extra_bytes, duration, ramp=ramp)

    def event(self, text: str) -> None:
        self.events.append((self.t, text))

    def watch(self, callback: Callable[[Replay], None]) -> None:
        """Call ``callback(replay)`` every tick at the instant the searches are drawn
        (after the nodes and the jobs ran, before the clock moves on), so what it reads
        is what a search would have seen; ``run``'s ``progress`` comes after the step."""
        self._watchers.append(callback)

    # --- running ------------------------------------------------------------------------

    def tick(self) -> None:
        """One step of simulated time: the nodes pull, beat's due jobs run, traffic is drawn."""
        from zoekt import clock

        for node in self.nodes.values():
            if node.alive:
                node.fake.step()
        for job in self.jobs:
            if job.due(self.t):
                job.last = self.t
                job.run()
                self.job_runs[job.name] += 1
        searches = dark = 0
        if self.traffic and (
            self._last_traffic is None or self.t - self._last_traffic >= self.traffic_every - 1e-9
        ):
            self._last_traffic = self.t
            result = self.draw_searches()
            searches, dark = result.searches, result.dark
        self.samples.append(self.sample(searches, dark))
        for callback in self._watchers:
            callback(self)
        self.t += self.tick_seconds
        clock.advance(self.tick_seconds)

    def run(
        self,
        seconds: float,
        *,
        until: Callable[[Replay], bool] | None = None,
        progress: Callable[[Replay], None] | None = None,
    ) -> bool:
        """Tick for ``seconds`` of simulated time, or until ``until(replay)`` holds (True then)."""
        end = self.t + seconds
        while self.t < end - 1e-9:
            self.tick()
            if progress is not None:
                progress(self)
            if until is not None and until(self):
                return True
        return False

    def draw_searches(self):
        from zoekt.search_targets import search_targets_many

        # Every namespace's answer at this instant, in four queries.
        answers = search_targets_many(self.traffic)
        return generate_searches(
            self.traffic,
            lambda ns: answers[ns].targets,
            self.searches_per_sample,
            seed=self.seed * 1_000_003 + len(self.samples),
        )

    def sample(self, searches: int = 0, dark: int = 0) -> Sample:
        nodes = {}
        for name, node in self.nodes.items():
            health = node.fake.process_health()["webserver"]
            nodes[name] = NodeSample(
                disk_used_bytes=node.fake.disk_used_bytes(),
                rss_bytes=int(health["rss_bytes"]),
                shards_loaded=int(health["shards_loaded"]),
                alive=node.alive,
            )
        return Sample(t=self.t, nodes=nodes, searches=searches, dark=dark)

    # --- what the control plane holds ------------------------------------------------------

    def converged(self) -> bool:
        """Every enabled namespace has all its replicas, each ready."""
        return fleet_state()["namespaces_short"] == 0

    def node_ids(self) -> dict[str, int | None]:
        return {name: node.fake.node_id for name, node in self.nodes.items()}


def fleet_state() -> dict[str, int]:
    """Counts of the fleet's placement state (a few queries)."""
    from django.db.models import Count, Q

    from zoekt.models import EnabledNamespace, Index, Replica

    enabled = EnabledNamespace.objects.annotate(
        ready=Count("replicas", filter=Q(replicas__state=Replica.State.READY))
    ).values_list("id", "number_of_replicas_override", "ready")
    from zoekt import app_settings

    default = app_settings.current().default_number_of_replicas
    short = sum(1 for _, override, ready in enabled if ready < (override or default))
    indices = dict(
        Index.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n")
    )
    return {
        "namespaces": len(enabled),
        "namespaces_short": short,
        "indices": sum(indices.values()),
        "indices_ready": indices.get(Index.State.READY, 0),
    }


def gib(value: float) -> float:
    return value / GIB
