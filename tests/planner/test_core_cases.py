"""The planner core, case by case, against hand-computed plans (reference 5.3).

Each case is a scenario and the plan worked out by hand in the compact form
of ``builders.compact``: an index is ``(node_id, from, to, required, max)``
and a node is ``(before, after, claimed, namespace_ids)``. Most cases use a
buffer factor of 1 so the arithmetic reads directly.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from bench.planner_core import synthetic_scenario, with_memory_budget
from planner.core import plan, plan_dict
from planner.plan import dumps
from planner.scenario import Scenario, parse_scenario
from tests.planner.builders import compact, expected, namespace, node, scenario
from tests.planner.reference_impl import reference_plan

DATA = Path(__file__).parent / "data"

N = None  # an open end of a project range

CASES = [
    pytest.param(
        scenario(
            [node(1, 1000), node(2, 5000)],
            [namespace(10, 100, [(101, 1, 100), (102, 2, 200)])],
            buffer_factor=3,
        ),
        expected(
            total=900,
            create={100: [[(1, N, N, 900, 1000)]]},
            nodes={1: (1000, 100, 900, [100])},
        ),
        id="one namespace fits the first node in the given order, not the roomiest",
    ),
    pytest.param(
        scenario(
            [node(1, 100), node(2, 1000)],
            [namespace(10, 100, [(101, 1, 60), (102, 2, 30), (103, 3, 50), (104, 4, 5)])],
        ),
        expected(
            total=145,
            create={100: [[(1, N, 102, 90, 100), (2, 103, N, 55, 1000)]]},
            nodes={1: (100, 10, 90, [100]), 2: (1000, 945, 55, [100])},
        ),
        id="a full index rolls over to a new index on the next node that fits",
    ),
    pytest.param(
        scenario(
            [node(1, 100), node(2, 1000)],
            [namespace(10, 100, [(101, 1, 60), (102, 2, 30), (103, 3, 50), (104, 4, 20)])],
        ),
        expected(
            total=160,
            create={100: [[(1, N, 102, 90, 100), (2, 103, N, 70, 1000)]]},
            nodes={1: (100, 10, 90, [100]), 2: (1000, 930, 70, [100])},
        ),
        id="a project that fits the last index joins it with no node search (fit test first)",
    ),
    pytest.param(
        scenario(
            [node(1, 100), node(2, 50), node(3, 1000)],
            [namespace(10, 100, [(101, 1, 60), (102, 2, 45), (103, 3, 50)])],
        ),
        expected(
            total=155,
            create={100: [[(1, N, 101, 60, 100), (2, 102, 102, 45, 50), (3, 103, N, 50, 1000)]]},
            nodes={1: (100, 40, 60, [100]), 2: (50, 5, 45, [100]), 3: (1000, 950, 50, [100])},
        ),
        id="a third index skips the exhausted second node and opens on a fresh one",
    ),
    pytest.param(
        scenario(
            [node(1, 100), node(2, 50), node(3, 1000)],
            [namespace(10, 100, [(101, 1, 60), (102, 2, 45), (103, 3, 30), (104, 4, 5)])],
        ),
        expected(
            total=140,
            create={100: [[(1, N, 101, 60, 100), (2, 102, 102, 45, 50), (3, 103, N, 35, 1000)]]},
            nodes={1: (100, 40, 60, [100]), 2: (50, 5, 45, [100]), 3: (1000, 965, 35, [100])},
        ),
        id="a later index never returns to the first index's node (one per namespace and node)",
    ),
    pytest.param(
        scenario(
            [node(1, 1000), node(2, 1000), node(3, 100)],
            [namespace(10, 100, [(101, 1, 50), (102, 2, 20)], on_nodes=[1, 9])],
        ),
        expected(
            total=70,
            create={100: [[(2, N, N, 70, 1000)]]},
            nodes={2: (1000, 930, 70, [100])},
        ),
        id="nodes that already hold an index of the namespace are skipped (existing_node_ids)",
    ),
    pytest.param(
        scenario(
            [node(1, 1000), node(2, 30)],
            [namespace(10, 100, [(101, 1, 50)], on_nodes=[1])],
        ),
        expected(
            failures={100: {"replicas": [[]], "errors": [(0, "node_unavailable")]}},
        ),
        id="a node with room that holds an index of the namespace is no candidate: it fails",
    ),
    pytest.param(
        scenario(
            [node(1, 1000), node(2, 1000)],
            [
                namespace(
                    10, 100, [(101, 1, 100)], replicas=2, existing=[(7, "ready")], on_nodes=[1]
                )
            ],
        ),
        expected(
            total=100,
            create={100: [[(2, N, N, 100, 1000)]]},
            nodes={2: (1000, 900, 100, [100])},
        ),
        id="a new replica avoids the nodes of the existing ones",
    ),
    pytest.param(
        scenario(
            [node(1, 1000)],
            [
                namespace(
                    10, 100, [(101, 1, 100)], replicas=0, existing=[(7, "ready"), (8, "pending")]
                )
            ],
        ),
        expected(destroy={100: [8, 7]}),
        id="number_of_replicas 0 destroys every replica, pending first",
    ),
    pytest.param(
        scenario([node(1, 1000)], [namespace(10, 100, [(101, 1, 100)], replicas=0)]),
        expected(unchanged=[100]),
        id="number_of_replicas 0 with no replica changes nothing",
    ),
    pytest.param(
        scenario(
            [node(1, 10), node(2, 100), node(3, 100)],
            [namespace(10, 100, [(101, 1, 10), (102, 2, 10), (103, 3, 5)])],
            max_indices_per_replica=2,
        ),
        expected(
            failures={
                100: {
                    "replicas": [[(1, N, 101, 10, 10), (2, 102, N, 10, 100)]],
                    "errors": [(0, "index_limit_exceeded")],
                }
            },
            nodes={1: (10, 0, 10, [100]), 2: (100, 90, 10, [100])},
        ),
        id="index cap 2 ends the replica although the next project fits the last index (10.4)",
    ),
    pytest.param(
        scenario(
            [node(1, 100)],
            [namespace(10, 100, [(101, 1, 10), (102, 2, 10)])],
            max_indices_per_replica=1,
        ),
        expected(
            failures={
                100: {
                    "replicas": [[(1, N, N, 10, 100)]],
                    "errors": [(0, "index_limit_exceeded")],
                }
            },
            nodes={1: (100, 90, 10, [100])},
        ),
        id="index cap 1 fails any second project",
    ),
    pytest.param(
        scenario(
            [node(i, 10) for i in range(1, 12)],
            [namespace(10, 100, [(100 + i, i, 10) for i in range(1, 12)])],
        ),
        expected(
            failures={
                100: {
                    "replicas": [
                        [(1, N, 101, 10, 10)]
                        + [(k + 1, 101 + k, 101 + k, 10, 10) for k in range(1, 9)]
                        + [(10, 110, N, 10, 10)]
                    ],
                    "errors": [(0, "index_limit_exceeded")],
                }
            },
            nodes={i: (10, 0, 10, [100]) for i in range(1, 11)},
        ),
        id="the default index cap of 10 stops an eleventh index",
    ),
    pytest.param(
        scenario(
            [node(1, 10), node(2, 10), node(3, 10)],
            [namespace(10, 100, [(101, 1, 10), (102, 2, 10), (103, 3, 10)])],
            max_indices_per_replica=3,
        ),
        expected(
            total=30,
            create={100: [[(1, N, 101, 10, 10), (2, 102, 102, 10, 10), (3, 103, N, 10, 10)]]},
            nodes={i: (10, 0, 10, [100]) for i in (1, 2, 3)},
        ),
        id="exactly as many indices as the cap is fine",
    ),
    pytest.param(
        scenario(
            [node(1, 1000), node(2, 1000), node(3, 1000)],
            [namespace(10, 100, [(101, 1, 100), (102, 2, 200)], replicas=2)],
        ),
        expected(
            total=600,
            create={100: [[(1, N, N, 300, 1000)], [(2, N, N, 300, 1000)]]},
            nodes={1: (1000, 700, 300, [100]), 2: (1000, 700, 300, [100])},
        ),
        id="two replicas: the second avoids the first's node",
    ),
    pytest.param(
        scenario(
            [node(1, 150), node(2, 1000), node(3, 1000), node(4, 1000)],
            [namespace(10, 100, [(101, 1, 100), (102, 2, 100)], replicas=3)],
        ),
        expected(
            total=600,
            create={
                100: [
                    [(1, N, 101, 100, 150), (2, 102, N, 100, 1000)],
                    [(3, N, N, 200, 1000)],
                    [(4, N, N, 200, 1000)],
                ]
            },
            nodes={
                1: (150, 50, 100, [100]),
                2: (1000, 900, 100, [100]),
                3: (1000, 800, 200, [100]),
                4: (1000, 800, 200, [100]),
            },
        ),
        id="three replicas: later replicas avoid every node of the earlier ones",
    ),
    pytest.param(
        scenario([node(1, 1000)], [namespace(10, 100, [(101, 1, 100)], replicas=2)]),
        expected(
            failures={
                100: {
                    "replicas": [[(1, N, N, 100, 1000)], []],
                    "errors": [(1, "node_unavailable")],
                }
            },
            nodes={1: (1000, 900, 100, [100])},
        ),
        id="a second replica with only the first replica's node left fails",
    ),
    pytest.param(
        scenario(
            [node(1, 1000)],
            [namespace(10, 100, [(101, 1, 100)], replicas=2, existing=[(7, "ready")])],
        ),
        expected(
            total=100,
            create={100: [[(1, N, N, 100, 1000)]]},
            nodes={1: (1000, 900, 100, [100])},
        ),
        id="only the missing replica is planned, on any node, existing ones unknown (10.5)",
    ),
    pytest.param(
        scenario([node(1, 500), node(2, 800), node(3, -5)], [namespace(10, 100, [])]),
        expected(create={100: [[(2, N, N, 0, 800)]]}),
        id="an empty namespace gets one 0-byte index on the roomiest node, not listed on it",
    ),
    pytest.param(
        scenario(
            [node(1, 500), node(2, 800), node(3, 700)],
            [namespace(10, 100, [], replicas=2, on_nodes=[2])],
        ),
        expected(create={100: [[(3, N, N, 0, 700)], [(1, N, N, 0, 500)]]}),
        id="empty replicas avoid the nodes that hold an index of the namespace",
    ),
    pytest.param(
        scenario(
            [node(1, 500), node(2, 800), node(3, -5), node(4, 800)],
            [namespace(10, 100, [], replicas=3)],
        ),
        expected(
            create={100: [[(2, N, N, 0, 800)], [(4, N, N, 0, 800)], [(1, N, N, 0, 500)]]},
        ),
        id="empty replicas: ties go to the first, used and negative nodes are skipped",
    ),
    pytest.param(
        scenario([node(1, -1)], [namespace(10, 100, [])]),
        expected(failures={100: {"replicas": [], "errors": [(None, "node_unavailable")]}}),
        id="an empty namespace with only negative nodes fails",
    ),
    pytest.param(
        scenario([node(1, 5), node(2, -3)], [namespace(10, 100, [], replicas=3)]),
        expected(
            failures={
                100: {"replicas": [[(1, N, N, 0, 5)]], "errors": [(None, "node_unavailable")]}
            },
        ),
        id="empty replicas beyond the usable nodes: one de-duplicated error",
    ),
    pytest.param(
        scenario([node(1, 0)], [namespace(10, 100, [])]),
        expected(create={100: [[(1, N, N, 0, 0)]]}),
        id="zero unclaimed is not negative",
    ),
    pytest.param(
        scenario(
            [node(1, 100), node(2, 1000)],
            [namespace(10, 100, [(101, 1, 80)]), namespace(11, 110, [(111, 2, 50)])],
        ),
        expected(
            total=130,
            create={100: [[(1, N, N, 80, 100)]], 110: [[(2, N, N, 50, 1000)]]},
            nodes={1: (100, 20, 80, [100]), 2: (1000, 950, 50, [110])},
        ),
        id="node capacity is shared: the second namespace sees what the first took",
    ),
    pytest.param(
        scenario(
            [node(1, 100)],
            [namespace(10, 200, [(201, 1, 30)]), namespace(11, 110, [(111, 2, 50)])],
        ),
        expected(
            total=80,
            create={200: [[(1, N, N, 30, 100)]], 110: [[(1, N, N, 50, 70)]]},
            nodes={1: (100, 20, 80, [110, 200])},
        ),
        id="two namespaces on one node; the second index's max is what was left",
    ),
    pytest.param(
        scenario(
            [node(1, -100), node(2, 0), node(3, 500)],
            [namespace(10, 100, [(101, 1, 0), (102, 2, 10)])],
        ),
        expected(
            total=10,
            create={100: [[(2, N, 101, 0, 0), (3, 102, N, 10, 500)]]},
            nodes={2: (0, 0, 0, [100]), 3: (500, 490, 10, [100])},
        ),
        id="negative nodes never fit; a 0-byte project fits a node with 0 unclaimed",
    ),
    pytest.param(
        scenario(
            [node(1, 120), node(2, 1000)],
            [namespace(10, 100, [(101, 1, None), (102, 2, 100), (103, 3, None), (104, 4, 50)])],
        ),
        expected(
            total=150,
            create={100: [[(1, N, 102, 100, 120), (2, 103, N, 50, 1000)]]},
            nodes={1: (120, 20, 100, [100]), 2: (1000, 950, 50, [100])},
        ),
        id="projects without statistics are skipped but covered by the ranges",
    ),
    pytest.param(
        scenario([node(1, 100)], [namespace(10, 100, [(101, 1, None)])]),
        expected(create={100: [[]]}),
        id="only projects without statistics: a replica without indices, as in GitLab",
    ),
    pytest.param(
        scenario(
            [node(1, 100)], [namespace(10, 100, [(101, 1, 50), (102, 2, 10)])], buffer_factor=3
        ),
        expected(
            failures={
                100: {"replicas": [[(1, N, N, 30, 100)]], "errors": [(0, "node_unavailable")]}
            },
            nodes={1: (100, 70, 30, [100])},
        ),
        id="nothing fits a project: node_unavailable, and the next project opens the first index",
    ),
    pytest.param(
        scenario(
            [node(1, 100)],
            [
                namespace(10, 100, [(101, 1, 200), (102, 2, 60)]),
                namespace(11, 110, [(111, 3, 50)]),
            ],
        ),
        expected(
            failures={
                100: {"replicas": [[(1, N, N, 60, 100)]], "errors": [(0, "node_unavailable")]},
                110: {"replicas": [[]], "errors": [(0, "node_unavailable")]},
            },
            nodes={1: (100, 40, 60, [100])},
        ),
        id="a failed plan still consumes capacity for the rest of the run (10.7)",
    ),
    pytest.param(
        scenario(
            [node(1, 1000)],
            [
                namespace(
                    10,
                    100,
                    [(101, 1, 5)],
                    existing=[(1, "ready"), (2, "pending"), (3, "ready"), (4, "pending")],
                )
            ],
        ),
        expected(destroy={100: [4, 2, 3]}),
        id="destroy: pending before ready, then newest first; no capacity used",
    ),
    pytest.param(
        scenario([node(1, 1000)], [namespace(10, 100, [(101, 1, 5)], existing=[(5, "ready")])]),
        expected(unchanged=[100]),
        id="unchanged: as many replicas as desired",
    ),
    pytest.param(
        scenario(
            [node(1, 1000)],
            [
                namespace(10, 100, [(101, 1, 300)]),
                namespace(11, 110, [(111, 2, 2000)]),
                namespace(12, 120, [], existing=[(1, "ready"), (2, "ready")]),
                namespace(13, 130, [(131, 3, 1)], existing=[(3, "ready")]),
            ],
        ),
        expected(
            total=300,
            create={100: [[(1, N, N, 300, 1000)]]},
            failures={110: {"replicas": [[]], "errors": [(0, "node_unavailable")]}},
            destroy={120: [2]},
            unchanged=[130],
            nodes={1: (1000, 700, 300, [100])},
        ),
        id="total_required_storage_bytes counts successful creates only",
    ),
    pytest.param(
        scenario(
            [node(1, 1000)], [namespace(10, 100, [(101, 1, 3), (102, 2, 100)])], buffer_factor=1.5
        ),
        expected(
            total=155, create={100: [[(1, N, N, 155, 1000)]]}, nodes={1: (1000, 845, 155, [100])}
        ),
        id="a fractional buffer factor rounds each project up to whole bytes",
    ),
    pytest.param(
        scenario([node(1, 1000)], [namespace(10, 100, [(101, 1, 100)])], buffer_factor=1.1),
        expected(
            total=110, create={100: [[(1, N, N, 110, 1000)]]}, nodes={1: (1000, 890, 110, [100])}
        ),
        id="buffer factor 1.1 is exactly 11/10, not the nearest double",
    ),
    pytest.param(
        scenario([], [namespace(10, 100, [(101, 1, 1)]), namespace(11, 110, [])]),
        expected(
            failures={
                100: {"replicas": [[]], "errors": [(0, "node_unavailable")]},
                110: {"replicas": [], "errors": [(None, "node_unavailable")]},
            }
        ),
        id="no candidate nodes at all",
    ),
]


@pytest.mark.parametrize(("scenario_dict", "want"), CASES)
def test_plan_matches_the_hand_computed_plan(scenario_dict, want):
    assert compact(plan_dict(scenario_dict)) == want


@pytest.mark.parametrize(("scenario_dict", "want"), CASES)
def test_plan_matches_the_literal_transcription_of_gitlab(scenario_dict, want):
    parsed = parse_scenario(scenario_dict)
    assert plan(parsed).to_json() == dumps(reference_plan(parsed))


def test_a_full_plan_is_byte_for_byte_the_expected_json():
    text = (DATA / "rollover_scenario.json").read_text()
    want = (DATA / "rollover_plan.json").read_text()
    assert plan(Scenario.from_json(text)).to_json() + "\n" == want


def test_the_contract_example_gives_the_contract_numbers():
    result = plan_dict(
        {
            "options": {
                "buffer_factor": 3,
                "max_indices_per_replica": 10,
                "memory": {
                    "node_memory_budget_bytes": None,
                    "memory_ratio": 0.5,
                    "concurrency_factor": 4,
                },
            },
            "nodes": [
                {
                    "id": 1,
                    "unclaimed_storage_bytes": 1000000,
                    "memory_budget_bytes": None,
                    "process_health": {"webserver": {"rss_bytes": 123, "shards_loaded": 4}},
                }
            ],
            "namespaces": [
                {
                    "enabled_namespace_id": 10,
                    "namespace_id": 100,
                    "number_of_replicas": 1,
                    "existing_replicas": [],
                    "projects": [
                        {"project_namespace_id": 101, "project_id": 1, "repository_size": 2048},
                        {"project_namespace_id": 102, "project_id": 2, "repository_size": None},
                    ],
                }
            ],
        }
    )
    assert result["total_required_storage_bytes"] == 6144
    assert result["create"][0]["replicas"][0]["indices"][0] == {
        "node_id": 1,
        "projects": {"project_namespace_id_from": None, "project_namespace_id_to": None},
        "required_storage_bytes": 6144,
        "max_storage_bytes": 1000000,
    }
    assert result["nodes"][0]["unclaimed_storage_bytes_after"] == 993856
    assert sorted(result) == [
        "create",
        "destroy",
        "failures",
        "nodes",
        "total_required_storage_bytes",
        "unchanged",
    ]


def test_error_details_say_what_gitlab_says():
    result = plan_dict(
        scenario(
            [node(1, 100), node(2, 50), node(3, 1000)],
            [
                namespace(10, 100, [(101, 1, 60), (102, 2, 45), (103, 3, 30)]),
                namespace(11, 110, [(111, 4, 5000)]),
                namespace(12, 120, [(121, 5, 1), (122, 6, 1)]),
                namespace(13, 130, [], replicas=5),
            ],
            max_indices_per_replica=1,
        )
    )
    errors = {ns["namespace_id"]: ns["errors"] for ns in result["failures"]}
    assert errors[100] == [
        {
            "namespace_id": 100,
            "replica_idx": 0,
            "type": "index_limit_exceeded",
            "details": "Replica reached maximum index limit (1)",
        }
    ]
    assert errors[110][0]["details"] == "No node can accommodate project 4 with size 5000"
    assert errors[120][0]["type"] == "index_limit_exceeded"
    assert errors[130] == [
        {
            "namespace_id": 130,
            "replica_idx": None,
            "type": "node_unavailable",
            "details": "No nodes available to create an empty replica",
        }
    ]


def test_node_unavailable_tells_no_room_from_every_roomy_node_holding_the_namespace():
    result = plan_dict(
        scenario(
            [node(1, 1000), node(2, 30)],
            [
                namespace(10, 100, [(101, 1, 50)], on_nodes=[1]),
                namespace(11, 110, [(111, 2, 5000)]),
            ],
        )
    )
    errors = {ns["namespace_id"]: ns["errors"] for ns in result["failures"]}
    assert errors[100] == [
        {
            "namespace_id": 100,
            "replica_idx": 0,
            "type": "node_unavailable",
            "details": "Every node with capacity for project 1 with size 50 already holds an "
            "index for this namespace",
        }
    ]
    assert errors[110][0]["details"] == "No node can accommodate project 2 with size 5000"


def test_node_names_ride_on_every_index_and_node_entry_when_nodes_have_names():
    result = plan_dict(
        scenario(
            [node(1, 100, "zoekt-a"), node(2, 1000)],
            [
                namespace(10, 100, [(101, 1, 60), (102, 2, 50)]),
                namespace(11, 110, []),
            ],
        )
    )
    (split, empty) = result["create"]
    assert [i["node_name"] for i in split["replicas"][0]["indices"]] == ["zoekt-a", None]
    # The empty replica goes to the roomiest node, the nameless one.
    assert [(i["node_id"], i["node_name"]) for i in empty["replicas"][0]["indices"]] == [(2, None)]
    assert [(n["id"], n["name"]) for n in result["nodes"]] == [(1, "zoekt-a"), (2, None)]
    assert all(i["node_name"] == n["name"] for n in result["nodes"] for i in n["indices"])


def test_without_names_no_name_key_appears():
    text = json.dumps(plan_dict(scenario([node(1, 100)], [namespace(10, 100, [(101, 1, 60)])])))
    assert "node_name" not in text
    assert '"name"' not in text


def test_a_failed_plans_indices_carry_node_name_null_when_the_nodes_have_no_names():
    """GitLab's newest planner names each index's node, null for a nameless one. A placed
    plan carries the key only when some node has a name (the contract); a failed plan's
    indices carry it always, so a scenario without names still gets ``node_name: null``
    there, and nowhere else."""
    nodes = [node(1, 100, "zoekt-a"), node(2, 100)]
    # Project 3 fits no node: the namespace fails after opening two indices.
    failing = namespace(10, 100, [(101, 1, 90), (102, 2, 90), (103, 3, 500)])
    named = plan_dict(scenario(nodes, [failing]))
    (failed,) = named["failures"]
    assert failed["errors"][0]["type"] == "node_unavailable"
    assert [i["node_name"] for i in failed["replicas"][0]["indices"]] == ["zoekt-a", None]
    nameless = plan_dict(scenario([node(1, 100), node(2, 100)], [failing]))
    (failed,) = nameless["failures"]
    assert [i["node_id"] for i in failed["replicas"][0]["indices"]] == [1, 2]
    assert [i["node_name"] for i in failed["replicas"][0]["indices"]] == [None, None]
    assert "node_name" not in json.dumps({k: v for k, v in nameless.items() if k != "failures"})
    assert '"name"' not in json.dumps(nameless)
    parsed = parse_scenario(scenario([node(1, 100), node(2, 100)], [failing]))
    assert dumps(nameless) == dumps(reference_plan(parsed))


def test_namespaces_keep_input_order_and_node_indices_are_sorted_by_namespace():
    result = plan_dict(
        scenario(
            [node(1, 100)],
            [namespace(10, 200, [(201, 1, 30)]), namespace(11, 110, [(111, 2, 50)])],
        )
    )
    assert [ns["namespace_id"] for ns in result["create"]] == [200, 110]
    assert [i["namespace_id"] for i in result["nodes"][0]["indices"]] == [110, 200]


def test_nodes_without_indices_are_left_out_and_the_rest_keep_input_order():
    result = plan_dict(
        scenario(
            [node(5, 10), node(3, 1000), node(9, 5), node(1, 1000)],
            [namespace(10, 100, [(101, 1, 100)], replicas=2)],
        )
    )
    assert [n["id"] for n in result["nodes"]] == [3, 1]


def test_planning_does_not_change_the_scenario():
    data = scenario([node(1, 100)], [namespace(10, 100, [(102, 2, 5), (101, 1, 7)])])
    before = json.dumps(data, sort_keys=True)
    parsed = parse_scenario(data)
    first = plan(parsed).to_json()
    assert json.dumps(data, sort_keys=True) == before
    assert parsed.nodes[0].unclaimed_storage_bytes == 100
    assert plan(parsed).to_json() == first


@pytest.mark.parametrize("memory", [False, True], ids=["disk", "memory on"])
def test_a_plan_leaves_no_reference_cycle_behind(memory):
    """The run is freed when ``plan`` returns: a cycle would keep its node arrays
    and decision records alive until the next full collection."""
    data = synthetic_scenario(2_000)
    parsed = parse_scenario(with_memory_budget(data) if memory else data)
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        result = plan(parsed)
        assert gc.collect() == 0
    finally:
        if was_enabled:
            gc.enable()
    assert result.create
