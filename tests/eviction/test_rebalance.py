"""The rebalance reconciler (``eviction.rebalance``) against the real database: off when its
setting is off; two empty nodes joining a fleet at 70 % get moves towards them on the nodes the
desired balance named; its throttle holds across runs; it stands aside, saying why, for a node
over a high watermark, a shutdown, or an eviction or drain move; no index moves twice in 24
hours; a second run starts no duplicate; a joining fleet converges with every namespace served
at every step; a node's first heartbeat enqueues it once."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from eviction import balance_data, moves, rebalance
from eviction.beat import REBALANCE_FLEET_SECONDS
from eviction.tasks import rebalance_fleet_task
from tests.api.helpers import NodeAPI, heartbeat_body
from tests.eviction.test_balance_data import full_fleet
from tests.eviction.test_drain import served
from tests.eviction.test_manual_moves import memory_planning_on, snapshot
from tests.factories import (
    GIB,
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ReplicaFactory,
)
from zoekt import actions, app_settings, clock, drains, shutdowns
from zoekt.models import Index, Move, Node, Replica
from zoekt.reasons import Reason
from zoekt.scheduling import handlers

pytestmark = pytest.mark.django_db

REBALANCE = moves.REBALANCE


def rebalance_moves():
    return Move.objects.filter(trigger=REBALANCE)


def live_rebalance_moves() -> int:
    return rebalance_moves().filter(state__in=Move.LIVE).count()


def one_index_on(holder: Node, used_gib: float) -> Index:
    enabled = EnabledNamespaceFactory(root_namespace=GroupFactory())
    return IndexFactory(
        zoekt_replica=ReplicaFactory(zoekt_enabled_namespace=enabled, state=Replica.State.READY),
        zoekt_node=holder,
        state=Index.State.READY,
        used_storage_bytes=int(used_gib * GIB),
        reserved_storage_bytes=int(used_gib * GIB / 0.6),
    )


def finish_building() -> None:
    """What the targets' callbacks and the replica-state job do once they indexed: the
    replacement is ready, holding the source's bytes."""
    for move in Move.objects.filter(state=Move.State.BUILDING):
        Index.objects.filter(id=move.replacement_index_id).update(
            state=Index.State.READY, used_storage_bytes=move.bytes
        )
    actions.do_update_replica_states()


def report_disks() -> None:
    """Each node's heartbeat, as its disk would say: the bytes of the indices it still holds
    (an index on its way out is deleted by the node), kept online."""
    for node in Node.objects.all():
        held = (
            Index.objects.filter(zoekt_node=node)
            .exclude(state__in=drains.LEAVING_STATES)
            .values_list("used_storage_bytes", flat=True)
        )
        Node.objects.filter(pk=node.pk).update(used_bytes=sum(held), last_seen_at=clock.now())


@pytest.fixture
def joining(now) -> list[Node]:
    """Three nodes at 70 % in indices of 10 GiB; two empty ones just joined."""
    return full_fleet()


# --- off, and on ---------------------------------------------------------------------------


def test_it_is_on_by_default():
    assert app_settings.current().rebalance_enabled is True
    assert app_settings.current().rebalance_max_moves == 2


def test_with_the_setting_off_it_does_nothing(joining):
    app_settings.update(zoekt_rebalance_enabled=False)
    before = snapshot()

    assert rebalance.run_rebalance() == {"skipped": Reason.REBALANCE_DISABLED}

    assert snapshot() == before


def test_two_empty_nodes_joining_a_fleet_at_70_percent_get_moves_towards_them(joining):
    new = {joining[3].id, joining[4].id}

    done = rebalance.run_rebalance()

    assert done["live"] == 0 and done["slots"] == 2 and done["planned"] == 8
    assert len(done["started"]) == 2 and done["waiting"] is None
    started = list(rebalance_moves().order_by("id"))
    assert [m.id for m in started] == done["started"]
    for move in started:
        assert move.state == Move.State.BUILDING
        assert move.target_node_id in new
        assert move.details["planned_target_node_id"] == move.target_node_id
        assert move.source_node_id in {n.id for n in joining[:3]}
        planned = move.details["balance"]
        assert planned["reason"] == Reason.REBALANCE_BUSIEST_NODE
        assert planned["index_id"] == move.source_index_ref
        assert planned["source_after"] < planned["source_before"]
        assert planned["target_after"] < planned["source_before"] * (1 - planned["margin"])
        assert planned["busiest_after"] <= planned["busiest_before"]
    # Both new nodes receive: the first two moves of the plan go one to each.
    assert {m.target_node_id for m in started} == new


def test_the_moves_are_the_first_of_the_desired_balance_in_its_order(joining):
    _fleet, balance = balance_data.current_balance()

    rebalance.run_rebalance()

    started = rebalance_moves().order_by("id")
    expected = [(m.index_id, m.from_node_id, m.to_node_id) for m in balance.moves[:2]]
    assert [(m.source_index_ref, m.source_node_id, m.target_node_id) for m in started] == expected


# --- the throttle, and running twice -------------------------------------------------------


def test_a_second_run_starts_nothing_more_while_its_moves_are_live(joining):
    rebalance.run_rebalance()
    before = snapshot()

    again = rebalance.run_rebalance()

    assert again["live"] == 2 and again["slots"] == 0 and again["started"] == []
    assert again["planned"] is None  # the balance is not even computed
    assert snapshot() == before


def test_a_stale_plan_started_again_is_refused_by_the_move_lease(joining, now):
    fleet, balance = balance_data.current_balance()
    rebalance.run_rebalance()
    before = snapshot()

    # A second run racing the first (were the lock not there), with the moves the first
    # started: the database refuses each second live move of an index.
    stale = dataclasses.replace(balance, moves=balance.moves[:2])
    done = rebalance.Pass(slots=2)
    rebalance._start_moves(stale, fleet.options.disk_ceiling, done, app_settings.current(), now)

    assert done.started == [] and done.already_moving == [m.index_id for m in balance.moves[:2]]
    assert snapshot() == before


def test_the_move_throttles_decide_when_a_rebalance_move_builds(joining):
    app_settings.update(zoekt_move_max_in_cluster=1)

    done = rebalance.run_rebalance()

    assert len(done["started"]) == 1 and done["waiting"] is not None
    waiting = Move.objects.get(pk=done["waiting"])
    assert (waiting.state, waiting.reason) == (Move.State.PLANNED, Reason.MOVE_THROTTLED)
    assert live_rebalance_moves() == 2  # the waiting move holds its slot
    assert rebalance.run_rebalance()["started"] == []


def test_its_own_throttle_caps_the_moves_planned_or_building(joining):
    app_settings.update(zoekt_rebalance_max_moves=1)

    assert len(rebalance.run_rebalance()["started"]) == 1
    assert rebalance.run_rebalance()["started"] == []
    assert live_rebalance_moves() == 1


def test_a_node_that_filled_since_the_plan_gets_no_move_and_the_next_goes_ahead(joining, now):
    fleet, balance = balance_data.current_balance()
    first = balance.moves[0]
    Node.objects.filter(pk=first.to_node_id).update(used_bytes=69 * GIB)

    done = rebalance.Pass(slots=1)
    rebalance._start_moves(balance, fleet.options.disk_ceiling, done, app_settings.current(), now)

    assert done.no_target == [first.index_id]
    assert not rebalance_moves().filter(source_index_ref=first.index_id).exists()
    assert len(done.started) == 1
    assert Move.objects.get(pk=done.started[0]).source_index_ref == balance.moves[1].index_id


# --- standing aside ------------------------------------------------------------------------


def _over_high_watermark(nodes):
    Node.objects.filter(pk=nodes[0].pk).update(used_bytes=80 * GIB)
    return {"node_ids": [nodes[0].id], "move_ids": []}


def _over_high_memory_watermark(nodes):
    memory_planning_on(100 * GIB)
    health = {"process_health": {"webserver": {"rss_bytes": 80 * GIB}}}
    Node.objects.filter(pk=nodes[1].pk).update(metadata={"name": "hot", **health})
    return {"node_ids": [nodes[1].id], "move_ids": []}


def _restarting(nodes):
    shutdowns.do_request_node_shutdown(
        nodes[2].id, type="restart", reason="kernel update", requested_by="ops"
    )
    return {"node_ids": [nodes[2].id], "move_ids": []}


def _removing(nodes):
    shutdowns.do_request_node_shutdown(nodes[3].id, type="remove", reason="fewer", requested_by="x")
    return {"node_ids": [nodes[3].id], "move_ids": []}


def _live_move(trigger: str):
    def setup(nodes):
        index = Index.objects.filter(zoekt_node=nodes[0]).order_by("id").first()
        move = Move.objects.create(
            **Move.fields_from_source(index, trigger, clock.now()), state=Move.State.PLANNED
        )
        return {"node_ids": [], "move_ids": [move.id]}

    return setup


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        pytest.param(
            _over_high_watermark, Reason.REBALANCE_NODE_OVER_HIGH_WATERMARK, id="over-high"
        ),
        pytest.param(
            _over_high_memory_watermark,
            Reason.REBALANCE_NODE_OVER_HIGH_MEMORY_WATERMARK,
            id="over-high-memory",
        ),
        pytest.param(_restarting, Reason.REBALANCE_NODE_SHUTTING_DOWN, id="a-restart"),
        pytest.param(_removing, Reason.REBALANCE_NODE_SHUTTING_DOWN, id="a-remove"),
        pytest.param(
            _live_move("node_level"), Reason.REBALANCE_EVICTION_MOVING, id="an-eviction-move"
        ),
        pytest.param(
            _live_move("memory_pressure"),
            Reason.REBALANCE_EVICTION_MOVING,
            id="a-memory-pressure-move",
        ),
        pytest.param(_live_move("drain"), Reason.REBALANCE_DRAIN_MOVING, id="a-drain-move"),
    ],
)
def test_it_stands_aside_saying_why(joining, setup, reason):
    expected = setup(joining)
    before = snapshot()

    done = rebalance.run_rebalance()

    assert done == {"standing_aside": {"reason": str(reason), **expected}}
    assert snapshot() == before
    state = rebalance.reconciler_state(app_settings.current(), clock.now())
    assert state["standing_aside"] is True and state["standing_aside_reason"] == reason


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        pytest.param("zoekt_indexing_enabled", Reason.INDEXING_DISABLED, id="indexing-disabled"),
        pytest.param("zoekt_indexing_paused", Reason.INDEXING_PAUSED, id="indexing-paused"),
    ],
)
def test_it_stands_aside_while_no_replacement_could_be_built(joining, setting, reason):
    app_settings.update(**{setting: setting == "zoekt_indexing_paused"})
    before = snapshot()

    done = rebalance.run_rebalance()

    assert done == {"standing_aside": {"reason": str(reason), "node_ids": [], "move_ids": []}}
    assert snapshot() == before


def test_a_move_by_hand_does_not_hold_it_back(joining):
    index = Index.objects.filter(zoekt_node=joining[0]).order_by("id").first()
    Move.objects.create(
        **Move.fields_from_source(index, moves.MANUAL, clock.now()), state=Move.State.PLANNED
    )

    done = rebalance.run_rebalance()

    assert len(done["started"]) == 2
    assert index.id not in rebalance_moves().values_list("source_index_ref", flat=True)


# --- the 24-hour rule ----------------------------------------------------------------------


@pytest.fixture
def moved_once(now):
    """``big`` (40 GiB, alone on a 100 GiB node) was moved there by the reconciler: its
    move was planned 30 hours ago and done 23 hours ago. An empty 200 GiB node would take
    it."""
    holder = NodeFactory(total_bytes=100 * GIB, used_bytes=40 * GIB)
    NodeFactory(total_bytes=200 * GIB, used_bytes=0)
    big = one_index_on(holder, 40)
    record = Move.objects.create(
        **{
            **Move.fields_from_source(big, REBALANCE, now - timedelta(hours=30)),
            "source_index": None,
            "source_index_ref": big.id + 1000,
        },
        state=Move.State.DONE,
        replacement_index=big,
        building_at=now - timedelta(hours=29),
        done_at=now - timedelta(hours=23),
    )
    return big, record


def _online_again() -> None:
    Node.objects.update(last_seen_at=clock.now())


def test_an_index_the_reconciler_moved_is_not_moved_again_within_24_hours(moved_once):
    big, record = moved_once
    before = snapshot()

    done = rebalance.run_rebalance()

    assert done["planned"] == 0 and done["started"] == []
    assert snapshot() == before
    report = rebalance.balance_report()[2]
    assert report["last_24_hours"]["pinned_index_ids"] == [big.id, record.source_index_ref]
    assert report["converged"] is True


def test_it_is_eligible_again_24_hours_after_its_move(moved_once):
    big, _record = moved_once
    clock.advance(timedelta(hours=1, seconds=1).total_seconds())
    _online_again()

    done = rebalance.run_rebalance()

    assert done["planned"] == 1 and len(done["started"]) == 1
    assert Move.objects.get(pk=done["started"][0]).source_index_ref == big.id


def test_a_redundant_move_is_counted_in_the_window(moved_once, now):
    big, record = moved_once
    again = Move.objects.create(
        **Move.fields_from_source(big, REBALANCE, now), state=Move.State.DONE, done_at=now
    )

    window = rebalance.last_24_hours(now)

    assert window["redundant_moves"] == 1 and window["redundant_move_ids"] == [again.id]
    assert window["moves"] == 2 and window["moves_done"] == 2
    assert window["bytes_moved"] == record.bytes + again.bytes


# --- converging ----------------------------------------------------------------------------


def test_a_joining_fleet_converges_within_the_throttle_with_every_namespace_served(joining):
    namespaces = sorted(Index.objects.values_list("zoekt_enabled_namespace_id", flat=True))
    everything = {ns: True for ns in namespaces}
    assert served(namespaces) == everything
    steps = 0
    while True:
        steps += 1
        assert steps < 30, "the reconciler does not converge"
        done = rebalance.run_rebalance()
        if done.get("converged") and live_rebalance_moves() == 0:
            break
        for step in (
            lambda: None,
            moves.advance_moves,
            finish_building,
            moves.advance_moves,
            handlers.orphan_indices,
            handlers.delete_indices,
            # The beat entry's period later, each node's heartbeat: a node that gave up an
            # index is settled (balance_data.settling_nodes) by the next run.
            lambda: (clock.advance(REBALANCE_FLEET_SECONDS), report_disks()),
        ):
            step()
            assert live_rebalance_moves() <= 2, step
            assert served(namespaces) == everything, step

    made = rebalance_moves()
    assert set(made.values_list("state", flat=True)) == {Move.State.DONE}
    assert made.count() == 8  # the desired balance's 8 moves, none twice
    window = rebalance.last_24_hours(clock.now())
    assert window["redundant_moves"] == 0 and window["moves_done"] == 8
    per_node = {
        node.id: Index.objects.filter(zoekt_node=node, state=Index.State.READY).count()
        for node in joining
    }
    assert sorted(per_node.values()) == [4, 4, 4, 4, 5]
    assert rebalance.balance_report()[1].converged


# --- a node joining ------------------------------------------------------------------------


def test_a_new_node_enqueues_the_reconciler_once(
    client, now, monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(
        rebalance_fleet_task, "apply_async", lambda *args, **kwargs: sent.append(args)
    )
    api = NodeAPI(client)
    node_uuid = "3f0c51e4-5a8a-4e4f-9a35-53f1a1e8b0c1"

    with django_capture_on_commit_callbacks(execute=True):
        assert api.heartbeat(node_uuid).status_code == 200
    assert len(sent) == 1

    clock.advance(10)
    with django_capture_on_commit_callbacks(execute=True):
        assert api.heartbeat(node_uuid, heartbeat_body()).status_code == 200
    assert len(sent) == 1  # an existing node's heartbeat enqueues nothing
    assert Node.objects.count() == 1


# --- settling ------------------------------------------------------------------------------


def test_a_node_that_gave_up_an_index_sheds_nothing_until_it_has_settled(joining):
    first = rebalance.run_rebalance()
    sources = set(
        Move.objects.filter(id__in=first["started"]).values_list("source_node_id", flat=True)
    )
    for step in (moves.advance_moves, finish_building, moves.advance_moves, report_disks):
        step()
    assert set(rebalance_moves().values_list("state", flat=True)) == {Move.State.DONE}

    second = rebalance.run_rebalance()

    # Its reported disk may still count the deleted copy: it looks fuller than it is.
    assert set(second["settling"]) == sources
    started = Move.objects.filter(id__in=second["started"])
    assert not set(started.values_list("source_node_id", flat=True)) & sources
    assert second["converged"] is False
    assert rebalance.balance_report()[2]["reconciler"]["settling_node_ids"] == sorted(sources)

    clock.advance(balance_data.SETTLE_SECONDS + 1)
    report_disks()
    assert not balance_data.settling_nodes(clock.now()) & sources
