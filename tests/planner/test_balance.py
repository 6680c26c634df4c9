"""The desired balance on small fleets, with the answers computed by hand.

Shares are used bytes over disk size (memory off unless a test says so); the lower
bound is the fleet's total use over its total disk; the margin is 5 % of the
source's share (a target must end under 0.95 × the source's share before the move).
"""

from __future__ import annotations

import json

import pytest

from planner.balance import (
    BalanceError,
    BalanceIndex,
    BalanceNode,
    BalanceOptions,
    desired_balance,
    relocated,
)
from zoekt.reasons import Reason

BUSIEST = str(Reason.REBALANCE_BUSIEST_NODE)
NEXT = str(Reason.REBALANCE_NEXT_BUSIEST_NODE)


def node(node_id: int, total: int, used: int, **fields) -> BalanceNode:
    return BalanceNode(node_id, f"zoekt-{node_id}", total, used, **fields)


def index(index_id: int, node_id: int, size: int, namespace: int | None = None, **fields):
    namespace = index_id if namespace is None else namespace
    return BalanceIndex(index_id, node_id, namespace, 10 * index_id, size, **fields)


def steps(result) -> list[tuple[int, int, int]]:
    return [(move.index_id, move.from_node_id, move.to_node_id) for move in result.moves]


def desired(result) -> dict[int, float]:
    return {entry.node_id: round(entry.desired.dominant_share, 6) for entry in result.nodes}


def three_full_nodes_and_two_empty() -> tuple[list[BalanceNode], list[BalanceIndex]]:
    """Three nodes at 70 % of 100 bytes in seven indices of 10; two empty nodes."""
    nodes = [node(n, 100, 70 if n <= 3 else 0) for n in range(1, 6)]
    indices = [index(7 * (n - 1) + k, n, 10) for n in (1, 2, 3) for k in range(1, 8)]
    return nodes, indices


def test_two_empty_nodes_joining_three_at_70_percent_take_an_even_share():
    # The lower bound is 210 / 500 = 0.42. Each turn the busiest node (the lowest id
    # among equals) gives one index of 10 to the node left lowest: nodes 1, 2, 3 go to
    # 0.6, then to 0.5, then nodes 1 and 2 to 0.4, while nodes 4 and 5 climb by 0.1 in
    # turn. Then node 3 is at 0.5 and the others at 0.4: one more move would leave a
    # node at 0.5, not under 0.475 (the margin): done, at the best that indices of 10
    # allow (21 of them on 5 nodes: one node has 5).
    nodes, indices = three_full_nodes_and_two_empty()
    result = desired_balance(nodes, indices)
    assert steps(result) == [
        (1, 1, 4),
        (8, 2, 5),
        (15, 3, 4),
        (2, 1, 5),
        (9, 2, 4),
        (16, 3, 5),
        (3, 1, 4),
        (10, 2, 5),
    ]
    assert desired(result) == {1: 0.4, 2: 0.4, 3: 0.5, 4: 0.4, 5: 0.4}
    assert {move.reason for move in result.moves} == {BUSIEST}
    first = result.moves[0]
    assert (first.busiest_before, first.busiest_after) == (0.7, 0.7)  # nodes 2, 3 still at 0.7
    assert (first.source_before, first.source_after) == (0.7, 0.6)
    assert (first.target_before, first.target_after) == (0.0, 0.1)
    assert result.moves[2].busiest_after == 0.6
    assert result.bytes_to_move == 80
    assert result.misplaced == (1, 2, 3, 8, 9, 10, 15, 16)
    assert result.lower_bound == pytest.approx(0.42)
    bounds = result.over_lower_bound()
    assert bounds["now"] == {"busiest": 0.7, "lower_bound": 0.42, "ratio": 1.666667}
    assert bounds["desired"] == {"busiest": 0.5, "lower_bound": 0.42, "ratio": 1.190476}
    assert not result.converged and result.complete and result.held_back == ()
    assert {entry.node_id: entry.desired.index_count for entry in result.nodes} == {
        1: 4,
        2: 4,
        3: 5,
        4: 4,
        5: 4,
    }


def test_a_move_must_leave_its_target_more_than_the_margin_below_its_source():
    # 0.62 + 0.05 = 0.67 is not under 0.95 × 0.70 = 0.665: no move. 0.60 + 0.05 is.
    balanced = desired_balance([node(1, 100, 70), node(2, 100, 62)], [index(1, 1, 5)])
    assert balanced.moves == () and balanced.converged
    assert balanced.busiest_desired == balanced.busiest_now == 0.7
    unbalanced = desired_balance([node(1, 100, 70), node(2, 100, 60)], [index(1, 1, 5)])
    assert steps(unbalanced) == [(1, 1, 2)]
    assert desired(unbalanced) == {1: 0.65, 2: 0.65}
    # A wider margin holds it back.
    wide = desired_balance(
        [node(1, 100, 70), node(2, 100, 60)], [index(1, 1, 5)], BalanceOptions(margin=0.1)
    )
    assert wide.moves == ()


def test_a_move_prefers_the_fall_per_byte_that_does_not_overshoot():
    # Node 1 at 0.7 holds indices of 400, 200 and 100 bytes of 1000; node 2 is empty;
    # the lower bound is 0.35. Moving the 400 leaves node 2 at 0.4: a fall of 0.3 for
    # 400 bytes (0.75 per 1000 bytes); the 200 falls 0.2 for 200 (1.0); the 100 too,
    # but the 200 falls further. Then the 100 (node 1 at 0.4, node 2 at 0.3). The 400
    # would leave node 2 at 0.7: no. 300 bytes move; moving the 400 alone would have
    # reached the same busiest node, 0.4, with 400.
    result = desired_balance(
        [node(1, 1000, 700), node(2, 1000, 0)],
        [index(1, 1, 400), index(2, 1, 200), index(3, 1, 100)],
    )
    assert steps(result) == [(2, 1, 2), (3, 1, 2)]
    assert desired(result) == {1: 0.4, 2: 0.3}
    assert result.bytes_to_move == 300


def test_a_fall_below_the_lower_bound_does_not_count():
    # Node 2 (0.6) holds a pinned index; the lower bound is 1300 / 3000 = 0.433. Node 1
    # (0.7): the 300 would leave it at 0.4, under the bound, so only 0.267 of its fall
    # counts (0.89 per 1000 bytes); the 200 falls 0.2, all of it above the bound (1.0).
    # Then the 300 would leave node 3 at 0.5, not under 0.95 × 0.5.
    result = desired_balance(
        [node(1, 1000, 700), node(2, 1000, 600), node(3, 1000, 0)],
        [index(1, 1, 300), index(2, 1, 200), index(3, 2, 600, movable=False)],
    )
    assert steps(result) == [(2, 1, 3)]
    assert desired(result) == {1: 0.5, 2: 0.6, 3: 0.2}


def test_a_target_holding_the_namespace_is_passed_over_for_the_next_lowest():
    # Node 2 is the emptiest but holds the other copy of namespace 7: node 3 takes it.
    result = desired_balance(
        [node(1, 100, 60), node(2, 100, 0), node(3, 100, 10)],
        [index(1, 1, 20, namespace=7), index(2, 2, 0, namespace=7)],
    )
    assert steps(result) == [(1, 1, 3)]
    assert desired(result) == {1: 0.4, 2: 0.0, 3: 0.3}


def test_no_target_reaches_the_disk_ceiling():
    # Node 2 would end at 0.70 with the index: at the ceiling, refused.
    nodes = [node(1, 100, 95), node(2, 100, 50)]
    assert desired_balance(nodes, [index(1, 1, 20)]).moves == ()
    assert steps(desired_balance(nodes, [index(1, 1, 19)])) == [(1, 1, 2)]
    loose = desired_balance(nodes, [index(1, 1, 20)], BalanceOptions(disk_ceiling=0.9))
    assert steps(loose) == [(1, 1, 2)]


def test_with_memory_on_the_dominant_share_decides_and_targets_need_memory_room():
    # Node 1: disk 50 of 100 (0.5), memory 65 of a budget of 100 (0.65, dominant).
    # Index 1 is 10 bytes and 60 of memory, index 2 20 bytes and 5. Lower bound:
    # memory, 65 / 200 = 0.325. Index 1 to node 2 leaves node 1 at 0.4 (disk) and node
    # 2 at 0.6 (memory): a fall of 0.05 for 10 bytes; index 2 leaves node 1 at 0.6
    # (memory): 0.05 for 20 bytes. Index 1 goes (60 of memory is under 0.75 × 100).
    nodes = [
        node(1, 100, 50, memory_budget_bytes=100),
        node(2, 100, 0, memory_budget_bytes=100),
    ]
    indices = [
        index(1, 1, 10, estimated_memory_bytes=60),
        index(2, 1, 20, estimated_memory_bytes=5),
    ]
    result = desired_balance(nodes, indices, BalanceOptions(memory=True))
    assert steps(result) == [(1, 1, 2)]
    assert desired(result) == {1: 0.4, 2: 0.6}
    assert result.moves[0].memory_bytes == 60
    assert result.memory_bytes_to_move == 60
    assert result.disk_lower_bound == pytest.approx(0.25)
    assert result.memory_lower_bound == pytest.approx(0.325)
    assert result.lower_bound == pytest.approx(0.325)
    assert result.nodes[0].now.memory_share == 0.65
    # Memory off, disk alone (0.5, bound 0.25): both fall 0.1 per 10 bytes without
    # overshooting; index 2 falls further (0.2) and goes; index 1 would then leave node
    # 2 at 0.3, not under 0.95 × 0.3.
    disk_only = desired_balance(nodes, indices)
    assert steps(disk_only) == [(2, 1, 2)]
    assert disk_only.nodes[0].now.memory_share is None
    # A budget of 70 on node 2: 60 of memory is not under 0.75 × 70 = 52.5.
    tight = [nodes[0], node(2, 100, 0, memory_budget_bytes=70)]
    assert steps(desired_balance(tight, indices, BalanceOptions(memory=True))) == [(2, 1, 2)]


def test_only_receiving_nodes_receive_and_pinned_indices_stay():
    nodes = [
        node(1, 100, 70),
        node(2, 100, 0, receiving=False, not_receiving_reason="move_target_offline"),
        node(3, 100, 0),
    ]
    indices = [index(1, 1, 30, movable=False), index(2, 1, 20), index(3, 1, 20)]
    # Node 2 may not receive (offline): the two movable indices go to node 3 (0.2, then
    # 0.4, under 0.95 × 0.5); index 1 stays.
    result = desired_balance(nodes, indices)
    assert steps(result) == [(2, 1, 3), (3, 1, 3)]
    assert desired(result) == {1: 0.3, 2: 0.0, 3: 0.4}
    # Without a disk size a node has no share: it neither sheds nor takes.
    unmeasured = desired_balance([node(1, 0, 50), node(2, 100, 0)], [index(1, 1, 50)])
    assert unmeasured.moves == ()
    assert unmeasured.nodes[0].now.dominant_share is None
    assert unmeasured.busiest_now == 0.0


def test_an_index_whose_enabled_namespace_is_gone_holds_no_slot_and_stays():
    orphans = [BalanceIndex(k, 1, None, None, 30) for k in (1, 2)]
    result = desired_balance([node(1, 100, 70), node(2, 100, 0)], [*orphans, index(3, 1, 10)])
    assert steps(result) == [(3, 1, 2)]
    assert result.layout[1] == result.layout[2] == 1


def test_an_index_that_would_move_twice_moves_once_from_its_own_node():
    # Lower bound 60 / 600 = 0.1. Index 2 (namespace 1) goes from node 1 to node 3 and
    # index 3 to node 4; node 2 then gives index 1 (namespace 1, so not to node 3) to
    # node 4, and is empty. Node 4 (0.15) would pass index 3 on to node 2: the plan
    # moves index 3 from node 1 to node 2 directly, once node 2 is empty.
    nodes = [node(1, 100, 40), node(2, 100, 20), node(3, 200, 0), node(4, 200, 0)]
    indices = [index(1, 2, 20, namespace=1), index(2, 1, 10, namespace=1), index(3, 1, 10)]
    result = desired_balance(nodes, indices)
    assert steps(result) == [(2, 1, 3), (1, 2, 4), (3, 1, 2)]
    assert [move.reason for move in result.moves] == [BUSIEST, NEXT, BUSIEST]
    assert desired(result) == {1: 0.2, 2: 0.1, 3: 0.05, 4: 0.1}
    assert result.held_back == ()
    again = desired_balance(*relocated(nodes, indices, result.layout))
    assert again.moves == ()


def test_two_copies_trading_nodes_hold_one_back_for_the_next_computation():
    # Lower bound 70 / 700 = 0.1. Index 3 (namespace 2) leaves node 1 for node 2, then
    # index 1 follows it; node 3 gives index 2 (namespace 2) to the emptied node 1. Node
    # 2 (0.125) would now pass index 3 on to node 3 (0.1): from node 1 straight to node
    # 3 is impossible while index 2 (its namespace) is there, and without index 3's
    # first move index 2 cannot go to node 1. Index 3 stays at node 2, held back.
    nodes = [node(1, 200, 50), node(2, 400, 0), node(3, 100, 20)]
    indices = [index(1, 1, 40), index(2, 3, 20, namespace=2), index(3, 1, 10, namespace=2)]
    result = desired_balance(nodes, indices)
    assert steps(result) == [(3, 1, 2), (1, 1, 2), (2, 3, 1)]
    assert result.held_back == (3,)
    again = desired_balance(*relocated(nodes, indices, result.layout))
    assert steps(again) == [(3, 2, 3)]
    assert again.held_back == ()


def test_the_cap_stops_the_plan_and_says_so():
    nodes, indices = three_full_nodes_and_two_empty()
    capped = desired_balance(nodes, indices, BalanceOptions(max_moves=2))
    assert steps(capped) == [(1, 1, 4), (8, 2, 5)]
    assert not capped.complete
    assert desired_balance(nodes, indices, BalanceOptions(max_moves=8)).complete
    assert desired_balance(nodes, indices, BalanceOptions(max_moves=0)).moves == ()


def test_an_empty_fleet_is_converged_at_its_bound():
    result = desired_balance([node(1, 100, 0), node(2, 100, 0)], [])
    assert result.converged
    assert result.over_lower_bound()["now"] == {"busiest": 0.0, "lower_bound": 0.0, "ratio": 1.0}
    assert desired_balance([], []).busiest_now is None


def test_the_answer_as_json():
    nodes, indices = three_full_nodes_and_two_empty()
    data = json.loads(json.dumps(desired_balance(nodes, indices).as_dict()))
    assert data["converged"] is False
    assert data["misplaced_count"] == 8
    assert data["bytes_to_move"] == 80
    assert data["lower_bound"] == {"disk": 0.42, "memory": None, "dominant": 0.42}
    assert data["nodes"][2]["now"] == {
        "used_bytes": 70,
        "memory_bytes": 0,
        "index_count": 7,
        "disk_share": 0.7,
        "memory_share": None,
        "dominant_share": 0.7,
    }
    assert data["moves"][0] == {
        "index_id": 1,
        "enabled_namespace_id": 1,
        "from_node_id": 1,
        "to_node_id": 4,
        "bytes": 10,
        "memory_bytes": 0,
        "reason": BUSIEST,
        "busiest_before": 0.7,
        "busiest_after": 0.7,
        "source_before": 0.7,
        "source_after": 0.6,
        "target_before": 0.0,
        "target_after": 0.1,
    }
    assert data["layout"]["1"] == 4
    assert data["options"]["margin"] == 0.05


@pytest.mark.parametrize(
    ("nodes", "indices", "options", "field"),
    [
        ([node(1, 100, 0), node(1, 100, 0)], [], BalanceOptions(), "nodes[1].id"),
        ([node(1, 100, 0)], [index(1, 2, 0)], BalanceOptions(), "indices[0].node_id"),
        (
            [node(1, 100, 0)],
            [index(1, 1, 0, namespace=3), index(2, 1, 0, namespace=3)],
            BalanceOptions(),
            "indices[1].node_id",
        ),
        ([node(1, 100, 0)], [index(1, 1, -1)], BalanceOptions(), "indices[0]"),
        (
            [node(1, 100, 0, memory_budget_bytes=0)],
            [],
            BalanceOptions(),
            "nodes[0].memory_budget_bytes",
        ),
        ([node(1, 100, 0)], [], BalanceOptions(margin=1), "options.margin"),
        ([node(1, 100, 0)], [], BalanceOptions(max_moves=-1), "options.max_moves"),
    ],
    ids=[
        "a node twice",
        "an index on an unknown node",
        "two indices of a namespace on one node",
        "negative bytes",
        "a zero budget",
        "a margin of 1",
        "a negative cap",
    ],
)
def test_bad_input_is_refused_naming_the_field(nodes, indices, options, field):
    with pytest.raises(BalanceError) as error:
        desired_balance(nodes, indices, options)
    assert error.value.field == field
