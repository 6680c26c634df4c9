"""The capacity forecast and the what-if (``planner.provisioning``): pure functions."""

from __future__ import annotations

import pytest

from planner import provisioning as p
from planner.balance import BalanceError, BalanceIndex, BalanceNode, BalanceOptions
from zoekt.reasons import Reason

GIB = 1024**3
DAY = p.DAY_SECONDS


def fleet(nodes=3, used_gib=150.0, **kw) -> p.Fleet:
    """``nodes`` nodes of 100 GiB (no memory budget), ``used_gib`` used, all of it index."""
    values = {
        "nodes": nodes,
        "disk_bytes": nodes * 100 * GIB,
        "memory_budget_bytes": None,
        "used_bytes": int(used_gib * GIB),
        "indexed_bytes": int(used_gib * GIB),
        "memory_bytes": 0,
        "node_size": p.NodeSize(100 * GIB),
        "replicas": 1,
        "placed_copies": 1.0,
    }
    values.update(kw)
    return p.Fleet(**values)


def linear(per_day_gib: float, days: int = 7, start_gib: float = 100.0) -> list[p.FleetSample]:
    """One sample a day, growing ``per_day_gib`` a day, the last at day 7."""
    return [
        p.FleetSample(
            at=d * DAY,
            used_bytes=int((start_gib + per_day_gib * d) * GIB),
            indexed_bytes=int((start_gib + per_day_gib * d) * GIB),
        )
        for d in range(days + 1)
    ]


def test_least_squares_recovers_a_line_and_refuses_a_single_time():
    assert p.least_squares([(0, 1), (1, 3), (2, 5)]) == pytest.approx((2.0, 1.0))
    assert p.least_squares([(0, 1), (2, 5), (1, 2)])[0] == pytest.approx(2.0)
    assert p.least_squares([(1, 1), (1, 3)]) is None
    assert p.least_squares([(1, 1)]) is None


def test_growth_is_fitted_per_day_over_the_window_only():
    history = linear(10)
    # An old sample far off the line, outside the 7-day window, does not count.
    history.append(p.FleetSample(at=-30 * DAY, used_bytes=0, indexed_bytes=0))
    rate = p.growth(history, now=7 * DAY + 1, window_seconds=8 * DAY)
    assert rate.samples == 8
    assert rate.used_bytes_per_day == pytest.approx(10 * GIB, rel=1e-6)
    assert rate.memory_bytes_per_day is None


@pytest.mark.parametrize(
    ("label", "nodes", "used_gib", "status", "needed", "change", "reason"),
    [
        (
            "needs more than present",
            3,
            200,
            p.Status.UNDER_PROVISIONED,
            4,
            1,
            Reason.NODES_NEEDED_EXCEED_PRESENT,
        ),
        (
            "fits, no node to spare",
            3,
            150,
            p.Status.RIGHT_SIZED,
            3,
            0,
            Reason.NODES_PRESENT_MEET_NEED,
        ),
        (
            "two nodes to spare",
            5,
            150,
            p.Status.OVER_PROVISIONED,
            3,
            -2,
            Reason.NODES_PRESENT_EXCEED_NEED,
        ),
        # 115 GiB needs 2 nodes at 60 GiB each, but 2 × 1.1 margin needs 3: not over.
        (
            "a spare node inside the margin",
            3,
            115,
            p.Status.RIGHT_SIZED,
            2,
            0,
            Reason.NODES_PRESENT_MEET_NEED,
        ),
    ],
)
def test_status_now(label, nodes, used_gib, status, needed, change, reason):
    result = p.provisioning(fleet(nodes, used_gib), [], now=0)
    now = result.horizons[0]
    assert (now.status, now.nodes_needed, now.node_change, now.reason) == (
        status,
        needed,
        change,
        reason,
    )


def test_the_forecast_turns_under_provisioned_as_the_fleet_grows():
    # 170 GiB on 3 × 100 GiB, growing 1 GiB a day: 3 nodes hold 180 GiB under 60 %.
    result = p.provisioning(fleet(3, 170), linear(1, start_gib=163), now=7 * DAY)
    by_days = {h.days: h for h in result.horizons}
    assert by_days[0].status == p.Status.RIGHT_SIZED
    assert by_days[30].disk_demand_bytes == pytest.approx(200 * GIB, rel=1e-6)
    assert by_days[30].status == p.Status.UNDER_PROVISIONED
    assert by_days[90].nodes_needed == 5  # 260 GiB ÷ 60 GiB
    disk = result.low_watermark[0]
    assert disk.days == pytest.approx(10.0, rel=1e-6)  # 180 − 170 at 1 GiB a day
    assert result.as_dict()["low_watermark"][0]["at"] == pytest.approx(17 * DAY, rel=1e-6)


def test_no_history_leaves_the_later_horizons_undecided_and_no_crossing():
    result = p.provisioning(fleet(3, 150), [], now=0)
    assert [h.status for h in result.horizons] == [
        p.Status.RIGHT_SIZED,
        p.Status.UNDECIDED,
        p.Status.UNDECIDED,
    ]
    assert result.horizons[1].reason == Reason.NOT_ENOUGH_HISTORY
    assert result.low_watermark[0].days is None


def test_the_replica_factor_scales_the_index_bytes_and_needs_a_node_per_replica():
    # 90 GiB, one copy of each namespace; two replicas configured: 180 GiB of index.
    result = p.provisioning(fleet(2, 90, replicas=2, placed_copies=1.0), [], now=0)
    now = result.horizons[0]
    assert now.disk_demand_bytes == 180 * GIB
    assert now.nodes_needed == 3
    # A tiny fleet still needs a node per replica.
    tiny = p.provisioning(fleet(1, 1, replicas=2, placed_copies=2.0), [], now=0)
    assert tiny.horizons[0].nodes_needed == 2
    assert tiny.horizons[0].status == p.Status.UNDER_PROVISIONED


def test_memory_is_a_dimension_of_its_own():
    f = fleet(
        3,
        30,
        memory_budget_bytes=3 * 10 * GIB,
        memory_bytes=25 * GIB,
        node_size=p.NodeSize(100 * GIB, 10 * GIB),
    )
    now = p.provisioning(f, [], now=0).horizons[0]
    assert (now.nodes_needed_disk, now.nodes_needed_memory, now.nodes_needed) == (1, 5, 5)
    assert now.status == p.Status.UNDER_PROVISIONED


def test_no_node_size_is_undecided():
    result = p.provisioning(fleet(0, 0, disk_bytes=0, node_size=p.NodeSize(0)), [], now=0)
    assert result.status == p.Status.UNDECIDED
    assert result.horizons[0].reason == Reason.NO_NODE_SIZE


# --------------------------------------------------------------------------- #
# What-if
# --------------------------------------------------------------------------- #


def full() -> tuple[list[BalanceNode], list[BalanceIndex]]:
    """Three nodes of 100 GiB at 60 %, six 10 GiB indices each, each its own namespace."""
    nodes = [BalanceNode(k, f"n{k}", 100 * GIB, 60 * GIB) for k in (1, 2, 3)]
    indices = [
        BalanceIndex(10 * node + k, node, 10 * node + k, 10 * node + k, 10 * GIB)
        for node in (1, 2, 3)
        for k in range(6)
    ]
    return nodes, indices


def test_adding_two_nodes_moves_data_onto_them_and_nothing_is_left_over():
    nodes, indices = full()
    result = p.what_if(nodes, indices, BalanceOptions(), p.WhatIf(add_nodes=2))
    after = {n_id: a for n_id, _name, _b, a in result.nodes}
    assert set(after) == {1, 2, 3, 4, 5}
    assert all(m.to_node_id in (4, 5) for m in result.moves)
    assert max(a.disk_share for a in after.values()) <= 0.40 + 1e-9
    assert after[4].disk_share >= 0.30
    assert result.bytes_to_move == sum(m.bytes for m in result.moves) == 60 * GIB
    # The new nodes are of the median size; nothing is lost.
    assert sum(a.used_bytes for a in after.values()) == 180 * GIB
    # The result is the desired balance's fixed point: asking again moves nothing more.
    assert result.balance.busiest_desired == pytest.approx(0.4)


def test_removing_a_node_moves_all_of_its_indices_or_says_why_not():
    nodes, indices = full()
    # Alone: the other two are at 60 %, and 10 GiB more reaches the 70 % move ceiling.
    alone = p.what_if(nodes, indices, BalanceOptions(), p.WhatIf(remove_node_ids=(3,)))
    assert [m.index_id for m in alone.unplaced] == [30, 31, 32, 33, 34, 35]
    assert {m.reason for m in alone.unplaced} == {Reason.WHAT_IF_NO_TARGET}
    # With a node added in its place, every index goes there.
    replaced = p.what_if(
        nodes, indices, BalanceOptions(), p.WhatIf(add_nodes=1, remove_node_ids=(3,))
    )
    removal = [m for m in replaced.moves if m.reason == Reason.WHAT_IF_NODE_REMOVED]
    assert [(m.from_node_id, m.to_node_id) for m in removal] == [(3, 4)] * 6
    assert not replaced.unplaced
    after = {n_id: a for n_id, _name, _b, a in replaced.nodes}
    assert after[3] is None
    assert after[4].used_bytes == 60 * GIB


def test_removing_an_unknown_node_is_refused_naming_it():
    nodes, indices = full()
    with pytest.raises(BalanceError) as error:
        p.what_if(nodes, indices, BalanceOptions(), p.WhatIf(remove_node_ids=(9,)))
    assert error.value.field == "remove[0]"


def test_more_replicas_run_the_real_planner_and_the_copies_take_the_copy_bytes():
    nodes, indices = full()
    namespaces = [
        {
            "enabled_namespace_id": index.enabled_namespace_id,
            "namespace_id": 1000 + index.enabled_namespace_id,
            "number_of_replicas": 1,
            "existing_replicas": [{"id": index.replica_id, "state": "ready"}],
            "projects": [
                {
                    "project_namespace_id": 5000 + index.id,
                    "project_id": 5000 + index.id,
                    "repository_size": 4 * GIB,
                }
            ],
            "existing_node_ids": [index.node_id],
        }
        for index in indices[:3]
    ]
    scenario = {"options": {"buffer_factor": 1}, "nodes": [], "namespaces": namespaces}
    result = p.what_if(
        [*nodes, BalanceNode(4, "n4", 100 * GIB, 0)],
        indices,
        BalanceOptions(),
        p.WhatIf(replicas=2),
        scenario=scenario,
        unclaimed={1: 40 * GIB, 2: 40 * GIB, 3: 40 * GIB, 4: 100 * GIB},
    )
    assert len(result.builds) == 3
    assert all(b.bytes == 10 * GIB for b in result.builds)  # the existing copy's bytes
    # Never beside the namespace's own copy (on node 1).
    assert all(b.node_id != 1 for b in result.builds)
    assert not result.failed


def test_an_index_a_removal_rehomes_moves_once_even_when_the_balance_moves_it_on():
    nodes, indices = full()
    result = p.what_if(
        nodes, indices, BalanceOptions(), p.WhatIf(add_nodes=2, remove_node_ids=(1,))
    )
    moved = [m.index_id for m in result.moves]
    assert len(moved) == len(set(moved))
    assert {m.index_id for m in result.moves if m.from_node_id == 1} == set(range(10, 16))
    after = {n_id: a for n_id, _name, _b, a in result.nodes}
    assert sum(a.used_bytes for a in after.values() if a is not None) == 180 * GIB
    assert all(m.to_node_id != 1 for m in result.moves)
