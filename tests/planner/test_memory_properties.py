"""Properties of the memory dimension, whatever the scenario (hypothesis).

* Memory off (no node ends up with a budget, whatever else the scenario
  says about memory): the plan is byte for byte the disk-only plan, which is
  GitLab's (the literal transcription in ``reference_impl``).
* Memory on but not binding, or memory on and ``memory_aware=False``: the
  placement is the disk-only placement; only memory keys are added.
* Memory on: a successful namespace's indices never share a node, every
  project is placed exactly once per replica, every memory figure adds up,
  memory only ever warns (never an error), and no namespace fails because of
  memory (its disk-only plan from the same state fails too).
"""

from __future__ import annotations

import copy
import itertools
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core import _Run, plan, plan_dict
from planner.plan import dumps
from planner.scenario import parse_scenario
from tests.planner.reference_impl import reference_plan
from tests.planner.test_properties import EITHER, new_index_decisions, scenarios

MEMORY_KEYS_INDEX = ("estimated_memory_bytes", "max_memory_bytes")
MEMORY_KEYS_NODE = (
    "memory_budget_bytes",
    "unclaimed_memory_bytes_before",
    "unclaimed_memory_bytes_after",
)
MEMORY_WARNINGS = {
    "memory_node_exhausted",
    "memory_index_limit_reached",
    "memory_budget_insufficient",
    "memory_placement_abandoned",
}
DISK_ERRORS = {"node_unavailable", "index_limit_exceeded", "node_reused_in_namespace"}
#: The disk ceiling per index's own warning (the product's placement options).
DISK_WARNINGS = {"disk_ceiling_abandoned"}

HEALTH = st.sampled_from(
    [
        None,
        {},
        {"indexer": {"rss_bytes": 5}},
        {"webserver": {}},
        {"webserver": {"rss_bytes": 300, "shards_loaded": 2}},
    ]
)


@st.composite
def memory_scenarios(
    draw: st.DrawFn, *, budgets: bool = True, product: bool = False
) -> dict[str, Any]:
    """The disk scenarios, with memory options and per-node memory fields added.

    ``budgets`` False: no node ends up with a budget (the dimension is off).
    ``product``: either strategy, with the product's placement options drawn.
    """
    data = draw(scenarios(EITHER, product=True) if product else scenarios())
    if draw(st.booleans()):
        # Roomy disks, so that memory is what binds.
        for node in data["nodes"]:
            node["unclaimed_storage_bytes"] *= 20
    configured = None
    if budgets:
        configured = draw(st.one_of(st.none(), st.integers(0, 600), st.integers(40, 300)))
    data["options"]["memory"] = {
        "node_memory_budget_bytes": configured,
        "memory_ratio": draw(st.sampled_from([1, 0.5, 2, 0.25, 1.5, 3])),
        "concurrency_factor": draw(st.sampled_from([1, 2, 4, 3.5, 8])),
    }
    for node in data["nodes"]:
        if budgets and draw(st.booleans()):
            node["memory_budget_bytes"] = draw(st.one_of(st.none(), st.integers(0, 600)))
        if draw(st.booleans()):
            node["reserved_memory_bytes"] = draw(st.integers(0, 100))
        node["process_health"] = draw(HEALTH)
    return data


#: Memory scenarios under GitLab's disk rules or under the product's placement options.
ANY_RULES = st.one_of(memory_scenarios(), memory_scenarios(product=True))


def strip_memory(data: dict[str, Any]) -> dict[str, Any]:
    """The same scenario with nothing about memory left."""
    out = copy.deepcopy(data)
    out.get("options", {}).pop("memory", None)
    for node in out["nodes"]:
        for key in ("memory_budget_bytes", "reserved_memory_bytes", "process_health"):
            node.pop(key, None)
    return out


def strip_plan(result: dict[str, Any]) -> dict[str, Any]:
    """The plan with the memory keys (and memory warnings) taken out."""
    out = copy.deepcopy(result)
    out.pop("bounds", None)
    for ns in out["create"] + out["destroy"] + out["unchanged"] + out["failures"]:
        ns["warnings"] = [w for w in ns["warnings"] if w["type"] not in MEMORY_WARNINGS]
        for replica in ns["replicas"]:
            for index in replica["indices"]:
                for key in MEMORY_KEYS_INDEX:
                    index.pop(key, None)
    for node in out["nodes"]:
        for key in MEMORY_KEYS_NODE:
            node.pop(key, None)
        for index in node["indices"]:
            for key in MEMORY_KEYS_INDEX:
                index.pop(key, None)
    return out


def memory_on(data: dict[str, Any]) -> bool:
    configured = data["options"].get("memory", {}).get("node_memory_budget_bytes")
    return any(
        node.get("memory_budget_bytes") is not None or configured is not None
        for node in data["nodes"]
    )


def _all_plans(result: dict[str, Any]) -> list[dict[str, Any]]:
    return result["create"] + result["destroy"] + result["unchanged"] + result["failures"]


def _contains(index: dict[str, Any], pnid: int) -> bool:
    low = index["projects"]["project_namespace_id_from"]
    high = index["projects"]["project_namespace_id_to"]
    return (low is None or low <= pnid) and (high is None or pnid <= high)


COMMON = settings(
    max_examples=int(__import__("os").environ.get("MEM_EXAMPLES", "300")), deadline=None
)


@COMMON
@given(memory_scenarios(budgets=False))
def test_memory_off_is_byte_for_byte_the_disk_only_plan(data):
    parsed = parse_scenario(data)
    assert not parsed.memory_on
    text = plan(parsed).to_json()
    assert text == plan(parse_scenario(strip_memory(data))).to_json()
    assert text == dumps(reference_plan(parsed))
    assert "memory" not in text


@COMMON
@given(memory_scenarios())
def test_memory_unaware_keeps_the_disk_only_placement_and_adds_the_figures(data):
    parsed = parse_scenario(data)
    result = plan(parsed, memory_aware=False).to_dict()
    assert strip_plan(result) == reference_plan(parse_scenario(strip_memory(data)))
    for ns in _all_plans(result):
        assert ns["warnings"] == []


@COMMON
@given(memory_scenarios(product=True))
def test_memory_unaware_under_the_product_options_keeps_their_disk_placement(data):
    """The memory path's disk ceiling, scoring and order decide as the disk path's
    do (the slow model in reference_impl), memory only adding its figures."""
    parsed = parse_scenario(data)
    result = plan(parsed, memory_aware=False).to_dict()
    assert strip_plan(result) == reference_plan(parse_scenario(strip_memory(data)))


@COMMON
@given(memory_scenarios(), st.data())
def test_budgets_that_never_bind_change_nothing_but_add_the_figures(data, draw):
    # Every node's ceiling covers the whole scenario's estimated memory.
    parsed = parse_scenario(data)
    total = sum(
        parsed.options.memory.estimate(p.repository_size) * ns.number_of_replicas
        for ns in parsed.namespaces
        for p in ns.projects
        if p.repository_size is not None
    )
    factor = Fraction(str(parsed.options.memory.concurrency_factor))
    ample = int((total + 101) * factor) + 1
    data["options"]["memory"]["node_memory_budget_bytes"] = ample
    for node in data["nodes"]:
        node["memory_budget_bytes"] = draw.draw(st.sampled_from([None, ample, ample * 2]))
    result = plan_dict(data)
    assert strip_plan(result) == reference_plan(parse_scenario(strip_memory(data)))
    assert all(not ns["warnings"] for ns in _all_plans(result))


@COMMON
@given(ANY_RULES)
def test_memory_on_successful_plans_are_sound(data):
    parsed = parse_scenario(data)
    result = plan_dict(data)
    if not memory_on(data):
        assert "bounds" not in result
        return
    assert set(result["bounds"]) == {"disk", "memory"}
    options = parsed.options
    budget_of = {node.id: parsed.memory_budget(node) for node in parsed.nodes}
    reserved = {node.id: node.reserved_memory_bytes or 0 for node in parsed.nodes}
    estimates = {
        ns.namespace_id: {
            p.project_namespace_id: (options.scale(p.repository_size), p.repository_size)
            for p in ns.projects
            if p.repository_size is not None
        }
        for ns in parsed.namespaces
    }
    for ns in _all_plans(result):
        # Memory only ever warns; errors are the disk dimension's.
        assert {e["type"] for e in ns["errors"]} <= DISK_ERRORS
        assert {w["type"] for w in ns["warnings"]} <= MEMORY_WARNINGS | DISK_WARNINGS
        for replica in ns["replicas"]:
            for index in replica["indices"]:
                budget = budget_of[index["node_id"]]
                want = None if budget is None else options.memory.ceiling(budget)
                assert index["max_memory_bytes"] == want
        if ns["errors"] or ns["action"] != "create":
            continue
        node_ids = [i["node_id"] for replica in ns["replicas"] for i in replica["indices"]]
        assert len(node_ids) == len(set(node_ids))
        for replica in ns["replicas"]:
            indices = replica["indices"]
            if not indices:
                continue
            assert indices[0]["projects"]["project_namespace_id_from"] is None
            assert indices[-1]["projects"]["project_namespace_id_to"] is None
            for previous, index in itertools.pairwise(indices):
                assert (
                    index["projects"]["project_namespace_id_from"]
                    == previous["projects"]["project_namespace_id_to"] + 1
                )
            for pnid in estimates[ns["namespace_id"]]:
                assert sum(_contains(index, pnid) for index in indices) == 1
            for index in indices:
                inside = [
                    sizes
                    for pnid, sizes in estimates[ns["namespace_id"]].items()
                    if _contains(index, pnid)
                ]
                assert index["required_storage_bytes"] == sum(s for s, _ in inside)
                # The projects' repository bytes × memory_ratio, rounded up once.
                assert index["estimated_memory_bytes"] == options.memory.estimate(
                    sum(r for _, r in inside)
                )
    for node in result["nodes"]:
        budget = budget_of[node["id"]]
        assert node["memory_budget_bytes"] == budget
        if budget is None:
            assert node["unclaimed_memory_bytes_before"] is None
            assert node["unclaimed_memory_bytes_after"] is None
            continue
        assert node["unclaimed_memory_bytes_before"] == budget - reserved[node["id"]]
        assert node["unclaimed_memory_bytes_after"] == node["unclaimed_memory_bytes_before"] - sum(
            i["estimated_memory_bytes"] for i in node["indices"]
        )


@COMMON
@given(ANY_RULES)
def test_no_namespace_fails_because_of_memory(data):
    # Each namespace planned memory-aware fails only if the disk-only plan of
    # that namespace, from the very same state of the run, fails too.
    parsed = parse_scenario(data)
    if not parsed.memory_on:
        return
    for i, namespace in enumerate(parsed.namespaces):
        aware = _Run(parsed, record_decisions=False)
        for before in parsed.namespaces[:i]:
            aware.plan_namespace(before)
        unaware = copy.deepcopy(aware)
        aware.plan_namespace(namespace)
        unaware.aware = False
        unaware.plan_namespace(namespace)
        if aware.plans[-1].errors:
            assert unaware.plans[-1].errors
            assert aware.plans[-1].to_dict() == unaware.plans[-1].to_dict()


@COMMON
@given(ANY_RULES, st.randoms(use_true_random=False))
def test_memory_plans_are_deterministic_and_records_do_not_change_them(data, rng):
    parsed = parse_scenario(data)
    first = plan(parsed).to_json()
    assert plan(parsed, record_decisions=False).to_json() == first
    shuffled = copy.deepcopy(data)
    for ns in shuffled["namespaces"]:
        rng.shuffle(ns["projects"])
    assert plan(parse_scenario(shuffled)).to_json() == first


@COMMON
@given(ANY_RULES)
def test_bounds_agree_with_the_nodes(data):
    result = plan_dict(data)
    if "bounds" not in result:
        return
    disk = result["bounds"]["disk"]
    if disk["ratio"] is not None and disk["lower_bound"] > 0:
        assert disk["ratio"] >= 1 - 1e-5
        # Each figure is rounded to six decimals after the ratio is computed.
        slack = 1e-6 * (1 + disk["ratio"])
        assert abs(disk["ratio"] * disk["lower_bound"] - disk["max_utilization"]) <= slack
    utilisations = [
        n["claimed_storage_bytes"] / n["unclaimed_storage_bytes_before"]
        for n in result["nodes"]
        if n["unclaimed_storage_bytes_before"] > 0
    ]
    if disk["max_utilization"] is not None:
        assert abs(max(utilisations, default=0) - disk["max_utilization"]) < 1e-6
    memory = result["bounds"]["memory"]
    if memory["ratio"] is not None and memory["lower_bound"] > 0:
        assert memory["ratio"] >= 1 - 1e-5


@COMMON
@given(memory_scenarios(product=True))
def test_memory_explanations_agree_with_the_plan_under_the_product_options(data):
    for decision, index in new_index_decisions(plan(parse_scenario(data))):
        # The disk ceiling may hold the index below what its node has.
        assert decision["available"]["disk"] >= index.max_storage_bytes


@COMMON
@given(memory_scenarios())
def test_memory_explanations_agree_with_the_plan(data):
    positions = [n["id"] for n in data["nodes"]]
    for decision, index in new_index_decisions(plan(parse_scenario(data))):
        assert decision["available"]["disk"] == index.max_storage_bytes
        assert len(decision["passed_over"]) == positions.index(decision["node_id"])
        if "memory" in decision["requested"] and decision["warning"] is None:
            have = decision["available"]["memory"]
            assert have is None or have >= decision["requested"]["memory"]
