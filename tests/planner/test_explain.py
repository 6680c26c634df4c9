"""Explanations: which node each new index took, and why earlier candidates were passed over."""

from __future__ import annotations

import pytest

from planner.core import plan
from planner.explain import explain, render_text
from planner.filters import (
    EXHAUSTED,
    NEGATIVE_UNCLAIMED,
    Candidate,
    Rejection,
    candidate_rejections,
    first_fit,
)
from planner.scenario import parse_scenario
from tests.planner.builders import namespace, node, scenario


def _plan(data):
    return plan(parse_scenario(data))


def test_a_rollover_names_the_exhausted_and_the_too_small_candidates():
    result = _plan(
        scenario(
            [node(1, 100), node(2, 50), node(3, 1000)],
            [namespace(10, 100, [(101, 1, 60), (102, 2, 45), (103, 3, 50)])],
        )
    )
    (ns,) = explain(result)
    third = ns["decisions"][2]
    assert third["kind"] == "new_index"
    assert (third["replica_idx"], third["index_idx"], third["node_id"]) == (0, 2, 3)
    assert third["requested"] == {"disk": 50}
    assert third["available"] == {"disk": 1000}
    assert third["passed_over"] == [
        {
            # It holds index 0 (one index per namespace and node), and is too small.
            "node_id": 1,
            "reasons": [
                {
                    "node_id": 1,
                    "reason": "exhausted",
                    "dimension": None,
                    "requested": None,
                    "available": None,
                },
                {
                    "node_id": 1,
                    "reason": "insufficient_unclaimed_storage",
                    "dimension": "disk",
                    "requested": 50,
                    "available": 40,
                },
            ],
        },
        {
            # Exhausted AND too small: every reason is reported.
            "node_id": 2,
            "reasons": [
                {
                    "node_id": 2,
                    "reason": "exhausted",
                    "dimension": None,
                    "requested": None,
                    "available": None,
                },
                {
                    "node_id": 2,
                    "reason": "insufficient_unclaimed_storage",
                    "dimension": "disk",
                    "requested": 50,
                    "available": 5,
                },
            ],
        },
    ]
    assert ns["nodes"] == [
        {
            "node_id": 1,
            "taken": [{"replica_idx": 0, "index_idx": 0}],
            "passed_over": {"exhausted": 2, "insufficient_unclaimed_storage": 2},
        },
        {
            "node_id": 2,
            "taken": [{"replica_idx": 0, "index_idx": 1}],
            "passed_over": {"exhausted": 1, "insufficient_unclaimed_storage": 1},
        },
        {"node_id": 3, "taken": [{"replica_idx": 0, "index_idx": 2}], "passed_over": {}},
    ]


def test_a_node_holding_an_index_of_the_namespace_is_passed_over_as_exhausted():
    result = _plan(
        scenario(
            [node(1, 1000), node(2, 30)],
            [namespace(10, 100, [(101, 1, 50)], on_nodes=[1])],
        )
    )
    (ns,) = explain(result)
    (refused,) = ns["decisions"]
    assert refused["kind"] == "no_node"
    assert [[r["reason"] for r in e["reasons"]] for e in refused["passed_over"]] == [
        ["exhausted"],
        ["insufficient_unclaimed_storage"],
    ]
    text = render_text([ns])
    assert "node 1 passed over: exhausted (already holds an index of this namespace)" in text


def test_values_seen_by_a_decision_are_those_of_its_moment_not_the_end():
    # Namespace 100 takes node 1 down to 20; namespace 110 then sees 20, not
    # what is left at the end of the run.
    result = _plan(
        scenario(
            [node(1, 100), node(2, 1000)],
            [
                namespace(10, 100, [(101, 1, 80)]),
                namespace(11, 110, [(111, 2, 50)]),
                namespace(12, 120, [(121, 3, 15)]),
            ],
        )
    )
    second = explain(result, namespace_id=110)[0]["decisions"][0]
    assert second["passed_over"][0]["reasons"][0]["available"] == 20
    third = explain(result, namespace_id=120)[0]["decisions"][0]
    assert third["node_id"] == 1 and third["available"] == {"disk": 20}


def test_empty_replicas_list_unusable_and_less_roomy_nodes():
    result = _plan(scenario([node(1, 500), node(2, 800), node(3, -5)], [namespace(10, 100, [])]))
    (decision,) = explain(result)[0]["decisions"]
    assert decision["kind"] == "empty_replica"
    assert decision["node_id"] == 2
    assert decision["passed_over"] == [
        {
            "node_id": 3,
            "reasons": [
                {
                    "node_id": 3,
                    "reason": NEGATIVE_UNCLAIMED,
                    "dimension": "disk",
                    "requested": 0,
                    "available": -5,
                }
            ],
        }
    ]
    assert decision["not_best"] == [{"node_id": 1, "available": {"disk": 500}}]


def test_destroy_and_unchanged_namespaces_have_no_decisions():
    result = _plan(
        scenario(
            [node(1, 10)],
            [
                namespace(10, 100, [], existing=[(1, "ready"), (2, "ready")]),
                namespace(11, 110, [], existing=[(3, "ready")]),
            ],
        )
    )
    destroy, unchanged = explain(result)
    assert destroy["replicas_to_destroy"] == [2] and destroy["decisions"] == []
    assert unchanged["decisions"] == [] and unchanged["nodes"] == []
    assert "replicas to destroy: 2" in render_text([destroy])


def test_a_plan_without_decision_records_cannot_be_explained():
    data = scenario([node(1, 10)], [namespace(10, 100, [])])
    with pytest.raises(ValueError, match="without decision records"):
        explain(plan(parse_scenario(data), record_decisions=False))


def test_first_fit_reports_every_reason_for_every_candidate_passed_over():
    candidates = [
        Candidate(1, {"disk": 10}),
        Candidate(2, {"disk": 500}),
        Candidate(3, {"disk": 500}),
    ]
    position, passed = first_fit(candidates, {"disk": 100}, exhausted={2})
    assert position == 2
    assert passed == [
        Rejection(1, "insufficient_unclaimed_storage", "disk", 100, 10),
        Rejection(2, EXHAUSTED),
    ]
    assert candidate_rejections(3, {"disk": 100}, {"disk": 500}, exhausted=False) == []
    assert Rejection(1, "insufficient_unclaimed_storage", "disk", 100, 10).describe() == (
        "insufficient unclaimed storage (requested 100, available 10 bytes)"
    )
