"""``options.strategy``: GitLab's first fit (the contract's default) and balanced."""

from __future__ import annotations

import copy

import pytest

from bench import placement
from planner.core import plan_dict
from planner.scenario import ScenarioError, parse_scenario

GIB = 1024**3


def small_fleet(strategy: str | None, seed: int = 12) -> dict:
    """Three empty nodes of 1,000 GiB and 12 groups (``bench/placement.py``'s case)."""
    data = placement.small_fleet(seed)
    return data if strategy is None else placement.with_strategy(data, strategy)


def claimed(result: dict) -> dict[int, int]:
    out = {1: 0, 2: 0, 3: 0}
    for node in result["nodes"]:
        out[node["id"]] = node["claimed_storage_bytes"]
    return out


@pytest.mark.parametrize("seed", range(10))
def test_first_fit_piles_a_small_fleet_onto_one_node_and_balanced_spreads_it(seed):
    first = claimed(plan_dict(small_fleet("first_fit", seed)))
    balanced = claimed(plan_dict(small_fleet("balanced", seed)))
    assert min(first.values()) == 0  # GitLab's: one node takes everything
    assert sum(first.values()) == sum(balanced.values())  # the same projects, placed
    # Least-loaded first, namespace by namespace (nodes never fill here): the busiest
    # node is at most the average plus the largest namespace (Graham's list bound).
    largest = max(
        3 * sum(p["repository_size"] for p in ns["projects"])
        for ns in small_fleet(None, seed)["namespaces"]
    )
    assert max(balanced.values()) <= sum(balanced.values()) / 3 + largest
    assert max(balanced.values()) < max(first.values())


def test_first_fit_is_the_default_byte_for_byte():
    assert plan_dict(small_fleet(None)) == plan_dict(small_fleet("first_fit"))


def test_balanced_is_deterministic():
    once = plan_dict(small_fleet("balanced"))
    assert plan_dict(copy.deepcopy(small_fleet("balanced"))) == once


def test_balanced_takes_the_node_with_the_largest_share_of_its_storage_left():
    data = small_fleet("balanced")
    for entry in data["nodes"]:
        entry["total_bytes"] = 2000 * GIB  # each half full
    data["nodes"][2]["unclaimed_storage_bytes"] = 1500 * GIB  # the last in candidate order
    result = plan_dict(data)
    first_index = result["create"][0]["replicas"][0]["indices"][0]
    assert first_index["node_id"] == 3  # not the first candidate: the least allocated


def test_balanced_scores_against_the_disk_size_not_the_room_at_the_start():
    """A nearly full node is not a fresh one: with its disk size known, a node of
    2,000 GiB with 100 GiB unclaimed takes nothing while an empty one has more room."""
    data = small_fleet("balanced")
    data["nodes"] = [
        {"id": 1, "unclaimed_storage_bytes": 2000 * GIB, "total_bytes": 2000 * GIB},
        {"id": 2, "unclaimed_storage_bytes": 100 * GIB, "total_bytes": 2000 * GIB},
    ]
    result = plan_dict(data)
    assert claimed(result)[2] == 0
    # Without it, the unclaimed storage is each node's capacity: both are "empty".
    for entry in data["nodes"]:
        del entry["total_bytes"]
    assert claimed(plan_dict(data))[2] > 0


def test_ties_go_to_the_candidate_order():
    data = small_fleet("balanced")
    data["namespaces"] = data["namespaces"][:1]
    assert plan_dict(data)["create"][0]["replicas"][0]["indices"][0]["node_id"] == 1


@pytest.mark.parametrize("value", ["best_fit", 1, ""])
def test_an_unknown_strategy_is_refused_naming_the_field(value):
    data = small_fleet(None)
    data["options"]["strategy"] = value
    with pytest.raises(ScenarioError) as refused:
        parse_scenario(data)
    assert refused.value.field_path == "options.strategy"
