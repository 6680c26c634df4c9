"""The desired balance of the fleet in the database (``eviction.balance_data``) and
``manage.py zoekt_balance``: what the pure function is given, that the receiving rules
are the move target's, and that nothing is written or started."""

from __future__ import annotations

import io
import json
import re
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from eviction import balance_data, manual, moves
from tests.eviction.test_manual_moves import (
    Fleet,
    _cooling,
    _offline,
    _over_memory_watermark,
    _removed,
    _restarting,
    _update_dst,
    memory_planning_on,
    moving_elsewhere,
    namespace_on,
    node,
    snapshot,
)
from tests.factories import (
    GIB,
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ReplicaFactory,
)
from zoekt import app_settings, clock
from zoekt.models import Index, Node, NodeShutdown, Replica
from zoekt.reasons import Reason
from zoekt.units import binary_size

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(now) -> Fleet:
    src, dst, third = node("src", used=30 * GIB), node("dst"), node("third")
    return Fleet(src, dst, third, namespace_on(src))


def by_id(items):
    return {item.id: item for item in items}


def test_the_input_is_the_fleet_as_moves_judge_it(fleet):
    memory_planning_on(100 * GIB)
    move = moving_elsewhere(fleet, fleet.dst, used=2 * GIB)
    data = balance_data.balance_input()
    nodes = by_id(data.nodes)
    src, dst = nodes[fleet.src.id], nodes[fleet.dst.id]
    assert (src.name, src.total_bytes, src.used_bytes) == ("src", 100 * GIB, 30 * GIB)
    # 1 GiB used + the 2 GiB of the live move building there.
    assert dst.used_bytes == 3 * GIB
    assert src.memory_budget_bytes == dst.memory_budget_bytes == 100 * GIB
    assert src.receiving and dst.receiving and src.not_receiving_reason is None
    indices = by_id(data.indices)
    index = indices[fleet.index.id]
    assert index.node_id == fleet.src.id
    assert index.enabled_namespace_id == fleet.index.zoekt_enabled_namespace_id
    assert index.replica_id == fleet.index.zoekt_replica_id
    assert index.used_bytes == 4 * GIB
    assert index.estimated_memory_bytes == 4 * GIB  # 4 GiB of repositories × ratio 1
    assert index.movable
    # The moving namespace: its source stays put, its replacement holds dst's slot.
    assert not indices[move.source_index_ref].movable
    replacement = indices[move.replacement_index_id]
    assert replacement.node_id == fleet.dst.id and not replacement.movable
    assert replacement.estimated_memory_bytes == 2 * GIB  # pre-ready: estimated
    assert data.namespace_ids[fleet.index.id] == fleet.index.namespace_id
    assert data.options.memory
    assert data.options.disk_ceiling == pytest.approx(manual.ceiling()) == pytest.approx(0.70)
    assert data.options.high_memory_watermark == 0.75
    assert data.options.margin == 0.05


def test_memory_is_off_while_memory_planning_is(fleet):
    data = balance_data.balance_input(margin=0.1, max_moves=3)
    assert not data.options.memory
    assert {n.memory_budget_bytes for n in data.nodes} == {None}
    assert (data.options.margin, data.options.max_moves) == (0.1, 3)


def _drained(f: Fleet) -> None:
    """A drain that completed, its node not returned to service: it takes nothing new."""
    NodeShutdown.objects.create(
        node=f.dst,
        node_ref=f.dst.id,
        type="remove",
        reason="retire",
        requested_by="ops-bob",
        status=NodeShutdown.Status.COMPLETE,
        status_reason="node_drained",
    )


SETUPS = [
    pytest.param(lambda f: None, None, id="receiving"),
    pytest.param(_update_dst(services=[]), Reason.MOVE_TARGET_NOT_SEARCH_NODE, id="not search"),
    pytest.param(_offline, Reason.MOVE_TARGET_OFFLINE, id="offline"),
    pytest.param(_restarting, Reason.MOVE_TARGET_RESTARTING, id="restarting"),
    pytest.param(_removed, Reason.MOVE_TARGET_SHUTTING_DOWN, id="shutting down"),
    pytest.param(_drained, Reason.MOVE_TARGET_SHUTTING_DOWN, id="drained, not returned"),
    pytest.param(_cooling, Reason.MOVE_TARGET_COOLING_DOWN, id="cooling down"),
    pytest.param(
        _over_memory_watermark, Reason.MOVE_TARGET_OVER_MEMORY_WATERMARK, id="over memory"
    ),
]


@pytest.mark.parametrize(("setup", "code"), SETUPS)
def test_a_node_receives_exactly_when_a_move_could_target_it(fleet, setup, code):
    setup(fleet)
    dst = by_id(balance_data.balance_input().nodes)[fleet.dst.id]
    assert dst.receiving is (code is None)
    assert dst.not_receiving_reason == (None if code is None else str(code))
    # The move target's own rules, for an index of another namespace that needs no room.
    target = Node.objects.get(pk=fleet.dst.pk)
    facts = moves.target_facts(
        fleet.index,
        0,
        [target],
        ceiling=manual.ceiling(),
        settings=app_settings.current(),
        now=clock.now(),
    )
    assert moves.target_refusal(target, facts) == code


def test_only_a_ready_index_in_a_replica_on_a_node_at_work_moves(fleet):
    pending = namespace_on(fleet.third)
    Index.objects.filter(pk=pending.pk).update(state=Index.State.INITIALIZING)
    replicaless = namespace_on(fleet.third)
    Index.objects.filter(pk=replicaless.pk).update(zoekt_replica=None)
    offline = node("gone", last_seen_at=clock.now() - timedelta(minutes=1))
    on_offline = namespace_on(offline)
    restarting = node("rebooting")
    on_restarting = namespace_on(restarting)
    _restarting(Fleet(fleet.src, restarting, fleet.third, on_restarting))
    movable = {i.id: i.movable for i in balance_data.balance_input().indices}
    assert movable == {
        fleet.index.id: True,
        pending.id: False,
        replicaless.id: False,
        on_offline.id: False,
        on_restarting.id: False,
    }


def test_indices_whose_enabled_namespace_is_gone_hold_no_slot_and_stay(fleet):
    for _ in range(2):
        IndexFactory(
            zoekt_replica=None,
            zoekt_enabled_namespace=None,
            namespace_id=GroupFactory().id,
            zoekt_node=fleet.dst,
            state=Index.State.ORPHANED,
        )
    fleet_now, balance = balance_data.current_balance()
    orphans = [i for i in fleet_now.indices if i.enabled_namespace_id is None]
    assert len(orphans) == 2 and not any(i.movable for i in orphans)
    assert balance.layout[orphans[0].id] == fleet.dst.id


def test_the_input_is_read_in_a_fixed_number_of_queries(fleet):
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            balance_data.balance_input()
        return len(queries)

    count()  # the settings, once cached
    small = count()
    for k in range(4):
        extra = node(f"extra-{k}", used=k * GIB)
        for _ in range(3):
            namespace_on(extra, projects=2)
    assert count() == small


def full_fleet() -> list[Node]:
    """Three nodes at 70 % of 100 GiB in seven ready indices of 10 GiB; two empty nodes."""
    nodes = [
        NodeFactory(total_bytes=100 * GIB, used_bytes=(70 if k < 3 else 0) * GIB) for k in range(5)
    ]
    for holder in nodes[:3]:
        for _ in range(7):
            enabled = EnabledNamespaceFactory(root_namespace=GroupFactory())
            IndexFactory(
                zoekt_replica=ReplicaFactory(
                    zoekt_enabled_namespace=enabled, state=Replica.State.READY
                ),
                zoekt_node=holder,
                state=Index.State.READY,
                used_storage_bytes=10 * GIB,
                reserved_storage_bytes=int(10 * GIB / 0.6),
            )
    return nodes


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("zoekt_balance", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_command_prints_the_desired_balance_and_starts_nothing(now):
    nodes = full_fleet()
    before = snapshot()
    text = run()
    assert snapshot() == before
    moved = binary_size(80 * GIB)
    assert f"Converged: no. 8 moves, {moved} to move; 8 indices not where they should be." in text
    assert "Busiest node over the lower bound (42.0%): now 1.67× (70.0%), when converged " in text
    assert "1.19× (50.0%)" in text
    first, third, fourth = nodes[0], nodes[2], nodes[3]
    assert re.search(
        rf"{first.name} \({first.id}\) +yes +70.0% → 40.0% +70.0% → 40.0% +7 → 4", text
    )
    assert re.search(
        rf"{third.name} \({third.id}\) +yes +70.0% → 50.0% +70.0% → 50.0% +7 → 5", text
    )
    assert re.search(
        rf"{fourth.name} \({fourth.id}\) +yes +0.0% → 40.0% +0.0% → 40.0% +0 → 4", text
    )
    index = first.indices.order_by("id").first()
    assert (
        f"  1. index {index.id} (namespace {index.namespace_id}), {binary_size(10 * GIB)}: "
        f"{first.name} ({first.id}) → {fourth.name} ({fourth.id}); rebalance_busiest_node: "
        "source 70.0% → 60.0%, target 0.0% → 10.0%, busiest 70.0% → 70.0%"
    ) in text
    assert "Reconciler: on, at most 2 moves at once; 0 moves in flight." in text
    assert text.rstrip().endswith("Nothing was started by this command.")
    data = json.loads(run("--json"))
    assert snapshot() == before
    assert data["converged"] is False
    assert data["reconciler"]["enabled"] is True and data["last_24_hours"]["moves"] == 0
    assert len(data["moves"]) == data["misplaced_count"] == 8
    assert data["bytes_to_move"] == 80 * GIB
    assert data["moves"][0]["from_node_id"] == first.id
    assert data["moves"][0]["to_node_id"] == fourth.id
    capped = json.loads(run("--json", "--max-moves", "2"))
    assert len(capped["moves"]) == 2 and capped["complete"] is False
    assert "The plan stops at the cap of 2 moves; more would qualify." in run("--max-moves", "2")


def test_a_balanced_fleet_is_converged(now):
    for used in (40, 41, 42):
        holder = NodeFactory(total_bytes=100 * GIB, used_bytes=used * GIB)
        namespace_on(holder, projects=2, size=GIB)
    text = run()
    assert "Converged: yes. No move is needed." in text
    assert "Moves, in order:" not in text
    assert json.loads(run("--json"))["converged"] is True


def test_a_node_that_takes_nothing_says_why(fleet):
    _cooling(fleet)
    text = run()
    assert re.search(rf"dst \({fleet.dst.id}\) +no: {Reason.MOVE_TARGET_COOLING_DOWN} ", text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--margin", "1"), "--margin: must be at least 0 and below 1"),
        (("--margin", "-0.5"), "--margin: must be at least 0 and below 1"),
        (("--max-moves", "-1"), "--max-moves: must be at least 0 or null"),
    ],
)
def test_bad_options_are_refused_naming_them(fleet, args, message):
    before = snapshot()
    with pytest.raises(CommandError) as error:
        run(*args)
    assert str(error.value) == message
    assert snapshot() == before


def test_with_memory_planning_on_the_memory_shares_are_shown(fleet):
    memory_planning_on(100 * GIB)
    text = run()
    assert "memory on" in text
    assert re.search(r"node +receives +disk +memory +dominant +indices", text)
    # src: 30 GiB of 100 on disk, the index's 4 GiB estimate of a 100 GiB budget.
    assert re.search(rf"src \({fleet.src.id}\) +yes +30.0% → [0-9.]+% +4.0% → ", text)


def test_progress_goes_to_stderr_and_verbosity_0_silences_it(now):
    full_fleet()
    err = io.StringIO()
    call_command("zoekt_balance", verbosity=2, stdout=io.StringIO(), stderr=err)
    assert "computing the desired balance: moves planned so far: 1" in err.getvalue()
    assert "computed the desired balance in" in err.getvalue()
    quiet = io.StringIO()
    call_command("zoekt_balance", verbosity=0, stdout=io.StringIO(), stderr=quiet)
    assert quiet.getvalue() == ""
