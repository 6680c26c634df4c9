"""Failure domains in the planner: the replicas of a namespace in distinct zones.

A node may carry a ``zone`` (the operator's). With zones set, each replica of a
namespace avoids the zones its other replicas occupy (its existing copies and
the replicas planned before it in the run) whenever some node outside them can
take it; where none can (fewer zones than replicas) it is placed anyway with a
``zone_shared`` warning, and where the other zones lack the room the namespace
is planned without the rule (``zone_spread_abandoned``). Never an error the
plan without zones would not have. With no zone anywhere the plan is GitLab's,
byte for byte.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core import plan, plan_dict
from planner.explain import explain, render_text
from planner.plan import dumps
from planner.scenario import ScenarioError, parse_scenario
from tests.planner.builders import namespace, scenario
from tests.planner.generator import random_scenario
from tests.planner.reference_impl import reference_plan

STRATEGIES = [pytest.param("first_fit", id="first fit"), pytest.param("balanced", id="balanced")]


def zoned(node_id: int, unclaimed: int, zone: str | None) -> dict[str, Any]:
    return {"id": node_id, "unclaimed_storage_bytes": unclaimed, "zone": zone}


def fleet(zones: list[str], per_zone: int = 2, room: int = 10_000) -> list[dict[str, Any]]:
    """``per_zone`` nodes in each zone, listed zone by zone (so first fit, left to
    itself, would fill the first zone first)."""
    nodes = []
    for zone in zones:
        for _ in range(per_zone):
            nodes.append(zoned(len(nodes) + 1, room, zone))
    return nodes


def namespaces(count: int, replicas: int, size: int = 10) -> list[dict[str, Any]]:
    return [
        namespace(
            n,
            100 + n,
            [(1000 * n + k, 1000 * n + k, size) for k in range(1, 4)],
            replicas=replicas,
        )
        for n in range(1, count + 1)
    ]


def with_strategy(data: dict[str, Any], strategy: str) -> dict[str, Any]:
    data["options"]["strategy"] = strategy
    return data


def replica_zones(result: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[int, list[set]]:
    """Per namespace, the zones each of its planned replicas landed in."""
    zone_of = {node["id"]: node.get("zone") for node in nodes}
    return {
        ns["namespace_id"]: [
            {zone_of[index["node_id"]] for index in replica["indices"]}
            for replica in ns["replicas"]
        ]
        for ns in result["create"] + result["failures"]
    }


def warning_types(result: dict[str, Any], namespace_id: int) -> list[str]:
    for ns in result["create"] + result["failures"]:
        if ns["namespace_id"] == namespace_id:
            return [warning["type"] for warning in ns["warnings"]]
    raise AssertionError(f"namespace {namespace_id} not planned")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_three_zones_two_replicas_each_namespace_in_two_distinct_zones(strategy):
    nodes = fleet(["eu-1a", "eu-1b", "eu-1c"])
    result = plan_dict(with_strategy(scenario(nodes, namespaces(6, replicas=2)), strategy))

    assert result["failures"] == []
    zones = replica_zones(result, nodes)
    assert len(zones) == 6
    for namespace_id, replicas in zones.items():
        assert len(replicas) == 2, namespace_id
        assert replicas[0].isdisjoint(replicas[1]), (namespace_id, replicas)
        assert warning_types(result, namespace_id) == []


def test_without_the_zones_first_fit_would_put_both_replicas_in_one_zone():
    """The same fleet without zones: the rule above is what moved the second replica."""
    nodes = fleet(["eu-1a", "eu-1b", "eu-1c"])
    plain = [
        {"id": n["id"], "unclaimed_storage_bytes": n["unclaimed_storage_bytes"]} for n in nodes
    ]
    result = plan_dict(scenario(plain, namespaces(1, replicas=2)))

    first, second = replica_zones(result, nodes)[101]
    assert first == second == {"eu-1a"}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_zones_three_replicas_warns_and_still_places_every_replica(strategy):
    nodes = fleet(["eu-1a", "eu-1b"])
    result = plan_dict(with_strategy(scenario(nodes, namespaces(3, replicas=3)), strategy))

    assert result["failures"] == []
    for namespace_id, replicas in replica_zones(result, nodes).items():
        assert len(replicas) == 3
        # The first two replicas still take both zones; only the third shares one.
        assert replicas[0].isdisjoint(replicas[1])
        assert replicas[2] <= {"eu-1a", "eu-1b"}
        plan_of = next(ns for ns in result["create"] if ns["namespace_id"] == namespace_id)
        (warning,) = plan_of["warnings"]
        assert warning["type"] == "zone_shared"
        assert warning["replica_idx"] == 2
        assert "eu-1a, eu-1b" in warning["details"]
        assert plan_of["errors"] == []


def test_a_zone_with_one_node_left_does_not_strand_the_third_replica():
    """Zones a (two nodes) and b (one node), three replicas: the third goes to the
    free node of zone a rather than failing on the nodes the rule had set aside."""
    nodes = [zoned(1, 1000, "a"), zoned(2, 1000, "a"), zoned(3, 1000, "b")]
    result = plan_dict(scenario(nodes, namespaces(1, replicas=3)))

    assert result["failures"] == []
    replicas = replica_zones(result, nodes)[101]
    assert replicas == [{"a"}, {"b"}, {"a"}]
    assert warning_types(result, 101) == ["zone_shared"]


def test_when_the_other_zones_lack_the_room_the_namespace_is_placed_without_the_rule():
    # Zone b's only node is too small for the namespace (3 projects × 10 bytes).
    nodes = [zoned(1, 1000, "a"), zoned(2, 1000, "a"), zoned(3, 5, "b")]
    result = plan_dict(scenario(nodes, namespaces(1, replicas=2)))

    assert result["failures"] == []
    assert replica_zones(result, nodes)[101] == [{"a"}, {"a"}]
    assert warning_types(result, 101) == ["zone_spread_abandoned"]


def test_an_existing_replica_s_zone_is_avoided_by_the_new_one():
    nodes = [zoned(1, 1000, "a"), zoned(2, 1000, "a"), zoned(3, 1000, "b")]
    data = scenario(
        nodes,
        [namespace(1, 101, [(1001, 1001, 10)], replicas=2, existing=[(7, "ready")], on_nodes=[1])],
    )
    result = plan_dict(data)

    (replica,) = result["create"][0]["replicas"]
    assert [index["node_id"] for index in replica["indices"]] == [3]


def test_the_zone_of_a_holder_that_is_not_a_candidate_comes_in_existing_zones():
    nodes = [zoned(2, 1000, "a"), zoned(3, 1000, "b")]
    ns = namespace(1, 101, [(1001, 1001, 10)], replicas=2, existing=[(7, "ready")], on_nodes=[9])
    ns["existing_zones"] = ["a"]
    result = plan_dict(scenario(nodes, [ns]))

    (replica,) = result["create"][0]["replicas"]
    assert [index["node_id"] for index in replica["indices"]] == [3]


def test_a_node_without_a_zone_shares_a_zone_with_no_one():
    nodes = [zoned(1, 1000, "a"), zoned(2, 1000, "a"), zoned(3, 1000, None)]
    result = plan_dict(scenario(nodes, namespaces(1, replicas=2)))

    assert replica_zones(result, nodes)[101] == [{"a"}, {None}]
    assert warning_types(result, 101) == []


def test_empty_namespaces_spread_their_replicas_over_zones_too():
    nodes = [zoned(1, 1000, "a"), zoned(2, 900, "a"), zoned(3, 800, "b")]
    result = plan_dict(scenario(nodes, [namespace(1, 101, [], replicas=2)]))

    assert replica_zones(result, nodes)[101] == [{"a"}, {"b"}]


def test_with_memory_on_the_zones_still_hold():
    nodes = fleet(["a", "b", "c"])
    for node in nodes:
        node["memory_budget_bytes"] = 10_000
    result = plan_dict(scenario(nodes, namespaces(4, replicas=2)))

    assert "bounds" in result  # the memory dimension is on
    for replicas in replica_zones(result, nodes).values():
        assert replicas[0].isdisjoint(replicas[1])


def test_a_multi_index_replica_keeps_its_indices_together_but_apart_from_the_other():
    """A replica that spills over several nodes may use several nodes of a zone; the
    next replica avoids every zone the first touched."""
    nodes = [zoned(1, 20, "a"), zoned(2, 20, "a"), zoned(3, 100, "b"), zoned(4, 100, "c")]
    result = plan_dict(scenario(nodes, namespaces(1, replicas=2)))

    (plan_of,) = result["create"]
    assert [index["node_id"] for index in plan_of["replicas"][0]["indices"]] == [1, 2]
    first, second = replica_zones(result, nodes)[101]
    assert first == {"a"}
    assert second == {"b"}


@pytest.mark.parametrize(
    ("zone", "part"),
    [
        pytest.param(7, "expected a string or null", id="a number"),
        pytest.param("", "1 to 63 characters", id="empty"),
        pytest.param("z" * 64, "1 to 63 characters", id="too long"),
    ],
)
def test_a_bad_zone_is_refused_naming_the_field(zone, part):
    data = scenario([zoned(1, 1000, "a"), zoned(2, 1000, zone)], namespaces(1, replicas=1))
    with pytest.raises(ScenarioError) as error:
        parse_scenario(data)
    assert error.value.field_path == "nodes[1].zone"
    assert part in error.value.message


def test_a_bad_existing_zone_is_refused_naming_the_field():
    ns = namespace(1, 101, [(1001, 1001, 10)])
    ns["existing_zones"] = ["a", 3]
    with pytest.raises(ScenarioError) as error:
        parse_scenario(scenario([zoned(1, 1000, "a")], [ns]))
    assert error.value.field_path == "namespaces[0].existing_zones[1]"


# --------------------------------------------------------------------------- #
# No zone: GitLab's plan, byte for byte
# --------------------------------------------------------------------------- #


def test_with_no_zone_set_the_plans_equal_gitlabs_byte_for_byte():
    """The seeded GitLab comparisons again, every node carrying ``zone: null`` and every
    namespace an empty ``existing_zones``: the bytes do not move."""
    for seed in range(400):
        data = random_scenario(random.Random(seed))
        want = dumps(reference_plan(parse_scenario(data)))
        for node in data["nodes"]:
            node["zone"] = None
        for ns in data["namespaces"]:
            ns["existing_zones"] = []
        assert plan(parse_scenario(data), record_decisions=False).to_json() == want, seed


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=10**6),
    zone_count=st.integers(min_value=1, max_value=4),
    strategy=st.sampled_from(["first_fit", "balanced"]),
)
def test_every_namespace_is_spread_or_says_why(seed, zone_count, strategy):
    """On random fleets with zones: each namespace planned with more than one replica
    either has its replicas in pairwise distinct zones, or carries a zone warning."""
    rng = random.Random(seed)
    data = random_scenario(rng)
    data.setdefault("options", {})["strategy"] = strategy
    for node in data["nodes"]:
        node["zone"] = f"z{rng.randrange(zone_count)}"
    result = plan(parse_scenario(data), record_decisions=False).to_dict()
    zone_of = {node["id"]: node["zone"] for node in data["nodes"]}
    for ns in result["create"]:
        warned = {w["type"] for w in ns["warnings"]} & {"zone_shared", "zone_spread_abandoned"}
        zones = [{zone_of[i["node_id"]] for i in replica["indices"]} for replica in ns["replicas"]]
        clashes = [
            (a, b) for a in range(len(zones)) for b in range(a) if not zones[a].isdisjoint(zones[b])
        ]
        assert not clashes or warned, (ns["namespace_id"], zones, ns["warnings"])


def test_explain_names_the_zone_rule_apart_from_the_namespace_s_own_nodes():
    nodes = [zoned(1, 1000, "a"), zoned(2, 1000, "a"), zoned(3, 1000, "b")]
    result = plan(parse_scenario(scenario(nodes, namespaces(1, replicas=2))))
    (explained,) = explain(result)

    second = next(d for d in explained["decisions"] if d["replica_idx"] == 1)
    assert second["node_id"] == 3
    reasons = {
        entry["node_id"]: [r["reason"] for r in entry["reasons"]] for entry in second["passed_over"]
    }
    assert reasons == {1: ["exhausted"], 2: ["zone_holds_another_replica"]}
    assert "node 2: took nothing; passed over: zone holds another replica" in render_text(
        [explained]
    )
