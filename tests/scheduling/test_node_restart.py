"""A node restarted within its allowed delay keeps everything; past it, today's rules apply.

The fleet runs on the simulated clock: heartbeats go through the node API,
and every minute the whole scheduling service (every task, throttles off, its
events run at once), the lost-index-data check and the shutdown settle job
run, as beat would. GitLab.com's lost-node threshold of 10 minutes.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from tests.api.helpers import GIB, HOST, NodeAPI, heartbeat_body
from tests.factories import NodeFactory
from tests.scheduling import builders
from tests.scheduling.conftest import set_setting
from zoekt import clock, shutdowns
from zoekt.models import Index, Node, NodeShutdown, Replica, Repository, Task
from zoekt.reasons import Reason
from zoekt.scheduling import events, handlers
from zoekt.scheduling.lost_index_data import check_lost_index_data
from zoekt.scheduling.service import TASKS, SchedulingService

pytestmark = pytest.mark.django_db

MIB = 1024**2
REPO_BYTES = 20 * MIB
REPOS_PER_INDEX = 3
INDICES = 2
HELD = INDICES * REPOS_PER_INDEX * REPO_BYTES  # 120 MiB: what the node's ready indices hold
LOST_AFTER = "10m"


@pytest.fixture
def node_api(db) -> NodeAPI:
    return NodeAPI(Client(HTTP_HOST=HOST))


@pytest.fixture
def fleet(now, node_api):
    """Node ``a`` holds two ready one-replica namespaces; node ``b`` is the rest of the fleet.
    Indexing on, lost after 10 minutes; both heartbeat once and the jobs run once."""
    set_setting(zoekt_indexing_enabled=True, zoekt_lost_node_threshold=LOST_AFTER)
    a = NodeFactory(metadata={"name": "zoekt-a", "concurrency": 4})
    b = NodeFactory(metadata={"name": "zoekt-b", "concurrency": 4})
    fields = {"state": Index.State.READY, "used_storage_bytes": REPOS_PER_INDEX * REPO_BYTES}
    for index in builders.indices(INDICES, a, **fields):
        builders.repositories(
            index, REPOS_PER_INDEX, state=Repository.State.READY, size_bytes=REPO_BYTES
        )
    Replica.objects.filter(indices__zoekt_node=a).update(state=Replica.State.READY)
    fleet = Fleet(node_api, a, b)
    clock.advance(60)  # past the heartbeat's 5 s debounce of the rows just made
    fleet.beat(a)
    fleet.beat(b)
    fleet.jobs()
    return fleet


class Fleet:
    def __init__(self, node_api: NodeAPI, a: Node, b: Node):
        self.api = node_api
        self.a = a
        self.b = b
        self.tasks_handed_to_a: list[dict] = []

    def beat(self, node: Node, indexed_bytes: int = HELD) -> dict:
        body = heartbeat_body(
            {
                "node.name": node.name,
                "node.url": node.index_base_url,
                "disk.indexed": indexed_bytes,
                "disk.all": 100 * GIB,
                "disk.used": 10 * GIB,
            }
        )
        response = self.api.heartbeat(node.uuid, body)
        assert response.status_code == 200, response.content
        reply = response.json()
        if node.id == self.a.id:
            self.tasks_handed_to_a.extend(reply["tasks"])
        return reply

    @staticmethod
    def jobs() -> None:
        """One minute of beat: every scheduled task and its events, then the two node jobs."""

        def run_now(event: str, args: tuple) -> None:
            events.task_for(event)(*args)

        service = SchedulingService(bypass_throttle=True, dispatch=run_now)
        for name in TASKS:
            service.execute(name)
        check_lost_index_data()
        shutdowns.do_settle_node_shutdowns()

    def minutes(self, count: int, *, a_beats: bool = False, a_bytes: int = HELD) -> None:
        """``count`` minutes: ``b`` (and ``a`` when it is up) heartbeat, then the jobs run."""
        for _ in range(count):
            for _ in range(3):  # a heartbeat every 20 s: online all along
                clock.advance(20)
                self.beat(self.b)
                if a_beats:
                    self.beat(self.a, a_bytes)
            self.jobs()


def holdings(node: Node) -> dict:
    """What the node holds and was given: the things a restart must not change."""
    return {
        "indices": sorted(Index.objects.filter(zoekt_node=node).values_list("id", "state")),
        "repositories": sorted(
            Repository.objects.filter(zoekt_index__zoekt_node=node).values_list("id", "state")
        ),
        "tasks": sorted(Task.objects.filter(zoekt_node_id=node.id).values_list("id", "state")),
    }


def restart(node: Node, **kwargs) -> NodeShutdown:
    return shutdowns.do_request_node_shutdown(
        node.id, type="restart", reason="Zoekt upgrade", requested_by="ops", **kwargs
    )


def record(shutdown: NodeShutdown) -> NodeShutdown:
    return NodeShutdown.objects.get(pk=shutdown.pk)


# --- within the delay: nothing lost, nothing re-indexed -------------------------------------------


def test_a_node_restarted_within_its_delay_keeps_every_index_and_gets_no_new_task(fleet):
    before = holdings(fleet.a)
    last_beat = Node.objects.get(pk=fleet.a.pk).last_seen_at
    shutdown = restart(fleet.a)

    fleet.minutes(20)  # away for 20 minutes: twice the lost-node threshold
    reply = fleet.beat(fleet.a)  # back, with its bytes
    fleet.minutes(3, a_beats=True)

    assert Node.objects.filter(pk=fleet.a.pk).exists()
    assert holdings(fleet.a) == before
    assert reply["truncate"] is False
    assert fleet.tasks_handed_to_a == []
    done = record(shutdown)
    assert (done.status, done.status_reason) == ("complete", Reason.NODE_RETURNED)
    assert done.node_left_at == last_beat
    assert done.details == {"reported_bytes": HELD, "expected_bytes": HELD}


def test_the_record_completes_on_the_heartbeat_that_brings_the_node_back(fleet):
    last_beat = Node.objects.get(pk=fleet.a.pk).last_seen_at
    shutdown = restart(fleet.a)
    clock.advance(5 * 60)  # away five minutes; no job has looked

    fleet.beat(fleet.a)

    done = record(shutdown)
    assert (done.status, done.status_reason) == ("complete", Reason.NODE_RETURNED)
    assert (done.node_left_at, done.node_returned_at, done.completed_at) == (
        last_beat,
        clock.now(),
        clock.now(),
    )


def test_a_node_back_without_its_data_is_left_alone_until_the_delay_passes_then_reindexed(fleet):
    before = holdings(fleet.a)
    shutdown = restart(fleet.a, allowed_delay=15 * 60)

    fleet.minutes(5)
    fleet.minutes(9, a_beats=True, a_bytes=0)  # back with nothing: not the same node's data

    assert record(shutdown).status == "in_progress"
    assert record(shutdown).node_returned_at is not None
    assert holdings(fleet.a) == before  # the lost-index-data check left it alone

    fleet.minutes(4, a_beats=True, a_bytes=0)

    done = record(shutdown)
    assert (done.status, done.status_reason) == ("complete", Reason.RESTART_DELAY_EXPIRED)
    assert done.details["node_online"] is True
    # From then on today's rule: the lost-index-data check re-indexed the node.
    assert set(Index.objects.filter(zoekt_node=fleet.a).values_list("state", flat=True)) != {
        Index.State.READY
    }


def test_a_node_that_never_left_completes_at_the_end_of_the_delay(fleet):
    before = holdings(fleet.a)
    shutdown = restart(fleet.a, allowed_delay=10 * 60)

    fleet.minutes(9, a_beats=True)
    assert record(shutdown).status == "in_progress"
    fleet.minutes(2, a_beats=True)

    done = record(shutdown)
    assert (done.status, done.status_reason, done.node_left_at) == (
        "complete",
        Reason.NODE_NEVER_LEFT,
        None,
    )
    assert holdings(fleet.a) == before


# --- the delay passes: today's lost-node handling -------------------------------------------------


def test_when_the_delay_passes_the_node_is_handled_as_lost_and_the_record_says_so(fleet):
    a_id = fleet.a.id
    shutdown = restart(fleet.a, allowed_delay=15 * 60)

    fleet.minutes(14)
    assert Node.objects.filter(pk=a_id).exists()  # past the lost threshold, within the delay

    fleet.minutes(2)

    assert not Node.objects.filter(pk=a_id).exists()
    assert not Index.objects.filter(zoekt_node_id=a_id).exists()
    done = record(shutdown)
    assert (done.status, done.status_reason, done.node_id, done.node_ref) == (
        "complete",
        Reason.RESTART_DELAY_EXPIRED,
        None,
        a_id,
    )
    assert "handled_as_lost_at" in done.details


def test_lost_node_handling_closes_a_record_whose_delay_passed_before_the_settle_job_ran(fleet):
    shutdown = restart(fleet.a, allowed_delay=11 * 60)
    clock.advance(12 * 60)
    fleet.beat(fleet.b)

    result = handlers.delete_lost_node(fleet.a.id)

    assert result["node_deleted"] is True
    assert result["shutdowns_closed"] == [shutdown.id]
    done = record(shutdown)
    assert (done.status, done.status_reason) == ("complete", Reason.RESTART_DELAY_EXPIRED)


def test_delete_lost_node_rechecks_the_restart_inside_its_transaction(fleet):
    clock.advance(11 * 60)  # lost
    restart(fleet.a)  # requested after the check chose the node, before the handler runs
    before = holdings(fleet.a)

    result = handlers.delete_lost_node(fleet.a.id)

    assert result["skipped"] == Reason.NODE_IN_RESTART
    assert holdings(fleet.a) == before


def test_a_cancelled_restart_gives_the_node_back_to_lost_node_handling(fleet):
    restart(fleet.a)
    fleet.minutes(11)
    assert Node.objects.filter(pk=fleet.a.pk).exists()

    shutdowns.do_cancel_node_shutdown(fleet.a.id, cancelled_by="ops")
    fleet.minutes(1)

    assert not Node.objects.filter(pk=fleet.a.pk).exists()


# --- safe to run twice ----------------------------------------------------------------------------


def test_settling_again_and_beating_again_change_a_completed_record_no_more(fleet):
    shutdown = restart(fleet.a)
    fleet.minutes(3)
    fleet.beat(fleet.a)
    done = record(shutdown)

    shutdowns.do_settle_node_shutdowns()
    shutdowns.do_settle_node_shutdowns()
    clock.advance(60)
    fleet.beat(fleet.a)

    again = record(shutdown)
    assert (again.status, again.completed_at, again.updated_at, again.details) == (
        done.status,
        done.completed_at,
        done.updated_at,
        done.details,
    )


def test_the_settle_job_records_the_node_away_once(fleet):
    last_beat = Node.objects.get(pk=fleet.a.pk).last_seen_at
    shutdown = restart(fleet.a)
    clock.advance(120)

    first = shutdowns.do_settle_node_shutdowns()
    clock.advance(60)
    second = shutdowns.do_settle_node_shutdowns()

    assert first["outcomes"] == {"node_left": 1}
    assert second["outcomes"] == {"waiting": 1}
    assert record(shutdown).node_left_at == last_beat


# --- nothing new placed on it, nothing evicted or moved from or to it ----------------------------


def test_the_planner_takes_no_candidate_node_that_is_restarting(fleet):
    from planner.selection import SelectionService

    restart(fleet.b)

    nodes = {node.id for node in SelectionService().nodes()}

    assert fleet.b.id not in nodes
    shutdowns.do_cancel_node_shutdown(fleet.b.id, cancelled_by="ops")
    assert fleet.b.id in {node.id for node in SelectionService().nodes()}


def test_no_move_goes_to_a_node_that_is_restarting(fleet):
    from eviction import moves
    from zoekt import app_settings

    index = Index.objects.filter(zoekt_node=fleet.a).first()
    choose = lambda: moves.choose_target(  # noqa: E731
        index, 1, ceiling=0.9, settings=app_settings.current(), now=clock.now()
    )[0]
    assert choose() == fleet.b

    restart(fleet.b)

    assert choose() is None


def test_node_level_eviction_leaves_a_restarting_node_alone(fleet):
    from eviction import actions as eviction_actions

    set_setting(zoekt_node_level_eviction_enabled=True)
    Node.objects.filter(pk=fleet.a.pk).update(
        used_bytes=95 * GIB, high_watermark_exceeded_at=clock.now() - timedelta(days=1)
    )
    restart(fleet.a)
    before = holdings(fleet.a)

    result = eviction_actions.run_node_level()

    assert result["skipped"] == Reason.CONDITION_NOT_MET
    assert holdings(fleet.a) == before


def test_the_lost_nodes_check_passes_over_a_restarting_node_to_the_next_lost_one(
    fleet, service, dispatched
):
    other = NodeFactory(last_seen_at=clock.now())
    clock.advance(11 * 60)
    fleet.beat(fleet.b)
    restart(fleet.a)  # a has the lower id: GitLab's check would take it first

    result = service().execute("lost_nodes_check")

    assert dispatched == [("delete_lost_node", (other.id,))]
    assert result["lost_node_id"] == other.id


# --- the settle job -------------------------------------------------------------------------------


def test_the_settle_job_runs_every_minute_from_beat():
    from config.celery import BEAT_SCHEDULE
    from config.celery import app as celery_app

    assert BEAT_SCHEDULE["settle-node-shutdowns"] == {
        "task": "zoekt.settle_node_shutdowns",
        "schedule": 60.0,
        "options": {"expires": 60},
    }
    assert "zoekt.settle_node_shutdowns" in celery_app.tasks


def test_the_settle_job_skips_while_another_run_holds_its_lock(fleet):
    from tests.locking import advisory_lock_held_elsewhere
    from zoekt.locks import LockKey
    from zoekt.tasks import settle_node_shutdowns_task

    shutdown = restart(fleet.a, allowed_delay=60)
    clock.advance(120)

    with advisory_lock_held_elsewhere(LockKey.SETTLE_NODE_SHUTDOWNS):
        result = settle_node_shutdowns_task()

    assert result == {"skipped": Reason.LOCK_HELD}
    assert record(shutdown).status == "in_progress"
    assert settle_node_shutdowns_task()["completed"] == [
        {"shutdown_id": shutdown.id, "node_id": fleet.a.id, "reason": "restart_delay_expired"}
    ]
