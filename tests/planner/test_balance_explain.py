"""The explain of one index in the desired balance, on small fleets computed by hand:
where it is, where the balance wants it and why, and for every other node ``yes`` or
``no`` for a move there now, with every code that refuses it.

Shares are used bytes over disk size (memory off unless a case says so); the margin is
5 % of the source's share, the disk ceiling 70 %.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings

from planner.balance import (
    BalanceError,
    BalanceIndex,
    BalanceNode,
    BalanceOptions,
    desired_balance,
    explain_index,
    explain_indices,
)
from tests.planner.test_balance import (
    BUSIEST,
    index,
    node,
    three_full_nodes_and_two_empty,
)
from tests.planner.test_balance_properties import fleets, shares
from zoekt.reasons import Reason

MEMORY = BalanceOptions(memory=True)


def decisions(explain) -> dict[int, tuple[str, list[str]]]:
    return {entry.node_id: (entry.decision, list(entry.refusals)) for entry in explain.nodes}


def test_an_index_the_plan_moves_names_its_node_the_move_and_the_nodes_that_could_take_it():
    # The joining fleet of test_balance: index 1 is the plan's first move, from node 1
    # (70 %) to node 4 (0 %). Nodes 2 and 3 would be at 80 %: over the 70 % ceiling and
    # not under 0.95 × 70 % = 66.5 %; nodes 4 and 5 could take it now.
    nodes, indices = three_full_nodes_and_two_empty()
    explain = explain_index(nodes, indices, 1)
    assert (explain.node_id, explain.node_name) == (1, "zoekt-1")
    assert (explain.node_share, explain.node_share_without) == (0.7, 0.6)
    assert explain.lower_bound == pytest.approx(0.42)
    assert (explain.desired_node_id, explain.desired_node_name) == (4, "zoekt-4")
    assert explain.stays_reason is None and explain.index_refusals == ()
    move = explain.move
    assert (move.from_node_id, move.to_node_id, move.reason) == (1, 4, BUSIEST)
    assert (move.source_before, move.source_after) == (0.7, 0.6)
    assert (move.target_before, move.target_after) == (0.0, 0.1)
    assert (move.busiest_before, move.busiest_after) == (0.7, 0.7)
    assert (explain.move_order, explain.moves_planned) == (1, 8)
    full = [str(Reason.MOVE_TARGET_NO_DISK_ROOM), str(Reason.BALANCE_MARGIN_NOT_MET)]
    assert decisions(explain) == {
        2: ("no", full),
        3: ("no", full),
        4: ("yes", []),
        5: ("yes", []),
    }
    assert [entry.node_id for entry in explain.nodes if entry.desired] == [4]
    assert explain.candidates == (4, 5)
    by_node = {entry.node_id: entry for entry in explain.nodes}
    assert (by_node[2].share_now, by_node[2].share_with) == (0.7, 0.8)
    assert (by_node[5].share_now, by_node[5].share_with) == (0.0, 0.1)


def test_an_index_that_could_move_but_stays_says_the_plans_other_moves_come_first():
    # Index 4 is on node 1 too, but the plan balances node 1 with indices 1, 2 and 3
    # (equal sizes: by id); it could still go to node 4 or 5 now.
    nodes, indices = three_full_nodes_and_two_empty()
    explain = explain_index(nodes, indices, 4)
    assert explain.move is None and explain.move_order is None
    assert explain.desired_node_id == 1
    assert explain.stays_reason == Reason.BALANCE_OTHER_MOVES_PREFERRED
    assert explain.candidates == (4, 5)
    assert not any(entry.desired for entry in explain.nodes)


def test_an_index_left_out_by_the_cap_says_so():
    # Capped at 2 moves (indices 1 and 8), index 2 would have been the fourth.
    nodes, indices = three_full_nodes_and_two_empty()
    explain = explain_index(nodes, indices, 2, BalanceOptions(max_moves=2))
    assert explain.move is None
    assert explain.stays_reason == Reason.BALANCE_PLAN_CAPPED
    assert explain.moves_planned == 2


def test_in_a_balanced_fleet_no_node_qualifies():
    # 62 % + 5 % = 67 % is not under 0.95 × 70 % = 66.5 %: the margin is not met.
    explain = explain_index([node(1, 100, 70), node(2, 100, 62)], [index(1, 1, 5)], 1)
    assert explain.move is None and explain.moves_planned == 0
    assert explain.stays_reason == Reason.BALANCE_NO_TARGET_QUALIFIES
    assert decisions(explain) == {2: ("no", [str(Reason.BALANCE_MARGIN_NOT_MET)])}


def source_at_95() -> list:
    """Node 1 at 95 %: a target passes the margin up to 0.95 × 95 % = 90.25 %."""
    return [node(1, 100, 95)]


#: One rule at a time on node 2, for index 1 (10 bytes, namespace 1) on node 1.
RULES = [
    pytest.param(
        [node(1, 100, 70), node(2, 100, 0, receiving=False, not_receiving_reason="cooling")],
        [index(1, 1, 10)],
        BalanceOptions(),
        ["cooling"],
        id="the node's own rule, with its code",
    ),
    pytest.param(
        [node(1, 100, 70), node(2, 100, 0, receiving=False)],
        [index(1, 1, 10)],
        BalanceOptions(),
        [Reason.BALANCE_TARGET_NOT_RECEIVING],
        id="a node that does not receive, without a code",
    ),
    pytest.param(
        [node(1, 100, 70), node(2, 100, 0)],
        [index(1, 1, 10), index(2, 2, 0, namespace=1)],
        BalanceOptions(),
        [Reason.MOVE_TARGET_HOLDS_NAMESPACE],
        id="the namespace has an index there: the replica rule",
    ),
    pytest.param(
        [node(1, 100, 70), node(2, 0, 0)],
        [index(1, 1, 10)],
        BalanceOptions(),
        [Reason.MOVE_TARGET_NO_DISK_ROOM],
        id="no disk size",
    ),
    pytest.param(
        [*source_at_95(), node(2, 100, 61)],
        [index(1, 1, 10)],
        BalanceOptions(),
        [Reason.MOVE_TARGET_NO_DISK_ROOM],
        id="the disk ceiling: 71 % is not under 70 %",
    ),
    pytest.param(
        [
            node(1, 100, 95, memory_budget_bytes=100),
            node(2, 100, 0, memory_budget_bytes=100),
        ],
        [
            index(1, 1, 10, estimated_memory_bytes=10),
            index(2, 2, 0, namespace=2, estimated_memory_bytes=70),
        ],
        MEMORY,
        [Reason.MOVE_TARGET_NO_MEMORY_ROOM],
        id="the memory ceiling: 80 of 100 is not under 75",
    ),
    pytest.param(
        [node(1, 100, 70), node(2, 100, 62)],
        [index(1, 1, 5)],
        BalanceOptions(),
        [Reason.BALANCE_MARGIN_NOT_MET],
        id="the margin",
    ),
    pytest.param(
        [
            node(1, 100, 70),
            node(2, 100, 65, receiving=False, not_receiving_reason="cooling"),
        ],
        [index(1, 1, 10), index(2, 2, 0, namespace=1)],
        BalanceOptions(),
        [
            "cooling",
            Reason.MOVE_TARGET_HOLDS_NAMESPACE,
            Reason.MOVE_TARGET_NO_DISK_ROOM,
            Reason.BALANCE_MARGIN_NOT_MET,
        ],
        id="every rule that refuses, in the order of the move target's rules",
    ),
]


@pytest.mark.parametrize(("nodes", "indices", "options", "codes"), RULES)
def test_each_rule_refuses_a_node_with_its_code(nodes, indices, options, codes):
    # Node 99, empty, holds the namespace's other copy: the lower bound stays under
    # node 1's share (node 1 has something to shed), and node 99 is no target either.
    nodes = [*nodes, node(99, 100, 0)]
    indices = [*indices, index(99, 99, 0, namespace=1)]
    explain = explain_index(nodes, indices, 1, options)
    assert decisions(explain)[99][1][0] == Reason.MOVE_TARGET_HOLDS_NAMESPACE
    assert explain.index_refusals == ()
    assert decisions(explain)[2] == ("no", [str(code) for code in codes])
    assert explain.candidates == ()


def test_the_desired_node_may_refuse_it_now_when_an_earlier_move_makes_room():
    # Memory on. Node 2 holds index 2 (70 of its 100 memory): index 1 (10 more) does not
    # fit under 75 now. Node 99 holds index 1's namespace. The plan first moves index 2
    # off node 2 (memory 70 % is the second busiest) to node 99 (no budget), then index 1
    # to node 2: the explain names node 2 as desired, move 2 of 2, and says no for now.
    nodes = [
        node(1, 100, 95, memory_budget_bytes=100),
        node(2, 100, 0, memory_budget_bytes=100),
        node(99, 100, 0),
    ]
    indices = [
        index(1, 1, 10, estimated_memory_bytes=10),
        index(2, 2, 0, namespace=2, estimated_memory_bytes=70),
        index(99, 99, 0, namespace=1),
    ]
    explain = explain_index(nodes, indices, 1, MEMORY)
    assert (explain.desired_node_id, explain.move_order, explain.moves_planned) == (2, 2, 2)
    assert explain.move.target_before == 0.0  # at its turn, index 2 has left
    assert decisions(explain)[2] == ("no", [str(Reason.MOVE_TARGET_NO_MEMORY_ROOM)])
    assert [entry.desired for entry in explain.nodes] == [True, False]


#: Rules about the index and its node: they refuse every node. Node 2 could take it.
INDEX_RULES = [
    pytest.param(
        [node(1, 100, 70), node(2, 100, 0)],
        [index(1, 1, 10, movable=False, pinned_by=("move_already_moving", "x"))],
        ["move_already_moving", "x"],
        id="pinned, with the caller's codes",
    ),
    pytest.param(
        [node(1, 100, 70), node(2, 100, 0)],
        [index(1, 1, 10, movable=False)],
        [Reason.BALANCE_INDEX_PINNED],
        id="pinned, without a code",
    ),
    pytest.param(
        [node(1, 100, 70), node(2, 100, 0)],
        [BalanceIndex(1, 1, None, None, 10)],
        [Reason.BALANCE_INDEX_ORPHANED],
        id="its enabled namespace is gone",
    ),
    pytest.param(
        [node(1, 0, 70), node(2, 100, 0)],
        [index(1, 1, 10)],
        [Reason.BALANCE_SOURCE_NO_DISK_SIZE],
        id="its node has no disk size",
    ),
    pytest.param(
        [node(1, 100, 70), node(2, 100, 0)],
        [index(1, 1, 0)],
        [Reason.BALANCE_SOURCE_DOES_NOT_FALL],
        id="empty: its node does not fall",
    ),
]


@pytest.mark.parametrize(("nodes", "indices", "codes"), INDEX_RULES)
def test_the_index_rules_refuse_every_node_and_keep_it_where_it_is(nodes, indices, codes):
    explain = explain_index(nodes, indices, 1)
    codes = tuple(str(code) for code in codes)
    assert explain.index_refusals == codes
    assert decisions(explain) == {2: ("no", list(codes))}
    assert explain.move is None and explain.desired_node_id == 1
    assert explain.stays_reason == codes[0]


def test_a_node_at_the_lower_bound_sheds_nothing():
    # Both at 40 %: the lower bound. Node 2 would be at 50 %, not under 38 % either.
    explain = explain_index([node(1, 100, 40), node(2, 100, 40)], [index(1, 1, 10)], 1)
    assert explain.index_refusals == (str(Reason.BALANCE_SOURCE_AT_LOWER_BOUND),)
    assert decisions(explain) == {
        2: (
            "no",
            [str(Reason.BALANCE_SOURCE_AT_LOWER_BOUND), str(Reason.BALANCE_MARGIN_NOT_MET)],
        )
    }


def test_a_copy_held_back_names_where_the_plan_puts_it_and_says_it_moves_on():
    # test_balance's two copies trading nodes: index 3 goes to node 2 first, and would
    # move on to node 3 once index 2 has left it.
    nodes = [node(1, 200, 50), node(2, 400, 0), node(3, 100, 20)]
    indices = [index(1, 1, 40), index(2, 3, 20, namespace=2), index(3, 1, 10, namespace=2)]
    explain = explain_index(nodes, indices, 3)
    assert explain.held_back
    assert explain.desired_node_id == 2 and explain.move_order == 1
    # Now node 3 holds index 2 of its namespace: the replica rule refuses it.
    assert decisions(explain)[3][1][0] == Reason.MOVE_TARGET_HOLDS_NAMESPACE
    assert decisions(explain)[2] == ("yes", [])


def test_the_explain_is_deterministic_in_any_input_order_and_with_the_balance_given():
    nodes, indices = three_full_nodes_and_two_empty()
    ids = [index.id for index in indices]
    first = [e.as_dict() for e in explain_indices(nodes, indices, ids)]
    rng = random.Random(7)
    for _ in range(3):
        rng.shuffle(nodes)
        rng.shuffle(indices)
        assert [e.as_dict() for e in explain_indices(nodes, indices, ids)] == first
    balance = desired_balance(nodes, indices)
    given = explain_indices(nodes, indices, ids, balance=balance)
    assert [e.as_dict() for e in given] == first
    # One per index asked, in the order asked.
    assert [e.index_id for e in explain_indices(nodes, indices, [9, 2])] == [9, 2]


def test_the_explain_as_json():
    nodes, indices = three_full_nodes_and_two_empty()
    data = json.loads(json.dumps(explain_index(nodes, indices, 1).as_dict()))
    assert data["stays"] is False and data["move"]["to_node_id"] == 4
    assert data["candidate_node_ids"] == [4, 5]
    assert data["nodes"][0] == {
        "node_id": 2,
        "name": "zoekt-2",
        "decision": "no",
        "refusals": ["move_target_no_disk_room", "balance_margin_not_met"],
        "share_now": 0.7,
        "share_with": 0.8,
        "desired": False,
    }
    stays = explain_index(nodes, indices, 4).as_dict()
    assert stays["stays"] is True and stays["move"] is None
    assert stays["stays_reason"] == "balance_other_moves_preferred"


def test_an_index_not_given_is_refused_naming_it():
    nodes, indices = three_full_nodes_and_two_empty()
    with pytest.raises(BalanceError) as error:
        explain_indices(nodes, indices, [1, 999])
    assert error.value.field == "index_ids[1]"
    assert "999" in error.value.message


# --------------------------------------------------------------------------- #
# Whatever the fleet (hypothesis): the decisions are the rules, stated again here
# --------------------------------------------------------------------------- #


def lower_bound(nodes: dict[int, BalanceNode], used: dict, mem: dict, options) -> float:
    """The fleet's lower bound, computed here independently (docs/balance.md)."""
    counted = [
        n
        for n in nodes.values()
        if n.total_bytes > 0 and (n.receiving or used[n.id] > 0 or mem[n.id] > 0)
    ]
    total = sum(n.total_bytes for n in counted)
    disk = sum(used[n.id] for n in counted) / total if total else 0.0
    if not options.memory or not counted or any(n.memory_budget_bytes is None for n in counted):
        return disk
    memory = sum(mem[n.id] for n in counted) / sum(n.memory_budget_bytes for n in counted)
    return max(disk, memory)


def rules_refusing(nodes, indices, options, moving: BalanceIndex, target: BalanceNode) -> set:
    """The codes of every rule refusing ``moving`` going to ``target`` now."""
    by_node = {n.id: n for n in nodes}
    used = {n.id: n.used_bytes for n in nodes}
    mem = dict.fromkeys(by_node, 0)
    for other in indices:
        mem[other.node_id] += other.estimated_memory_bytes
    now = shares(by_node, used, mem, options)
    codes = set()
    if moving.enabled_namespace_id is None:
        codes.add(Reason.BALANCE_INDEX_ORPHANED)
    if not moving.movable:
        codes.add(Reason.BALANCE_INDEX_PINNED)
    source = moving.node_id
    if source not in now:
        codes.add(Reason.BALANCE_SOURCE_NO_DISK_SIZE)
    else:
        if now[source] <= lower_bound(by_node, used, mem, options):
            codes.add(Reason.BALANCE_SOURCE_AT_LOWER_BOUND)
        used[source] -= moving.used_bytes
        mem[source] -= moving.estimated_memory_bytes
        if shares(by_node, used, mem, options)[source] >= now[source]:
            codes.add(Reason.BALANCE_SOURCE_DOES_NOT_FALL)
        used[source] += moving.used_bytes
        mem[source] += moving.estimated_memory_bytes
    if not target.receiving:
        codes.add(Reason.BALANCE_TARGET_NOT_RECEIVING)
    namespace = moving.enabled_namespace_id
    if namespace is not None and any(
        other.enabled_namespace_id == namespace and other.node_id == target.id for other in indices
    ):
        codes.add(Reason.MOVE_TARGET_HOLDS_NAMESPACE)
    budget = target.memory_budget_bytes
    room = options.high_memory_watermark * budget if options.memory and budget else None
    if room is not None and mem[target.id] + moving.estimated_memory_bytes >= room:
        codes.add(Reason.MOVE_TARGET_NO_MEMORY_ROOM)
    if target.total_bytes <= 0:
        codes.add(Reason.MOVE_TARGET_NO_DISK_ROOM)
        return {str(code) for code in codes}
    if (used[target.id] + moving.used_bytes) / target.total_bytes >= options.disk_ceiling:
        codes.add(Reason.MOVE_TARGET_NO_DISK_ROOM)
    if source in now:
        used[target.id] += moving.used_bytes
        mem[target.id] += moving.estimated_memory_bytes
        with_it = shares(by_node, used, mem, options)[target.id]
        if with_it >= now[source] * (1 - options.margin):
            codes.add(Reason.BALANCE_MARGIN_NOT_MET)
    return {str(code) for code in codes}


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_every_decision_is_the_rules_and_the_plan_moves_only_when_a_node_says_yes(fleet):
    nodes, indices, options = fleet
    balance = desired_balance(nodes, indices, options)
    explains = explain_indices(nodes, indices, [i.id for i in indices], options)
    by_node = {n.id: n for n in nodes}
    planned = {move.index_id: (k, move) for k, move in enumerate(balance.moves, 1)}
    for moving, explain in zip(indices, explains, strict=True):
        assert explain.index_id == moving.id and explain.node_id == moving.node_id
        assert [entry.node_id for entry in explain.nodes] == sorted(
            n.id for n in nodes if n.id != moving.node_id
        )
        for entry in explain.nodes:
            expected = rules_refusing(nodes, indices, options, moving, by_node[entry.node_id])
            assert set(entry.refusals) == expected, (moving, entry)
            assert len(entry.refusals) == len(expected)
            assert entry.decision == ("no" if expected else "yes")
        assert explain.desired_node_id == balance.layout[moving.id]
        if moving.id in planned:
            order, move = planned[moving.id]
            assert (explain.move, explain.move_order, explain.stays_reason) == (move, order, None)
            assert explain.desired_node_id == move.to_node_id != moving.node_id
        else:
            assert explain.move is None and explain.desired_node_id == moving.node_id
            assert explain.stays_reason is not None
    # The plan's first move is judged in the layout as it is: a yes now.
    if balance.moves:
        first = balance.moves[0]
        explain = explains[[i.id for i in indices].index(first.index_id)]
        assert first.to_node_id in explain.candidates
    # A converged fleet has no candidate anywhere, and a fleet with one plans a move.
    assert balance.converged == (not any(explain.candidates for explain in explains))
