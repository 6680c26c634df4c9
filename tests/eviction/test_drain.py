"""Draining a node (``remove``, ``replace``; ``eviction.drain``) against the real database: the
node is emptied by the move machinery with every project range served at every step, biggest
first within the throttles; it takes nothing new; a replace lands on its named node (or falls
back, saying why); a cancel leaves every move finished or rolled back; a pass killed at any
step leaves nothing half-written, and the next one converges."""

from __future__ import annotations

import pytest

from eviction import actions as eviction
from eviction import drain, moves
from planner.rollout import RolloutService
from tests.eviction.conftest import beat
from tests.factories import GIB, EnabledNamespaceFactory, GroupFactory, NodeFactory
from zoekt import actions, app_settings, clock, drains, shutdowns
from zoekt.models import Index, Move, Node, NodeShutdown, Replica
from zoekt.reasons import Reason
from zoekt.scheduling import handlers
from zoekt.search_targets import search_targets

pytestmark = pytest.mark.django_db

Status = NodeShutdown.Status


@pytest.fixture(autouse=True)
def _moves_on(_eviction_on):
    app_settings.update(zoekt_eviction_moves=True)


def node(name: str, used_gib: float = 10, total_gib: int = 100) -> Node:
    created = NodeFactory(
        total_bytes=total_gib * GIB, used_bytes=int(used_gib * GIB), metadata={"name": name}
    )
    return beat(created, int(used_gib * GIB), seconds=0)


def keep_online(*nodes: Node) -> None:
    for each in nodes:
        each.refresh_from_db()
        beat(each, each.used_bytes, seconds=1)


def index(
    where: Node,
    used_gib: float,
    *,
    replica=None,
    enabled=None,
    low=None,
    high=None,
    state=Index.State.READY,
) -> Index:
    """An index on ``where`` (in ``replica``, else in a new replica of ``enabled``, else of a
    new enabled namespace), covering ``low``..``high`` (open ends when None)."""
    if replica is None:
        enabled = enabled or EnabledNamespaceFactory(root_namespace=GroupFactory())
        replica = Replica.objects.create(
            zoekt_enabled_namespace=enabled,
            namespace_id=enabled.root_namespace_id,
            state=Replica.State.READY,
        )
    metadata = {}
    if low is not None:
        metadata["project_namespace_id_from"] = low
    if high is not None:
        metadata["project_namespace_id_to"] = high
    return Index.objects.create(
        zoekt_enabled_namespace=replica.zoekt_enabled_namespace,
        zoekt_replica=replica,
        zoekt_node=where,
        namespace_id=replica.namespace_id,
        state=state,
        used_storage_bytes=int(used_gib * GIB),
        reserved_storage_bytes=int(used_gib * GIB / 0.6),
        metadata=metadata,
    )


def served(enabled_ids) -> dict[int, bool]:
    """Whether each namespace's search has somewhere to go (the coverage routing)."""
    out = {}
    for enabled in enabled_ids:
        root = (
            Index.objects.filter(zoekt_enabled_namespace_id=enabled)
            .values_list("namespace_id", flat=True)
            .first()
        )
        out[enabled] = search_targets(root).search_enabled
    return out


def finish_building() -> list[int]:
    """What the targets' callbacks and the replica-state job do once they indexed."""
    ids = list(
        Move.objects.filter(state=Move.State.BUILDING).values_list(
            "replacement_index_id", flat=True
        )
    )
    Index.objects.filter(id__in=ids).update(state=Index.State.READY)
    actions.do_update_replica_states()
    return ids


def remove(target: Node, **fields) -> NodeShutdown:
    return shutdowns.do_request_node_shutdown(
        target.id,
        type=fields.pop("type", "remove"),
        reason="fewer nodes",
        requested_by="ops",
        **fields,
    )


@pytest.fixture
def fleet(now):
    """``drained`` holds a one-replica namespace (8 GiB), another (3 GiB), one copy of a
    two-replica namespace (5 GiB, the other on ``a``) and the lower range of a split one
    (2 GiB, the upper on ``b``); ``c`` holds a namespace of its own."""
    nodes = {name: node(name) for name in ("drained", "a", "b", "c")}
    drained, a, b, c = (nodes[n] for n in ("drained", "a", "b", "c"))
    one_big = index(drained, 8)
    one_small = index(drained, 3)
    two = index(drained, 5)
    index(a, 5, enabled=two.zoekt_enabled_namespace)
    lower = index(drained, 2, high=1000)
    index(b, 2, replica=lower.zoekt_replica, low=1001)
    index(c, 4)
    namespaces = sorted(
        Index.objects.values_list("zoekt_enabled_namespace_id", flat=True).distinct()
    )
    return {
        **nodes,
        "namespaces": namespaces,
        "by_size": [one_big, two, one_small, lower],
    }


def _all_online(fleet) -> None:
    keep_online(*(fleet[n] for n in ("drained", "a", "b", "c")))


# --- emptying the node -------------------------------------------------------------------------


def test_a_drain_empties_the_node_with_every_range_covered_at_every_step(fleet):
    drained = fleet["drained"]
    record = remove(drained)
    everything = {ns: True for ns in fleet["namespaces"]}
    assert served(fleet["namespaces"]) == everything

    steps = 0
    while NodeShutdown.objects.get(pk=record.pk).live:
        steps += 1
        assert steps < 20, "the drain does not converge"
        for step in (
            drain.run_drains,
            lambda: _all_online(fleet),
            moves.advance_moves,
            finish_building,
            moves.advance_moves,
            handlers.orphan_indices,
            handlers.delete_indices,
        ):
            step()
            assert served(fleet["namespaces"]) == everything, step

    record.refresh_from_db()
    assert (record.status, record.status_reason) == (Status.COMPLETE, Reason.NODE_DRAINED)
    assert not Index.objects.filter(zoekt_node=drained).exists()
    drain_moves = Move.objects.filter(trigger="drain").order_by("building_at", "id")
    assert set(drain_moves.values_list("state", flat=True)) == {Move.State.DONE}
    assert drain_moves.count() == 4
    assert not Move.objects.filter(target_node=drained).exists()
    # Biggest first: the first two moves (the per-source throttle's two slots) are the two
    # biggest indices, and the moves started in size order.
    assert [m.source_index_ref for m in drain_moves] == [i.id for i in fleet["by_size"]]
    assert all(m.details["shutdown_id"] == record.id for m in drain_moves)
    progress = drains.drain_progress(record)
    assert progress["indices_left"] == 0 and progress["moves_done"] == 4
    assert progress["bytes_moved"] == 18 * GIB and progress["eta_seconds"] == 0


def test_moves_start_only_as_throttle_slots_free_and_one_waits(fleet):
    record = remove(fleet["drained"])

    drain.run_drains()

    states = dict(Move.objects.values_list("source_index_ref", "state"))
    one_big, two, one_small, lower = fleet["by_size"]
    assert states == {
        one_big.id: Move.State.BUILDING,
        two.id: Move.State.BUILDING,
        one_small.id: Move.State.PLANNED,  # waits for a slot, holding its lease
    }
    # Run again (twice): nothing more is created while one waits.
    assert drain.drain_node(record.id) == Status.IN_PROGRESS
    drain.run_drains()
    assert Move.objects.count() == 3
    assert lower.id not in set(Move.objects.values_list("source_index_ref", flat=True))


def test_the_progress_reports_the_rate_and_an_eta_from_done_moves(fleet, now):
    record = remove(fleet["drained"])
    assert drains.drain_progress(record) == {
        "indices_left": 4,
        "indices_to_move": 4,
        "bytes_left": 18 * GIB,
        "moves_in_flight": 0,
        "moves_done": 0,
        "moves_parked": 0,
        "bytes_moved": 0,
        "first_move_started_at": None,
        "observed_rate_bytes_per_second": None,
        "eta_seconds": None,
        "moves_done_on_target": None,
    }
    drain.run_drains()
    started = clock.now()
    clock.advance(800)
    _all_online(fleet)
    finish_building()
    moves.advance_moves()  # the two biggest swap: 13 GiB done, the third starts

    progress = drains.drain_progress(record)
    elapsed = (clock.now() - started).total_seconds()
    assert progress["moves_done"] == 2 and progress["bytes_moved"] == 13 * GIB
    assert progress["moves_in_flight"] == 1
    assert progress["first_move_started_at"] == started
    # Both sources are evicted (on their way out): 5 GiB left to move, of 4 rows left.
    assert progress["indices_left"] == 4 and progress["indices_to_move"] == 2
    assert progress["bytes_left"] == 5 * GIB
    rate = 13 * GIB / elapsed
    assert progress["observed_rate_bytes_per_second"] == round(rate, 3)
    assert progress["eta_seconds"] == -(-5 * GIB // rate)


# --- nothing new on a draining node ------------------------------------------------------------


def test_a_draining_node_takes_no_new_placement(now):
    drained = node("drained", 1, total_gib=1000)  # by far the roomiest
    other = node("other", 10)
    app_settings.update(zoekt_default_number_of_replicas=1)
    remove(drained)
    enabled = EnabledNamespaceFactory(root_namespace=GroupFactory())

    RolloutService().execute(dry_run=False, batch_size=10)

    placed = set(
        Index.objects.filter(zoekt_enabled_namespace=enabled).values_list(
            "zoekt_node_id", flat=True
        )
    )
    assert placed == {other.id}
    assert set(Node.objects.in_shutdown(now).values_list("id", flat=True)) == {drained.id}


def test_a_drained_node_stays_out_until_an_operator_returns_it(now):
    drained, other = node("drained"), node("other")
    record = remove(drained)
    drain.run_drains()
    record.refresh_from_db()
    assert (record.status, record.status_reason) == (Status.COMPLETE, Reason.NODE_DRAINED)
    assert Node.objects.in_shutdown(now).filter(pk=drained.pk).exists()

    returned = shutdowns.do_cancel_node_shutdown(drained.id, cancelled_by="ops-erin")

    assert returned.id == record.id and returned.status == Status.COMPLETE
    assert (returned.returned_to_service_by, returned.returned_to_service_at) == ("ops-erin", now)
    assert not Node.objects.in_shutdown(now).filter(pk=drained.pk).exists()
    with pytest.raises(shutdowns.ObjectNotFound):
        shutdowns.do_cancel_node_shutdown(drained.id, cancelled_by="ops-erin")
    assert other.id in set(Node.objects.not_in_shutdown(now).values_list("id", flat=True))


def test_no_eviction_is_chosen_from_a_draining_node_and_no_move_goes_to_it(now):
    hot = node("hot", 50)
    drained = node("drained", 1, total_gib=1000)
    roomy = node("roomy", 1)
    index(hot, 10)
    index(drained, 10)
    hot = beat(hot, 80 * GIB)
    drained = beat(drained, 800 * GIB)
    hot = beat(hot, 80 * GIB, seconds=9 * 3600)
    drained = beat(drained, 800 * GIB, seconds=0)
    beat(roomy, GIB, seconds=0)
    remove(drained)

    result = eviction.run_node_level()

    assert result["nodes_over_high_watermark"] == 1  # not the draining node
    (move,) = Move.objects.filter(trigger="node_level")
    assert (move.source_node_id, move.target_node_id) == (hot.id, roomy.id)
    assert not Move.objects.filter(trigger="node_level", source_node=drained).exists()


def test_no_move_goes_to_a_draining_node_though_it_is_the_roomiest(now):
    hot = node("hot", 50)
    drained = node("drained", 1, total_gib=1000)
    other = node("other", 30)
    index(hot, 10)
    hot = beat(hot, 80 * GIB)
    hot = beat(hot, 80 * GIB, seconds=9 * 3600)
    keep_online(drained, other)
    remove(drained)

    eviction.run_node_level()

    assert Move.objects.get().target_node_id == other.id
    source = Index.objects.get(zoekt_node=hot)
    facts = moves.target_facts(
        source, GIB, [drained], ceiling=0.7, settings=app_settings.current(), now=clock.now()
    )
    assert moves.target_refusal(drained, facts) == Reason.MOVE_TARGET_SHUTTING_DOWN
    # Drained and not returned to service, it stays refused; returned, it is a target.
    record = NodeShutdown.objects.get()
    record.transition(Status.COMPLETE, clock.now(), status_reason=Reason.NODE_DRAINED)
    facts = moves.target_facts(
        source, GIB, [drained], ceiling=0.7, settings=app_settings.current(), now=clock.now()
    )
    assert moves.target_refusal(drained, facts) == Reason.MOVE_TARGET_SHUTTING_DOWN
    shutdowns.do_cancel_node_shutdown(drained.id, cancelled_by="ops")
    facts = moves.target_facts(
        source, GIB, [drained], ceiling=0.7, settings=app_settings.current(), now=clock.now()
    )
    assert moves.target_refusal(drained, facts) is None


def test_a_replacement_building_on_the_node_when_the_drain_starts_is_turned_back(now):
    hot = node("hot", 50)
    soon_drained = node("soon-drained", 1)
    other = node("other", 5)
    index(hot, 10)
    hot = beat(hot, 80 * GIB)
    hot = beat(hot, 80 * GIB, seconds=9 * 3600)
    keep_online(soon_drained, other)
    eviction.run_node_level()
    move = Move.objects.get()
    assert move.target_node_id == soon_drained.id
    built = move.replacement_replica_id
    remove(soon_drained)

    drain.run_drains()

    move.refresh_from_db()
    assert (move.state, move.reason) == (Move.State.PLANNED, Reason.MOVE_TARGET_SHUTTING_DOWN)
    assert move.details["failed_targets"] == [soon_drained.id]
    assert not Replica.objects.filter(pk=built).exists()
    keep_online(hot, soon_drained, other)
    assert moves.advance_move(move.id) == Move.State.BUILDING
    move.refresh_from_db()
    assert move.target_node_id == other.id


# --- replace -----------------------------------------------------------------------------------


def test_replace_places_every_move_on_the_named_node(fleet):
    app_settings.update(zoekt_move_max_per_target=5, zoekt_move_max_per_source=5)
    new = node("new", 1, total_gib=500)
    record = remove(fleet["drained"], type="replace", target_node_id=new.id)

    drain.run_drains()

    started = Move.objects.filter(trigger="drain")
    assert started.count() == 4
    assert set(started.values_list("target_node_id", flat=True)) == {new.id}
    assert all("replace_fallback" not in m.details for m in started)
    _all_online(fleet)
    keep_online(new)
    finish_building()
    moves.advance_moves()
    assert drains.drain_progress(record)["moves_done_on_target"] == 4


def test_replace_falls_back_to_the_balanced_choice_where_the_named_node_cannot_take_it(fleet):
    app_settings.update(zoekt_move_max_per_source=5)
    # The named node is ``a``: it holds the two-replica namespace's other copy.
    a = fleet["a"]
    record = remove(fleet["drained"], type="replace", target_node_id=a.id)
    one_big, two, one_small, _lower = fleet["by_size"]

    drain.run_drains()

    moved = {m.source_index_ref: m for m in Move.objects.filter(trigger="drain")}
    fallback = moved[two.id]
    assert fallback.target_node_id not in (a.id, fleet["drained"].id)
    assert fallback.details["replace_fallback"]["reason"] == Reason.REPLACE_TARGET_DOES_NOT_FIT
    assert fallback.details["replace_fallback"]["refused_by"] == Reason.MOVE_TARGET_HOLDS_NAMESPACE
    assert "planned_target_node_id" not in fallback.details
    # The others go to the named node (two at a time: its per-target throttle).
    on_target = [m for m in moved.values() if m.target_node_id == a.id]
    assert [m.source_index_ref for m in on_target] == [one_big.id, one_small.id]
    assert record.id == fallback.details["shutdown_id"]


def test_replace_falls_back_when_the_named_node_lacks_the_disk(fleet):
    small = node("small", 1, total_gib=10)  # 70 % of 10 GiB: 7 GiB, less the 1 GiB used
    remove(fleet["drained"], type="replace", target_node_id=small.id)

    drain.run_drains()

    big = Move.objects.get(source_index_ref=fleet["by_size"][0].id)
    assert big.details["replace_fallback"]["refused_by"] == Reason.MOVE_TARGET_NO_DISK_ROOM
    assert big.target_node_id != small.id
    second = Move.objects.get(source_index_ref=fleet["by_size"][1].id)
    assert second.target_node_id == small.id  # 5 GiB fits


# --- stalled, and indices that are not ready -----------------------------------------------------


def test_an_index_with_nowhere_to_go_stalls_the_drain_until_a_node_has_room(now):
    drained = node("drained", 60)
    full = node("full", 69)
    stuck = index(drained, 30)
    record = remove(drained)

    assert drain.drain_node(record.id) == Status.STALLED

    record.refresh_from_db()
    assert record.status_reason == Reason.DRAIN_NO_TARGET
    assert record.details["no_target_index_ids"] == [stuck.id]
    assert not Move.objects.exists()  # nothing holds the namespace's lease
    assert search_targets(stuck.namespace_id).search_enabled  # it serves where it is
    roomy = node("roomy", 1)
    keep_online(drained, full)

    assert drain.drain_node(record.id) == Status.IN_PROGRESS

    record.refresh_from_db()
    assert record.status_reason == "" and "no_target_index_ids" not in record.details
    assert Move.objects.get().target_node_id == roomy.id


def test_a_replica_that_serves_nothing_is_retired_and_a_partial_one_waits(now):
    drained, a = node("drained"), node("a")
    node("b")
    lonely = index(drained, 1, state=Index.State.PENDING)  # its replica serves nothing
    serving = index(a, 2, high=1000)
    waiting = index(
        drained, 1, replica=serving.zoekt_replica, low=1001, state=Index.State.INITIALIZING
    )
    record = remove(drained)

    drain.drain_node(record.id)

    record.refresh_from_db()
    assert record.details["replicas_retired"] == [lonely.zoekt_replica_id]
    assert not Replica.objects.filter(pk=lonely.zoekt_replica_id).exists()
    assert Index.objects.get(pk=lonely.pk).state == Index.State.EVICTED
    # The partial replica keeps its ready range on ``a``; its index on the node finishes.
    assert Index.objects.get(pk=waiting.pk).zoekt_replica_id == serving.zoekt_replica_id
    assert not Move.objects.exists()
    Index.objects.filter(pk=waiting.pk).update(state=Index.State.READY)
    keep_online(drained, a)

    drain.drain_node(record.id)

    assert Move.objects.get().source_index_ref == waiting.id


# --- cancel in the middle ----------------------------------------------------------------------


def test_cancel_in_the_middle_leaves_every_move_finished_or_rolled_back(fleet):
    drained = fleet["drained"]
    remove(drained)
    drain.run_drains()
    _all_online(fleet)
    # One of the two building moves is past building (its replacement ready, a worker
    # has taken it to ready_to_swap); the other still builds; a third waits planned.
    one_big, two, one_small, _lower = fleet["by_size"]
    past = Move.objects.get(source_index_ref=one_big.id)
    Index.objects.filter(pk=past.replacement_index_id).update(state=Index.State.READY)
    past.transition(Move.State.READY_TO_SWAP, clock.now())
    building = Move.objects.get(source_index_ref=two.id)
    planned = Move.objects.get(source_index_ref=one_small.id)

    cancelled = shutdowns.do_cancel_node_shutdown(drained.id, cancelled_by="ops-frank")

    assert (cancelled.status, cancelled.cancelled_by) == (Status.CANCELLED, "ops-frank")
    assert cancelled.details["cancel"] == {
        "moves_cancelled": [planned.id],
        "moves_parked": [building.id],
        "moves_finishing": [past.id],
    }
    building.refresh_from_db()
    planned.refresh_from_db()
    assert (building.state, building.reason) == (Move.State.PARKED, Reason.DRAIN_CANCELLED)
    assert not Replica.objects.filter(pk=building.replacement_replica_id).exists()
    assert (planned.state, planned.reason) == (Move.State.CANCELLED, Reason.DRAIN_CANCELLED)
    assert Index.objects.get(pk=two.pk).state == Index.State.READY  # the old copy serves
    # The move past building finishes; the drain starts nothing more.
    _all_online(fleet)
    assert moves.advance_moves() == {"done": 1}
    drain.run_drains()
    assert set(Move.objects.filter(trigger="drain").values_list("state", flat=True)) == {
        Move.State.DONE,
        Move.State.PARKED,
        Move.State.CANCELLED,
    }
    assert Move.objects.filter(trigger="drain").count() == 3
    assert served(fleet["namespaces"]) == {ns: True for ns in fleet["namespaces"]}
    assert not Node.objects.in_shutdown(clock.now()).filter(pk=drained.pk).exists()


# --- kill and resume ---------------------------------------------------------------------------


class Killed(Exception):
    pass


def _snapshot():
    return (
        sorted(Move.objects.values_list("id", "state", "target_node_id", "reason")),
        sorted(Index.objects.values_list("id", "state", "zoekt_replica_id", "zoekt_node_id")),
        sorted(Replica.objects.values_list("id", flat=True)),
        sorted(NodeShutdown.objects.values_list("id", "status", "status_reason", "details")),
    )


@pytest.mark.parametrize(
    ("module", "name", "situation"),
    [
        pytest.param(moves, "turn_back", "inbound", id="turning-back-a-replacement"),
        pytest.param(actions, "do_evict_replicas", "unserved", id="retiring-a-replica"),
        pytest.param(moves, "_build", "fleet", id="starting-a-move"),
        pytest.param(moves, "try_start", "fleet", id="after-the-first-move-started"),
        pytest.param(NodeShutdown, "transition", "stuck", id="stalling-the-record"),
        pytest.param(NodeShutdown, "transition", "empty", id="completing-the-record"),
    ],
)
def test_a_pass_killed_at_any_step_leaves_nothing_and_the_next_converges(
    fleet, monkeypatch, module, name, situation
):
    drained = fleet["drained"]
    if situation == "inbound":
        hot = node("hot", 50)
        index(hot, 1)
        Node.objects.filter(pk__in=[fleet[n].id for n in ("a", "b", "c")]).update(
            used_bytes=69 * GIB
        )
        hot = beat(hot, 80 * GIB)
        beat(hot, 80 * GIB, seconds=9 * 3600)
        keep_online(drained)
        eviction.run_node_level()
        assert Move.objects.get(trigger="node_level").target_node_id == drained.id
    elif situation == "unserved":
        index(drained, 1, state=Index.State.PENDING)
    elif situation == "stuck":
        Node.objects.exclude(pk=drained.pk).update(used_bytes=69 * GIB)
    elif situation == "empty":
        Index.objects.filter(zoekt_node=drained).delete()
    record = remove(drained)
    before = _snapshot()
    original = getattr(module, name)
    calls = []

    def killed(*args, **kwargs):
        original(*args, **kwargs)
        calls.append(name)
        raise Killed(name)

    monkeypatch.setattr(module, name, killed)
    with pytest.raises(Killed):
        drain.drain_node(record.id)
    monkeypatch.setattr(module, name, original)

    assert calls and _snapshot() == before  # rolled back: nothing half-written
    drain.drain_node(record.id)
    again = _snapshot()
    # The next pass did what a pass never killed does.
    record.refresh_from_db()
    if situation == "inbound":
        turned = Move.objects.get(trigger="node_level")
        assert (turned.state, turned.reason) == (
            Move.State.PLANNED,
            Reason.MOVE_TARGET_SHUTTING_DOWN,
        )
        assert record.details["moves_turned_back"] == [turned.id]
    elif situation == "unserved":
        assert len(record.details["replicas_retired"]) == 1
    elif situation == "stuck":
        assert (record.status, record.status_reason) == (Status.STALLED, Reason.DRAIN_NO_TARGET)
    elif situation == "empty":
        assert (record.status, record.status_reason) == (Status.COMPLETE, Reason.NODE_DRAINED)
    if situation in ("unserved", "fleet"):
        started = Move.objects.filter(trigger="drain").order_by("id")
        assert [m.state for m in started] == ["building", "building", "planned"]
    # And it is a fixed point: one more pass starts nothing while a move waits.
    drain.drain_node(record.id)
    assert _snapshot()[0] == again[0]
