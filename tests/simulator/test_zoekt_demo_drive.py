"""``manage.py zoekt_demo_drive``: the progress it counts and its loop, on a frozen clock.

``DemoDriver.tick(now)`` is called with a fake monotonic time; the rollout and
the scheduling pass are replaced by counters, so nothing sleeps and nothing
is enqueued. The database clock is frozen (``now`` fixture) and stepped with
``clock.advance`` where a node has to go offline.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from simulator.demoprogress import demo_progress
from simulator.management.commands.zoekt_demo_drive import (
    IDLE_CHECK_SECONDS,
    IN_DEMO,
    DemoDriver,
    Phase,
    clock_text,
    run_scheduling_pass,
)
from tests.factories import (
    EnabledNamespaceFactory,
    IndexFactory,
    NodeFactory,
    ReplicaFactory,
    RepositoryFactory,
)
from zoekt import app_settings, clock
from zoekt.models import Index, Replica, Repository
from zoekt.scheduling.service import TASKS

pytestmark = pytest.mark.django_db

URL = "http://127.0.0.1:8000/admin/dashboard/"


def node(name: str, *, seconds_ago: float = 0):
    return NodeFactory(
        metadata={"name": name, "concurrency": 4},
        last_seen_at=clock.now() - timedelta(seconds=seconds_ago),
    )


# --- demo_progress ----------------------------------------------------------------------------


def test_demo_progress_counts_nodes_namespaces_indices_and_repositories(now):
    a, b = node("zoekt-a"), node("zoekt-b")
    node("zoekt-gone", seconds_ago=31)  # offline: last seen over 30 s ago
    ready = ReplicaFactory(state=Replica.State.READY)
    # two pending replicas: not ready
    pending = ReplicaFactory(state=Replica.State.PENDING)
    ReplicaFactory(zoekt_enabled_namespace=pending.zoekt_enabled_namespace, state=0)
    EnabledNamespaceFactory()  # no replica yet
    # a ready replica and a pending one: ready
    two = ReplicaFactory(state=Replica.State.READY)
    ReplicaFactory(zoekt_enabled_namespace=two.zoekt_enabled_namespace, state=0)

    on_a = IndexFactory(zoekt_replica=ready, zoekt_node=a, state=Index.State.READY)
    IndexFactory(zoekt_replica=two, zoekt_node=a, state=Index.State.READY)
    on_b = IndexFactory(zoekt_replica=pending, zoekt_node=b, state=Index.State.PENDING)
    IndexFactory(zoekt_replica=two, zoekt_node=b, state=Index.State.INITIALIZING)
    RepositoryFactory(zoekt_index=on_a, state=Repository.State.READY)
    RepositoryFactory(zoekt_index=on_a, state=Repository.State.READY)
    RepositoryFactory(zoekt_index=on_b, state=Repository.State.PENDING)

    with CaptureQueriesContext(connection) as queries:
        progress = demo_progress()
    assert len(queries) == 4

    assert (progress.nodes, progress.nodes_online) == (3, 2)
    assert progress.enabled_namespaces == 4
    assert progress.namespaces_ready == 2
    assert progress.namespaces_without_replica == 1
    assert not progress.converged
    assert progress.indices["ready"] == 2
    assert progress.indices["pending"] == 1
    assert progress.indices["initializing"] == 1
    assert progress.indices["in_progress"] == 0  # every state is listed, zeros included
    assert progress.indices_per_node == {"zoekt-a": 2, "zoekt-b": 2}
    assert progress.ready_indices_per_node == {"zoekt-a": 2}
    assert (progress.repositories_ready, progress.repositories) == (2, 3)


def test_demo_progress_converges_when_every_enabled_namespace_has_a_ready_replica(now):
    assert not demo_progress().converged  # nothing enabled: nothing to converge to
    replica = ReplicaFactory(state=Replica.State.READY)
    assert demo_progress().converged
    other = ReplicaFactory()
    assert not demo_progress().converged
    other.state = Replica.State.READY
    other.save()
    progress = demo_progress()
    assert progress.converged
    assert progress.namespaces_ready == progress.enabled_namespaces == 2
    assert replica.zoekt_enabled_namespace_id != other.zoekt_enabled_namespace_id


# --- the driver -------------------------------------------------------------------------------


class Calls:
    def __init__(self) -> None:
        self.rollouts: list[float] = []
        self.kicks: list[float] = []
        self.lines: list[str] = []
        self.at = 0.0
        self.fail_rollout = False

    def rollout(self) -> dict:
        self.rollouts.append(self.at)
        if self.fail_rollout:
            raise RuntimeError("database went away")
        return {"outcome": "success", "namespaces_selected": 1, "nodes_available": 2}

    def schedule(self) -> list:
        self.kicks.append(self.at)
        return []


@pytest.fixture
def calls():
    return Calls()


def driver(calls: Calls, **overrides) -> DemoDriver:
    options = {
        "expected_nodes": 2,
        "wait_nodes_timeout": 120.0,
        "kick_every": 2.0,
        "rollout_every": 20.0,
        "report_every": 5.0,
        "dashboard_url": URL,
        "say": calls.lines.append,
        "rollout": calls.rollout,
        "schedule": calls.schedule,
    }
    options.update(overrides)
    return DemoDriver(**options)


def run(d: DemoDriver, calls: Calls, start: float, end: float, step: float = 1.0) -> None:
    """Tick every ``step`` fake seconds from ``start`` to ``end`` inclusive."""
    t = start
    while t <= end + 1e-9:
        calls.at = t
        d.tick(t)
        t += step


def test_it_waits_for_the_nodes_before_the_first_rollout(now, calls):
    EnabledNamespaceFactory()
    d = driver(calls)
    assert d.tick(0.0) == 1.0
    node("zoekt-0")
    run(d, calls, 1.0, 5.0)
    assert d.phase is Phase.WAITING
    assert calls.rollouts == [] and calls.kicks == []
    assert "[demo] 0:00  waiting for nodes: 0/2 online" in calls.lines
    assert "[demo] 0:03  waiting for nodes: 1/2 online" in calls.lines

    node("zoekt-1")
    calls.at = 6.0
    d.tick(6.0)
    assert d.phase is Phase.DRIVING
    assert calls.rollouts == [6.0] and calls.kicks == [6.0]  # at once, in the same pass
    assert "[demo] 0:06  2/2 nodes online; rolling out" in calls.lines
    assert any(line.startswith("[demo] 0:06  rollout: success;") for line in calls.lines)


def test_after_the_timeout_it_goes_on_with_the_nodes_it_has(now, calls):
    EnabledNamespaceFactory()
    node("zoekt-0")
    d = driver(calls, expected_nodes=5, wait_nodes_timeout=120.0)
    run(d, calls, 0.0, 119.0)
    assert d.phase is Phase.WAITING and calls.rollouts == []
    calls.at = 120.0
    d.tick(120.0)
    assert d.phase is Phase.DRIVING and calls.rollouts == [120.0]
    assert any("only 1 of 5 nodes online after 120 s; going on" in line for line in calls.lines)


def test_it_kicks_every_two_seconds_and_rolls_out_every_twenty_while_a_namespace_lacks_a_replica(
    now, calls
):
    node("zoekt-0"), node("zoekt-1")
    enabled = EnabledNamespaceFactory()
    d = driver(calls)
    run(d, calls, 0.0, 45.0)
    assert calls.kicks == [float(t) for t in range(0, 46, 2)]
    assert calls.rollouts == [0.0, 20.0, 40.0]

    # the namespace got its replica: no more rollouts, the kicks go on
    ReplicaFactory(zoekt_enabled_namespace=enabled, namespace=enabled.root_namespace)
    run(d, calls, 46.0, 90.0)
    assert calls.rollouts == [0.0, 20.0, 40.0]
    assert calls.kicks[-1] == 90.0
    assert d.phase is Phase.DRIVING


def test_the_sleep_it_asks_for_reaches_the_next_kick(now, calls):
    node("zoekt-0"), node("zoekt-1")
    EnabledNamespaceFactory()
    d = driver(calls)
    assert d.tick(0.0) == 2.0
    assert d.tick(0.5) == 1.5  # no kick at 0.5 s: sleep until the one due at 2 s
    assert calls.kicks == [0.0]


def test_it_prints_progress_every_five_seconds(now, calls):
    node("zoekt-0"), node("zoekt-1")
    ReplicaFactory()  # pending: not converged
    d = driver(calls)
    run(d, calls, 0.0, 12.0)
    progress = [line for line in calls.lines if "namespaces ready" in line]
    assert [line.split()[1] for line in progress] == ["0:00", "0:05", "0:10"]
    assert progress[0] == (
        "[demo] 0:00  nodes 2/2 online  namespaces ready 0/1  "
        "indices pending 0 · in_progress 0 · initializing 0 · ready 0  repositories ready 0/0"
    )


def test_it_converges_then_stops_kicking_and_prints_only_changes(now, calls):
    a, b = node("zoekt-a"), node("zoekt-b")
    replica = ReplicaFactory()
    IndexFactory(zoekt_replica=replica, zoekt_node=a, state=Index.State.READY)
    IndexFactory(zoekt_replica=replica, zoekt_node=b, state=Index.State.PENDING)
    get_user_model().objects.create_superuser("ops", email="", password="x")
    d = driver(calls)
    run(d, calls, 0.0, 71.0)
    assert d.phase is Phase.DRIVING

    Index.objects.filter(zoekt_node=b).update(state=Index.State.READY)
    replica.state = Replica.State.READY
    replica.save()
    calls.at = 72.0
    assert d.tick(72.0) == IDLE_CHECK_SECONDS
    assert d.phase is Phase.CONVERGED and d.converged_after == 72.0
    # The dashboard URL, then who signs in and how to reset its password: the password
    # printed at start scrolled away minutes ago.
    assert calls.lines[-4:] == [
        f"[demo] converged in 1:12: 1/1 namespaces ready on 2 nodes; dashboard at {URL}",
        "[demo] ready indices per node: zoekt-a 1 · zoekt-b 1",
        "[demo] sign in as 'ops' (its password was printed once, when it was created); "
        f"to set a new one: {IN_DEMO} changepassword ops",
        f"[demo] try an incident in a second terminal: {IN_DEMO} zoekt_demo_incident "
        "spike|overfill|hot|drain",
    ]

    kicks, rollouts, printed = len(calls.kicks), len(calls.rollouts), len(calls.lines)
    run(d, calls, 82.0, 200.0, step=IDLE_CHECK_SECONDS)
    assert (len(calls.kicks), len(calls.rollouts), len(calls.lines)) == (
        kicks,
        rollouts,
        printed,
    )

    clock.advance(31)  # every node falls silent: one line says so
    d.tick(210.0)
    d.tick(220.0)
    assert len(calls.lines) == printed + 1
    assert "[demo] 3:30  nodes 0/2 online" in calls.lines[-1]
    assert len(calls.kicks) == kicks  # converged: beat alone from here


def test_a_failed_rollout_is_printed_and_the_loop_goes_on(now, calls):
    node("zoekt-0"), node("zoekt-1")
    EnabledNamespaceFactory()
    calls.fail_rollout = True
    d = driver(calls)
    run(d, calls, 0.0, 20.0)
    assert "[demo] 0:00  rollout failed: RuntimeError: database went away" in calls.lines
    assert calls.rollouts == [0.0, 20.0]  # tried again
    assert len(calls.kicks) == 11


def test_clock_text():
    assert clock_text(0) == "0:00"
    assert clock_text(72.9) == "1:12"
    assert clock_text(600) == "10:00"


def test_a_scheduling_pass_runs_every_scheduled_task_in_process(now):
    row = app_settings.load_row()
    row.zoekt_indexing_enabled = True
    row.save()
    pending = IndexFactory(zoekt_node=node("zoekt-0"), state=Index.State.PENDING)
    results = run_scheduling_pass()
    assert [result["task"] for result in results] == list(TASKS)
    (initial,) = [result for result in results if result["task"] == "initial_indexing"]
    assert initial["index_ids"] == [pending.id]
