"""A node that reports far fewer indexed bytes than its ready indices hold gets them re-indexed.

The rule (docs/scheduling.md, *Lost index data*): a shortfall is a reported
``disk.indexed`` below half of the used bytes of the node's ready indices and
at least 16 MiB short; a node seen healthy once is armed; an armed node's
shortfall that is still there at a check 2 minutes after it was first seen,
reported by a newer heartbeat, re-indexes the node's ready indices.
Heartbeats here go through the real upsert, so the check's state in the
node's metadata has to survive them.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta

import pytest

from config.celery import BEAT_SCHEDULE
from config.celery import app as celery_app
from tests.factories import NodeFactory
from tests.scheduling import builders
from tests.scheduling.conftest import set_setting
from zoekt import actions, clock
from zoekt.models import Index, Node, Replica, Repository, Task
from zoekt.reasons import Reason
from zoekt.scheduling import handlers
from zoekt.scheduling.lost_index_data import (
    HEALTHY,
    METADATA_KEY,
    MIN_MISSING_BYTES,
    NOT_ARMED,
    NOT_CONFIRMED,
    NOT_JUDGED,
    REINDEX,
    SHORTFALL_SEEN,
    SHORTFALL_WAITING,
    SUSTAIN_SECONDS,
    Reading,
    check_lost_index_data,
    decide,
    reindex_lost_index_data_task,
)
from zoekt.search_targets import search_targets

pytestmark = pytest.mark.django_db

MIB = 1024**2
REPO_BYTES = 20 * MIB
REPOS_PER_INDEX = 3
INDICES = 2
HELD = INDICES * REPOS_PER_INDEX * REPO_BYTES  # 120 MiB


# --- the fleet -----------------------------------------------------------------------------


def heartbeat(node: Node, indexed_bytes: int) -> None:
    """The node's heartbeat through the real upsert, 5 s after the last one (its debounce)."""
    clock.advance(5)
    actions.do_record_heartbeat(
        node.uuid,
        {
            "node.name": node.name,
            "node.url": node.index_base_url,
            "disk.all": node.total_bytes,
            "disk.used": node.used_bytes,
            "disk.indexed": indexed_bytes,
        },
    )


def ready_node(*, indices: int = INDICES, repo_bytes: int = REPO_BYTES, **index_fields) -> Node:
    """A node whose ready indices (each its own namespace, its replica ready) hold ready repos."""
    node = NodeFactory(metadata={"name": "zoekt-lost", "concurrency": 4})
    fields = {"state": Index.State.READY, "used_storage_bytes": REPOS_PER_INDEX * repo_bytes}
    fields.update(index_fields)
    for index in builders.indices(indices, node, **fields):
        builders.repositories(
            index, REPOS_PER_INDEX, state=Repository.State.READY, size_bytes=repo_bytes
        )
    Replica.objects.filter(indices__zoekt_node=node).update(state=Replica.State.READY)
    return node


def snapshot(node: Node) -> dict:
    """Everything the check could change, for the nothing-changed assertions."""
    return {
        "indices": sorted(Index.objects.filter(zoekt_node=node).values_list("id", "state")),
        "repositories": sorted(
            Repository.objects.filter(zoekt_index__zoekt_node=node).values_list("id", "state")
        ),
        "replicas": sorted(
            Replica.objects.filter(indices__zoekt_node=node).values_list("id", "state")
        ),
        "tasks": Task.objects.count(),
    }


def check_state(node: Node) -> dict:
    return Node.objects.get(pk=node.pk).metadata.get(METADATA_KEY) or {}


def decisions(result: dict) -> dict:
    return result["decisions"]


def arm(node: Node) -> None:
    """The node reports what its ready indices hold, and a check sees it healthy."""
    heartbeat(node, HELD)
    assert decisions(check_lost_index_data()).get(HEALTHY)
    assert check_state(node)["armed"] is True


def lose_data(node: Node) -> dict:
    """The node heartbeats with nothing for long enough; returns the check that re-indexed."""
    heartbeat(node, 0)
    assert decisions(check_lost_index_data()).get(SHORTFALL_SEEN) == 1
    clock.advance(SUSTAIN_SECONDS / 2 - 5)
    heartbeat(node, 0)
    assert decisions(check_lost_index_data()).get(SHORTFALL_WAITING) == 1
    clock.advance(SUSTAIN_SECONDS / 2 - 5)
    heartbeat(node, 0)
    return check_lost_index_data()


@pytest.fixture
def searching(db):
    set_setting(zoekt_indexing_enabled=True, zoekt_search_enabled=True)


# --- re-indexing ---------------------------------------------------------------------------


def test_a_node_that_lost_its_data_has_its_ready_indices_rebuilt(now, searching):
    node = ready_node()
    namespaces = sorted(
        Index.objects.filter(zoekt_node=node).values_list("namespace_id", flat=True)
    )
    assert all(search_targets(ns).search_enabled for ns in namespaces)
    arm(node)

    result = lose_data(node)

    assert decisions(result) == {REINDEX: 1}
    assert result["reindexed"] == {"indexed_bytes_shortfall": 1}
    assert result["indices_reindexed"] == INDICES
    assert result["repositories_reset"] == INDICES * REPOS_PER_INDEX
    (done,) = result["nodes_reindexed"]
    assert done == {
        "node_id": node.id,
        "node_name": "zoekt-lost",
        "reason": Reason.INDEXED_BYTES_SHORTFALL,
        "reported_bytes": 0,
        "expected_bytes": HELD,
        "held_bytes": HELD,
        "indices_reindexed": INDICES,
        "repositories_reset": INDICES * REPOS_PER_INDEX,
        "replicas_marked_pending": INDICES,
    }
    # The existing state machine takes it from here: indices initializing, repositories pending.
    assert set(Index.objects.filter(zoekt_node=node).values_list("state", flat=True)) == {
        Index.State.INITIALIZING
    }
    repositories = Repository.objects.filter(zoekt_index__zoekt_node=node)
    assert set(repositories.values_list("state", flat=True)) == {Repository.State.PENDING}
    assert set(Replica.objects.values_list("state", flat=True)) == {Replica.State.PENDING}
    for ns in namespaces:
        assert search_targets(ns).reason == Reason.NO_READY_REPLICA
    # The decision is written down on the node, with its reason code.
    state = check_state(node)
    assert state["armed"] is False
    assert state["last_reindex"] == {
        "at": clock.now().isoformat(),
        "reason": "indexed_bytes_shortfall",
        "reported_bytes": 0,
        "expected_bytes": HELD,
        "held_bytes": HELD,
        "indices": INDICES,
        "repositories": INDICES * REPOS_PER_INDEX,
    }
    # repo_to_index_check hands every repository to the node again.
    handlers.index_repos()
    tasks = Task.objects.filter(zoekt_node_id=node.id)
    assert tasks.count() == INDICES * REPOS_PER_INDEX
    assert set(tasks.values_list("task_type", flat=True)) == {Task.TaskType.INDEX_REPO}
    assert set(repositories.values_list("state", flat=True)) == {Repository.State.INITIALIZING}


def test_running_the_check_again_changes_nothing(now, searching):
    node = ready_node()
    arm(node)
    lose_data(node)
    before = snapshot(node)
    state = check_state(node)
    for _ in range(3):
        clock.advance(SUSTAIN_SECONDS)
        heartbeat(node, 0)
        result = check_lost_index_data()
        assert result["reindexed"] == {}
        assert decisions(result) == {NOT_JUDGED: 1}  # nothing ready any more
    assert snapshot(node) == before
    assert check_state(node) == state


def test_a_rebuilt_node_is_armed_again_and_a_second_loss_is_noticed(now, searching):
    node = ready_node()
    arm(node)
    lose_data(node)
    # The node indexes everything again; the indices and replicas become ready.
    Repository.objects.filter(zoekt_index__zoekt_node=node).update(state=Repository.State.READY)
    handlers.mark_indices_ready()
    actions.do_update_replica_states()
    heartbeat(node, 0)
    assert decisions(check_lost_index_data()) == {NOT_ARMED: 1}  # not reported yet: waits
    arm(node)
    assert check_state(node)["armed"] is True
    assert decisions(lose_data(node)) == {REINDEX: 1}


def test_a_lost_node_with_another_ready_copy_is_searched_there_while_it_rebuilds(now, searching):
    lost = ready_node(indices=1)
    (index,) = Index.objects.filter(zoekt_node=lost)
    other = NodeFactory()
    copy = Replica.objects.create(
        zoekt_enabled_namespace_id=index.zoekt_enabled_namespace_id,
        namespace_id=index.namespace_id,
        state=Replica.State.READY,
    )
    Index.objects.create(
        zoekt_enabled_namespace_id=index.zoekt_enabled_namespace_id,
        zoekt_replica=copy,
        zoekt_node=other,
        namespace_id=index.namespace_id,
        state=Index.State.READY,
    )
    heartbeat(other, 0)
    heartbeat(lost, HELD // 2)
    assert search_targets(index.namespace_id).targets[0].node_id == lost.id
    arm(lost)

    assert lose_data(lost)["reindexed"] == {"indexed_bytes_shortfall": 1}

    heartbeat(other, 0)  # a node with nothing ready reporting nothing is fine
    assert decisions(check_lost_index_data()).get(REINDEX) is None
    (target,) = search_targets(index.namespace_id).targets
    assert (target.node_id, target.replica_id) == (other.id, copy.id)


# --- nothing to do -------------------------------------------------------------------------


def reports_correctly(node: Node) -> None:
    arm(node)
    for _ in range(4):
        clock.advance(SUSTAIN_SECONDS / 2)
        heartbeat(node, HELD)
        check_lost_index_data()


def reports_zero_once(node: Node) -> None:
    arm(node)
    heartbeat(node, 0)
    assert decisions(check_lost_index_data()) == {SHORTFALL_SEEN: 1}
    clock.advance(SUSTAIN_SECONDS / 2)
    heartbeat(node, HELD)
    assert decisions(check_lost_index_data()) == {HEALTHY: 1}
    clock.advance(SUSTAIN_SECONDS)
    heartbeat(node, HELD)
    check_lost_index_data()
    assert check_state(node) == {"armed": True}


def reports_zero_between_checks(node: Node) -> None:
    arm(node)
    for reported in (0, HELD, 0, HELD, 0, HELD):
        clock.advance(SUSTAIN_SECONDS / 2)
        heartbeat(node, reported)
        if reported:
            check_lost_index_data()  # each check finds a good reading


def reports_a_little_less(node: Node) -> None:
    arm(node)
    for _ in range(4):
        clock.advance(SUSTAIN_SECONDS / 2)
        heartbeat(node, int(HELD * 0.6))
        assert decisions(check_lost_index_data()) == {HEALTHY: 1}


def never_reported_its_bytes(node: Node) -> None:
    """A node that never sent disk.indexed (optional in GitLab's API) is never armed."""
    for _ in range(4):
        clock.advance(SUSTAIN_SECONDS / 2)
        heartbeat(node, 0)
        assert decisions(check_lost_index_data()) == {NOT_ARMED: 1}
    assert check_state(node) == {}


def stops_heartbeating_after_zero(node: Node) -> None:
    arm(node)
    heartbeat(node, 0)
    check_lost_index_data()
    clock.advance(SUSTAIN_SECONDS)  # offline: no newer heartbeat, no check of it
    assert decisions(check_lost_index_data()) == {}


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(reports_correctly, id="a node that reports its bytes correctly"),
        pytest.param(reports_zero_once, id="a node that reports 0 indexed bytes once"),
        pytest.param(reports_zero_between_checks, id="readings of 0 that no check sees"),
        pytest.param(reports_a_little_less, id="a node reporting 60 % of its indices' bytes"),
        pytest.param(never_reported_its_bytes, id="a node never seen reporting its bytes"),
        pytest.param(stops_heartbeating_after_zero, id="a node that went offline after a 0"),
    ],
)
def test_nothing_is_reindexed_for(now, searching, scenario):
    node = ready_node()
    before = snapshot(node)
    scenario(node)
    assert snapshot(node) == before
    assert "last_reindex" not in check_state(node)


@pytest.mark.parametrize(
    ("label", "make"),
    [
        (
            "a node with nothing ready",
            lambda: ready_node(state=Index.State.INITIALIZING),
        ),
        (
            "a node whose ready indices hold less than the minimum",
            lambda: ready_node(indices=1, repo_bytes=(MIN_MISSING_BYTES - 1) // REPOS_PER_INDEX),
        ),
    ],
)
def test_nothing_is_reindexed_for_a_node_with_too_little_ready(now, searching, label, make):
    node = make()
    before = snapshot(node)
    for _ in range(4):
        clock.advance(SUSTAIN_SECONDS / 2)
        heartbeat(node, 0)
        assert decisions(check_lost_index_data()) == {NOT_JUDGED: 1}, label
    assert snapshot(node) == before
    assert check_state(node) == {}


def test_a_shortfall_the_repositories_do_not_show_is_not_reindexed(now, searching):
    """Stale used bytes (the repositories went since the last refresh) are no lost data."""
    node = ready_node(repo_bytes=MIB, used_storage_bytes=HELD)
    Node.objects.filter(pk=node.pk).update(
        metadata={**node.metadata, METADATA_KEY: {"armed": True}}
    )
    before = snapshot(node)
    result = lose_data(node)
    assert decisions(result) == {NOT_CONFIRMED: 1}
    assert result["reindexed"] == {}
    assert snapshot(node) == before
    assert check_state(node) == {"armed": True}


@pytest.mark.django_db(transaction=True)
def test_a_node_claimed_by_another_run_is_left_to_it(now, searching):
    node = ready_node()
    arm(node)
    heartbeat(node, 0)
    check_lost_index_data()
    clock.advance(SUSTAIN_SECONDS)
    heartbeat(node, 0)
    at = clock.now()
    claimed, release = threading.Event(), threading.Event()

    def other_run() -> None:
        from django.db import connection, transaction

        with transaction.atomic():
            Node.objects.select_for_update().get(pk=node.pk)
            claimed.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=other_run)
    thread.start()
    claimed.wait(10)
    try:
        with clock.frozen(at):
            result = check_lost_index_data()
    finally:
        release.set()
        thread.join(10)
    assert decisions(result) == {"node_claimed_or_gone": 1}
    assert result["reindexed"] == {}
    assert Index.objects.filter(state=Index.State.READY).count() == INDICES
    # Once the other run let go, the check re-indexes the node once.
    with clock.frozen(at):
        assert check_lost_index_data()["reindexed"] == {"indexed_bytes_shortfall": 1}
        assert check_lost_index_data()["reindexed"] == {}


# --- the decision, alone -------------------------------------------------------------------

T0 = clock.EPOCH + timedelta(days=20000)


@pytest.mark.parametrize(
    ("label", "reported", "expected", "state", "seconds_later", "heartbeat_later", "decision"),
    [
        ("healthy arms", 100 * MIB, 100 * MIB, {}, 0, True, HEALTHY),
        ("half is healthy", 50 * MIB, 100 * MIB, {}, 0, True, HEALTHY),
        ("too little ready to judge", 0, MIN_MISSING_BYTES - 1, {}, 0, True, NOT_JUDGED),
        ("missing less than the minimum", 0, MIN_MISSING_BYTES - 1, {"armed": True}, 0, True,
         NOT_JUDGED),
        ("a shortfall, never armed", 0, 100 * MIB, {}, 0, True, NOT_ARMED),
        ("a shortfall, first seen", 0, 100 * MIB, {"armed": True}, 0, True, SHORTFALL_SEEN),
        ("seen, too recently", 0, 100 * MIB, "seen", SUSTAIN_SECONDS - 1, True,
         SHORTFALL_WAITING),
        ("seen, no newer heartbeat", 0, 100 * MIB, "seen", SUSTAIN_SECONDS, False,
         SHORTFALL_WAITING),
        ("seen, sustained", 49 * MIB, 100 * MIB, "seen", SUSTAIN_SECONDS, True, REINDEX),
    ],
)  # fmt: skip
def test_decide(label, reported, expected, state, seconds_later, heartbeat_later, decision):
    if state == "seen":
        state = {
            "armed": True,
            "shortfall_since": T0.isoformat(),
            "shortfall_heartbeat_at": T0.isoformat(),
        }
    now = T0 + timedelta(seconds=seconds_later)
    reading = Reading(reported, expected, now if heartbeat_later else T0)
    got, _ = decide(reading, state, now)
    assert got == decision, label


def test_a_good_reading_forgets_the_first_sighting():
    seen = {"armed": True, "shortfall_since": T0.isoformat(), "shortfall_heartbeat_at": "x"}
    _, state = decide(Reading(100 * MIB, 100 * MIB, T0), seen, T0)
    assert state == {"armed": True}


# --- the job -------------------------------------------------------------------------------


def test_the_job_runs_every_minute_from_beat():
    assert BEAT_SCHEDULE["reindex-lost-index-data"] == {
        "task": "zoekt.reindex_lost_index_data",
        "schedule": 60.0,
        "options": {"expires": 60},
    }
    assert "zoekt.reindex_lost_index_data" in celery_app.tasks


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"zoekt_indexing_enabled": False}, Reason.INDEXING_DISABLED),
        ({"zoekt_indexing_enabled": True, "zoekt_indexing_paused": True}, Reason.INDEXING_PAUSED),
    ],
)
def test_the_job_does_nothing_while_indexing_is_off_or_paused(now, settings, reason):
    set_setting(**settings)
    node = ready_node()
    Node.objects.filter(pk=node.pk).update(
        metadata={
            **node.metadata,
            METADATA_KEY: {
                "armed": True,
                "shortfall_since": (now - timedelta(hours=1)).isoformat(),
                "shortfall_heartbeat_at": (now - timedelta(hours=1)).isoformat(),
            },
        }
    )
    before = snapshot(node)
    assert reindex_lost_index_data_task() == {"skipped": reason}
    assert snapshot(node) == before


def records(caplog, event: str) -> list[dict]:
    return [
        record.msg
        for record in caplog.records
        if isinstance(record.msg, dict) and record.msg.get("event") == event
    ]


def test_the_job_logs_one_line_and_counts_the_reindexed_nodes_by_reason(now, searching, caplog):
    caplog.set_level(logging.INFO)
    healthy = ready_node()
    lost = ready_node()
    heartbeat(healthy, HELD)
    arm(lost)
    heartbeat(lost, 0)
    reindex_lost_index_data_task()
    for _ in range(2):
        clock.advance(SUSTAIN_SECONDS / 2 - 5)
        heartbeat(healthy, HELD)
        heartbeat(lost, 0)
        result = reindex_lost_index_data_task()

    assert result["nodes_checked"] == 2
    assert result["decisions"] == {HEALTHY: 1, REINDEX: 1}
    assert result["reindexed"] == {"indexed_bytes_shortfall": 1}
    assert [item["node_id"] for item in result["nodes_reindexed"]] == [lost.id]
    lines = records(caplog, "reindex_lost_index_data")
    assert len(lines) == 3
    assert lines[-1]["reindexed"] == {"indexed_bytes_shortfall": 1}
    json.dumps(lines[-1], default=str)
    (warning,) = records(caplog, "node_index_data_lost")
    assert warning["reason"] == "indexed_bytes_shortfall"
    assert warning["node_id"] == lost.id
    assert Index.objects.filter(zoekt_node=healthy, state=Index.State.READY).count() == INDICES
