"""The desired balance keeps the zone rule: no move puts two replicas of a namespace in
one zone (``move_target_zone_holds_replica``), and a fleet without zones is balanced
exactly as before."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.balance import (
    BalanceIndex,
    BalanceNode,
    BalanceOptions,
    _Fleet,
    desired_balance,
    relocated,
)
from tests.planner.test_balance_properties import fleets
from zoekt.reasons import Reason

ZONE_RULE = str(Reason.MOVE_TARGET_ZONE_HOLDS_REPLICA)


def node(node_id: int, used: int, zone: str | None) -> BalanceNode:
    return BalanceNode(node_id, f"zoekt-{node_id}", 100, used, zone=zone)


def two_replicas_on_a_hot_node() -> tuple[list[BalanceNode], list[BalanceIndex]]:
    """Namespace 1 has a replica on node 1 (zone a, at 60 %) and one on node 3 (zone b).
    Node 2 (zone b) is empty, node 4 (zone a) a little fuller."""
    nodes = [node(1, 60, "a"), node(2, 0, "b"), node(3, 20, "b"), node(4, 10, "a")]
    indices = [
        BalanceIndex(1, 1, 1, 11, 30),  # namespace 1, replica 11, on node 1 (zone a)
        BalanceIndex(2, 1, 2, 21, 30),  # namespace 2, replica 21, on node 1
        BalanceIndex(3, 3, 1, 12, 20),  # namespace 1, replica 12, on node 3 (zone b)
        BalanceIndex(4, 4, 3, 31, 10),  # namespace 3 on node 4
    ]
    return nodes, indices


def steps(result) -> list[tuple[int, int, int]]:
    return [(move.index_id, move.from_node_id, move.to_node_id) for move in result.moves]


def test_without_zones_the_replica_goes_to_the_emptiest_node():
    nodes, indices = two_replicas_on_a_hot_node()
    plain = [replace(n, zone=None) for n in nodes]
    assert steps(desired_balance(plain, indices))[0] == (1, 1, 2)


def test_with_zones_no_move_puts_two_replicas_of_a_namespace_in_one_zone():
    nodes, indices = two_replicas_on_a_hot_node()
    result = desired_balance(nodes, indices)

    # Index 1 may not join zone b (its other replica, index 3, is there): node 1 sheds
    # index 2 instead (namespace 2 has one replica), to the emptiest node.
    assert steps(result)[0] == (2, 1, 2)
    assert all(move.index_id != 1 or move.to_node_id == 4 for move in result.moves)
    _, after = relocated(nodes, indices, result.layout)
    assert _clashes(nodes, after) == set()


def test_the_zone_rule_is_a_refusal_with_its_own_code_in_the_fleet_s_checks():
    nodes, indices = two_replicas_on_a_hot_node()
    fleet = _Fleet({n.id: n for n in nodes}, {i.id: i for i in indices}, BalanceOptions())
    assert fleet.target_refusal(1, 2) == ZONE_RULE
    assert fleet.target_refusal(1, 4) is None
    # Namespace 2 has no other replica: zone b is open to it.
    assert fleet.target_refusal(2, 2) is None


def test_a_replica_already_sharing_a_zone_may_move_to_another_shared_one():
    """Two zones, three replicas: one zone holds two of them whatever happens; a move
    between the shared zones breaks nothing new."""
    nodes = [node(1, 90, "a"), node(2, 10, "a"), node(3, 10, "b"), node(4, 0, "b")]
    indices = [
        BalanceIndex(1, 1, 1, 11, 30),
        BalanceIndex(2, 2, 1, 12, 10),
        BalanceIndex(3, 3, 1, 13, 10),
    ]
    fleet = _Fleet({n.id: n for n in nodes}, {i.id: i for i in indices}, BalanceOptions())
    # Index 1 shares zone a with index 2; zone b holds index 3: no worse there.
    assert fleet.target_refusal(1, 4) is None
    # Index 3 is alone in zone b: it may not join zone a's two.
    fleet.nodes = {**fleet.nodes, 5: node(5, 0, "a")}
    fleet.used[5], fleet.mem[5], fleet.on[5] = 0, 0, set()
    assert fleet.target_refusal(3, 5) == ZONE_RULE


def _clashes(nodes, indices) -> set[tuple[int, str]]:
    """(namespace, zone) pairs where two replicas of the namespace share the zone."""
    return set(_sharing(nodes, indices))


def _sharing(nodes, indices) -> dict[tuple[int, str], int]:
    """Per (namespace, zone) shared by several replicas: how many beyond the first."""
    zone_of = {n.id: n.zone for n in nodes}
    seen: dict[tuple[int, str], set[int]] = {}
    for index in indices:
        zone = zone_of[index.node_id]
        if zone is None or index.enabled_namespace_id is None or index.replica_id is None:
            continue
        seen.setdefault((index.enabled_namespace_id, zone), set()).add(index.replica_id)
    return {key: len(replicas) - 1 for key, replicas in seen.items() if len(replicas) > 1}


@settings(max_examples=400, deadline=None)
@given(fleets(), st.lists(st.sampled_from(["a", "b", "c", None]), min_size=7, max_size=7))
def test_the_desired_balance_never_adds_to_the_zone_sharing(fleet, zones):
    nodes, indices, options = fleet
    nodes = [replace(n, zone=zones[k]) for k, n in enumerate(nodes)]
    result = desired_balance(nodes, indices, options)

    moved_nodes, after = relocated(nodes, indices, result.layout)
    # A replica may leave one shared zone for another, never add to the sharing.
    assert sum(_sharing(nodes, after).values()) <= sum(_sharing(nodes, indices).values())
    # Still its own fixed point, zones and all.
    again = desired_balance(moved_nodes, after, options)
    if not result.held_back:
        assert again.moves == ()


@settings(max_examples=100, deadline=None)
@given(fleets())
def test_zones_left_unset_change_nothing(fleet):
    nodes, indices, options = fleet
    unset = [replace(n, zone=None) for n in nodes]
    assert desired_balance(unset, indices, options).as_dict() == (
        desired_balance(nodes, indices, options).as_dict()
    )


def test_a_replica_spread_over_nodes_counts_every_zone_it_is_in():
    """Replica 11 has two indices in zone a, replica 12 one in zone a and one in b. One
    index of replica 11 may not go to zone b: the replica stays in zone a by its other
    index, so it would share zone b too. To zone c it may."""
    nodes = [node(1, 50, "a"), node(2, 10, "a"), node(3, 10, "a"), node(4, 10, "b")]
    nodes += [node(5, 0, "b"), node(6, 0, "c")]
    indices = [
        BalanceIndex(1, 1, 1, 11, 20),
        BalanceIndex(2, 2, 1, 11, 10),
        BalanceIndex(3, 3, 1, 12, 10),
        BalanceIndex(4, 4, 1, 12, 10),
    ]
    fleet = _Fleet({n.id: n for n in nodes}, {i.id: i for i in indices}, BalanceOptions())

    assert fleet.target_refusal(1, 5) == ZONE_RULE
    assert fleet.target_refusal(1, 6) is None
    # Replica 12's zone-b index may go to zone c: no replica is there.
    assert fleet.target_refusal(4, 6) is None
