"""Properties every plan has, whatever the scenario (hypothesis)."""

from __future__ import annotations

import collections
import copy
import itertools
import json
import random
from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core import plan, plan_dict
from planner.explain import explain
from planner.plan import dumps
from planner.scenario import parse_scenario
from tests.planner.generator import random_scenario
from tests.planner.reference_impl import reference_plan

STATES = ("pending", "ready")


@st.composite
def scenarios(
    draw: st.DrawFn, strategies: tuple[str, ...] = ("first_fit",), product: bool = False
) -> dict[str, Any]:
    """Random disk-only scenarios; ``product``: with the product's placement options
    drawn too (order, the disk ceiling per index, usable storage)."""
    node_ids = draw(st.lists(st.integers(1, 60), max_size=7, unique=True))
    named = draw(st.booleans())
    nodes = []
    for node_id in node_ids:
        node = {
            "id": node_id,
            "unclaimed_storage_bytes": draw(
                st.one_of(st.integers(-60, 400), st.sampled_from([0, 1000]))
            ),
        }
        if named:
            node["name"] = draw(st.sampled_from([f"zoekt-{node_id}", None]))
        if product and draw(st.booleans()):
            node["total_bytes"] = draw(st.integers(0, 1500))
        nodes.append(node)
    enabled_ids = draw(st.lists(st.integers(1, 500), min_size=1, max_size=4, unique=True))
    namespaces = []
    next_replica_id = 1
    for n, enabled_id in enumerate(enabled_ids):
        pnids = draw(st.lists(st.integers(1, 400), max_size=14, unique=True))
        projects = [
            {
                "project_namespace_id": pnid,
                "project_id": 1000 * n + k,
                "repository_size": draw(st.one_of(st.none(), st.integers(0, 150))),
            }
            for k, pnid in enumerate(pnids)
        ]
        existing = []
        for _ in range(draw(st.integers(0, 3))):
            existing.append({"id": next_replica_id, "state": draw(st.sampled_from(STATES))})
            next_replica_id += 1
        # Nodes holding an index of the namespace already: some of the
        # candidates, and now and then one that is not a candidate (offline).
        holders = draw(st.lists(st.sampled_from([*node_ids, 999]), max_size=3, unique=True))
        namespaces.append(
            {
                "enabled_namespace_id": enabled_id,
                "namespace_id": 10_000 + n,
                "number_of_replicas": draw(st.integers(0, 3)),
                "existing_replicas": existing,
                "projects": projects,
                "existing_node_ids": holders,
            }
        )
    options = {
        "buffer_factor": draw(st.sampled_from([1, 2, 3, 1.5, 2.25])),
        "max_indices_per_replica": draw(st.integers(1, 5)),
    }
    strategy = draw(st.sampled_from(strategies))
    if strategy != "first_fit" or draw(st.booleans()):
        options["strategy"] = strategy
    if product:
        options["order"] = draw(st.sampled_from(["given", "largest_first"]))
        options["max_index_storage_fraction"] = draw(
            st.sampled_from([None, 0.1, 0.25, 0.5, 1, 1 / 3])
        )
    return {"options": options, "nodes": nodes, "namespaces": namespaces}


#: The invariants hold whatever the strategy; only the GitLab comparisons are first fit's.
EITHER = ("first_fit", "balanced")


def _scaled(scenario_dict: dict[str, Any]) -> dict[int, dict[int, int]]:
    """namespace id → {project namespace id: scaled size} for projects with statistics."""
    parsed = parse_scenario(scenario_dict)
    return {
        ns.namespace_id: {
            p.project_namespace_id: parsed.options.scale(p.repository_size)
            for p in ns.projects
            if p.repository_size is not None
        }
        for ns in parsed.namespaces
    }


def _all_plans(result: dict[str, Any]) -> list[dict[str, Any]]:
    return result["create"] + result["destroy"] + result["unchanged"] + result["failures"]


def _contains(index: dict[str, Any], pnid: int) -> bool:
    low = index["projects"]["project_namespace_id_from"]
    high = index["projects"]["project_namespace_id_to"]
    return (low is None or low <= pnid) and (high is None or pnid <= high)


COMMON = settings(max_examples=250, deadline=None)


@COMMON
@given(scenarios(EITHER, product=True))
def test_the_core_equals_the_literal_model_of_the_product_placement_options(scenario_dict):
    """Balanced scoring, largest first and the disk ceiling (with its fallback),
    each alone and together, as the slow model in reference_impl walks them."""
    parsed = parse_scenario(scenario_dict)
    assert plan(parsed).to_json() == dumps(reference_plan(parsed))


@COMMON
@given(scenarios(EITHER), st.randoms(use_true_random=False))
def test_same_scenario_same_bytes_whatever_the_project_order(scenario_dict, rng):
    first = plan(parse_scenario(scenario_dict)).to_json()
    assert plan(parse_scenario(copy.deepcopy(scenario_dict))).to_json() == first
    shuffled = copy.deepcopy(scenario_dict)
    for ns in shuffled["namespaces"]:
        rng.shuffle(ns["projects"])
    assert plan(parse_scenario(shuffled)).to_json() == first


@COMMON
@given(scenarios())
def test_the_optimised_core_equals_the_literal_transcription_of_gitlab(scenario_dict):
    parsed = parse_scenario(scenario_dict)
    assert plan(parsed).to_json() == dumps(reference_plan(parsed))


@COMMON
@given(scenarios(EITHER))
def test_replica_ranges_are_contiguous_open_ended_and_cover_every_placed_project(scenario_dict):
    result = plan_dict(scenario_dict)
    sizes = _scaled(scenario_dict)
    for ns in _all_plans(result):
        for replica in ns["replicas"]:
            indices = replica["indices"]
            if not indices:
                continue
            assert indices[0]["projects"]["project_namespace_id_from"] is None
            assert indices[-1]["projects"]["project_namespace_id_to"] is None
            for previous, index in itertools.pairwise(indices):
                to = previous["projects"]["project_namespace_id_to"]
                assert to is not None
                assert index["projects"]["project_namespace_id_from"] == to + 1
            for index in indices[1:-1]:
                projects = index["projects"]
                assert projects["project_namespace_id_from"] <= projects["project_namespace_id_to"]
            if ns["errors"]:
                continue
            # A successful replica holds every project with statistics exactly
            # once, each index exactly the projects of its range.
            for pnid in sizes[ns["namespace_id"]]:
                assert sum(_contains(index, pnid) for index in indices) == 1
            for index in indices:
                assert index["required_storage_bytes"] == sum(
                    size
                    for pnid, size in sizes[ns["namespace_id"]].items()
                    if _contains(index, pnid)
                )


@COMMON
@given(scenarios(EITHER))
def test_a_successful_namespace_never_has_two_indices_on_one_node(scenario_dict):
    result = plan_dict(scenario_dict)
    for ns in result["create"]:
        node_ids = [i["node_id"] for replica in ns["replicas"] for i in replica["indices"]]
        assert len(node_ids) == len(set(node_ids))


@COMMON
@given(scenarios(EITHER))
def test_node_bookkeeping_adds_up(scenario_dict):
    result = plan_dict(scenario_dict)
    input_order = [n["id"] for n in scenario_dict["nodes"]]
    listed = [n["id"] for n in result["nodes"]]
    assert listed == [node_id for node_id in input_order if node_id in listed]
    before = {n["id"]: n["unclaimed_storage_bytes"] for n in scenario_dict["nodes"]}
    empty = {ns["namespace_id"] for ns in scenario_dict["namespaces"] if not ns["projects"]}
    planned: dict[int, list[dict[str, Any]]] = {}
    for ns in result["create"] + result["failures"]:
        if ns["namespace_id"] in empty:
            # An empty replica's index claims nothing and is not listed on its node.
            continue
        for replica in ns["replicas"]:
            for index in replica["indices"]:
                planned.setdefault(index["node_id"], []).append(index)
                assert 0 <= index["required_storage_bytes"] <= index["max_storage_bytes"]
    assert sorted(planned) == sorted(listed)
    for node in result["nodes"]:
        required = sum(i["required_storage_bytes"] for i in node["indices"])
        assert node["claimed_storage_bytes"] == required
        assert node["unclaimed_storage_bytes_before"] == before[node["id"]]
        assert (
            node["unclaimed_storage_bytes_after"]
            == node["unclaimed_storage_bytes_before"] - node["claimed_storage_bytes"]
        )
        assert len(node["indices"]) == len(planned[node["id"]])
        assert node["namespace_ids"] == sorted({i["namespace_id"] for i in node["indices"]})
        keys = [i["namespace_id"] for i in node["indices"]]
        assert keys == sorted(keys)


@COMMON
@given(scenarios(EITHER))
def test_verdicts_and_totals(scenario_dict):
    result = plan_dict(scenario_dict)
    assert all(ns["errors"] for ns in result["failures"])
    for action in ("create", "destroy", "unchanged"):
        assert all(ns["action"] == action and not ns["errors"] for ns in result[action])
    assert result["total_required_storage_bytes"] == sum(
        ns["namespace_required_storage_bytes"] for ns in result["create"]
    )
    by_id = {ns["namespace_id"]: ns for ns in scenario_dict["namespaces"]}
    for ns in _all_plans(result):
        source = by_id[ns["namespace_id"]]
        existing = len(source["existing_replicas"])
        if ns["action"] == "destroy":
            assert len(ns["replicas_to_destroy"]) == existing - source["number_of_replicas"]
        else:
            assert "replicas_to_destroy" not in ns
        if ns["action"] == "create" and source["projects"]:
            assert len(ns["replicas"]) == source["number_of_replicas"] - existing
        unique = [json.dumps(e, sort_keys=True) for e in ns["errors"]]
        assert len(unique) == len(set(unique))


@COMMON
@given(scenarios(EITHER))
def test_decision_records_do_not_change_the_plan(scenario_dict):
    parsed = parse_scenario(scenario_dict)
    assert plan(parsed).to_json() == plan(parsed, record_decisions=False).to_json()


def new_index_decisions(result) -> Iterator[tuple[dict[str, Any], Any]]:
    """Each explained ``new_index`` decision of the plan with the index it opened,
    having checked that every candidate passed over, in any decision, has a
    reason as data and that the index is on the decision's node."""
    indices = {
        (ns.namespace_id, r, i): index
        for ns in result.namespaces_in_order
        for r, replica in enumerate(ns.replicas)
        for i, index in enumerate(replica.indices)
    }
    for ns in explain(result):
        for decision in ns["decisions"]:
            assert all(entry["reasons"] for entry in decision["passed_over"])
            if decision["kind"] == "new_index":
                index = indices[
                    (ns["namespace_id"], decision["replica_idx"], decision["index_idx"])
                ]
                assert index.node_id == decision["node_id"]
                assert decision["available"]["disk"] >= decision["requested"]["disk"]
                yield decision, index


@COMMON
@given(scenarios(EITHER))
def test_explanations_agree_with_the_plan(scenario_dict):
    result = plan(parse_scenario(scenario_dict))
    positions = [n["id"] for n in scenario_dict["nodes"]]
    for decision, index in new_index_decisions(result):
        # What the chosen node had then is what the index may grow to.
        assert decision["available"]["disk"] == index.max_storage_bytes
        if scenario_dict["options"].get("strategy") == "balanced":
            # Every other candidate: unusable with its reasons, or usable
            # with less of its room left.
            others = decision["passed_over"] + decision["not_best"]
            assert len(others) == len(positions) - 1
        else:
            assert len(decision["passed_over"]) == positions.index(decision["node_id"])
    for ns in explain(result):
        for decision in ns["decisions"]:
            if decision["kind"] == "no_node":
                assert len(decision["passed_over"]) == len(positions)


RANDOM_SCENARIOS = 3000


def test_the_core_equals_gitlabs_newest_planner_on_thousands_of_seeded_scenarios():
    """Plan for plan, byte for byte (errors included, wording and all).

    The generator's coverage is counted, so the comparison cannot silently
    stop exercising what GitLab's newest planner changed.
    """
    seen = collections.Counter()
    for seed in range(RANDOM_SCENARIOS):
        data = random_scenario(random.Random(seed))
        parsed = parse_scenario(data)
        got = plan(parsed, record_decisions=False).to_dict()
        want = reference_plan(parsed)
        assert dumps(got) == dumps(want), f"seed {seed}"
        for ns in _all_plans(got):
            for error in ns["errors"]:
                seen[error["type"]] += 1
                if error["details"].startswith("Every node with capacity"):
                    seen["every_roomy_node_holds_the_namespace"] += 1
            desired = {s["namespace_id"]: s["number_of_replicas"] for s in data["namespaces"]}
            if ns["action"] == "destroy" and desired[ns["namespace_id"]] == 0:
                seen["destroy_to_zero"] += 1
            if ns["action"] == "create" and len(ns["replicas"]) > 1:
                seen["several_replicas"] += 1
        if any(ns["existing_node_ids"] for ns in data["namespaces"]):
            seen["existing_node_ids"] += 1
        if any(n.get("name") for n in data["nodes"]):
            seen["named"] += 1
    for feature in (
        "node_unavailable",
        "index_limit_exceeded",
        "every_roomy_node_holds_the_namespace",
        "destroy_to_zero",
        "several_replicas",
        "existing_node_ids",
        "named",
    ):
        assert seen[feature] >= 20, (feature, seen)
