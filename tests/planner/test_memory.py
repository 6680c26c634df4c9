"""The memory dimension, one test per acceptance criterion of the seed that concerns the planner.

``../shared/seeds/memory-aware-planning.md``, criteria 1–8 (9–12 are the info
output, the SaaS gate and the documentation, not the pure core). Fixtures use
a buffer factor and a memory ratio of 1 where the arithmetic should read
directly: a project of repository size 60 needs 60 disk bytes and 60 bytes
of estimated memory, and a budget of 400 with the default concurrency factor
of 4 makes ``max_memory_bytes`` 100.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from planner.core import CONCURRENCY_FACTOR, plan, plan_dict
from planner.explain import explain, render_text
from planner.plan import dumps
from planner.scenario import ScenarioError, parse_scenario
from tests.planner.builders import namespace, node, scenario
from tests.planner.test_cli import run
from tests.planner.test_memory_properties import strip_plan

DATA = Path(__file__).parent / "data"
GIB = 1 << 30
N = None


def with_memory(
    data: dict[str, Any],
    budget: int | None = None,
    *,
    ratio: int | float = 1,
    concurrency: int | float | None = None,
) -> dict[str, Any]:
    """The scenario with ``options.memory`` set (``budget`` None: the dimension stays off)."""
    out = copy.deepcopy(data)
    memory: dict[str, Any] = {"node_memory_budget_bytes": budget, "memory_ratio": ratio}
    if concurrency is not None:
        memory["concurrency_factor"] = concurrency
    out["options"]["memory"] = memory
    return out


def hot(projects: int = 3, size: int = 60) -> dict[str, Any]:
    return namespace(10, 100, [(101 + i, 1 + i, size) for i in range(projects)])


def layout(ns: dict[str, Any]) -> list[list[tuple[Any, ...]]]:
    """Each replica as (node, from, to, required, estimated memory, max memory)."""
    return [
        [
            (
                index["node_id"],
                index["projects"]["project_namespace_id_from"],
                index["projects"]["project_namespace_id_to"],
                index["required_storage_bytes"],
                index["estimated_memory_bytes"],
                index["max_memory_bytes"],
            )
            for index in replica["indices"]
        ]
        for replica in ns["replicas"]
    ]


def node_ids(ns: dict[str, Any]) -> list[int]:
    return [index["node_id"] for replica in ns["replicas"] for index in replica["indices"]]


def warning_types(ns: dict[str, Any]) -> list[str]:
    return [warning["type"] for warning in ns["warnings"]]


# --------------------------------------------------------------------------- #
# Criterion 1
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("nodes", "want"),
    [
        pytest.param(
            2,
            [[(1, N, 101, 60, 60, 100), (2, 102, N, 120, 120, 100)]],
            id="two nodes: two indices, and the second keeps the rest past the ceiling",
        ),
        pytest.param(
            3,
            [[(1, N, 101, 60, 60, 100), (2, 102, 102, 60, 60, 100), (3, 103, N, 60, 60, 100)]],
            id="three nodes: three indices, each under the ceiling",
        ),
    ],
)
def test_ac1_hot_namespace_splits_across_distinct_nodes(nodes, want):
    # Ample disk; the namespace's 180 bytes of estimated memory exceed the
    # 100-byte max_memory_bytes (budget 400 / concurrency factor 4).
    data = scenario([node(i, 1_000_000) for i in range(1, nodes + 1)], [hot()])
    result = plan_dict(with_memory(data, 400))
    (ns,) = result["create"]
    used = node_ids(ns)
    # EVERY index on its own node (a 2+1 layout fails here), and more than one.
    assert len(used) == len(set(used)) > 1
    assert layout(ns) == want
    assert result["failures"] == []

    # The same fixture with the memory constraint off: one index on one node.
    (disk_only,) = plan_dict(with_memory(data, None))["create"]
    assert [[index[:4] for index in replica] for replica in layout_disk(disk_only)] == [
        [(1, N, N, 180)]
    ]


def layout_disk(ns: dict[str, Any]) -> list[list[tuple[Any, ...]]]:
    return [
        [
            (
                index["node_id"],
                index["projects"]["project_namespace_id_from"],
                index["projects"]["project_namespace_id_to"],
                index["required_storage_bytes"],
            )
            for index in replica["indices"]
        ]
        for replica in ns["replicas"]
    ]


def test_ac1_the_rollover_never_returns_to_the_node_where_the_ceiling_was_hit():
    # Node 1 keeps plenty of disk and memory after index 0 reaches the
    # ceiling, so a first fit would return node 1 again (seed 1c): the node
    # holds an index of the namespace and is excluded before the new node is
    # chosen.
    data = scenario([node(1, 1_000_000), node(2, 1_000_000)], [hot(2)])
    result = plan(parse_scenario(with_memory(data, 400)))
    (ns,) = explain(result)
    second = ns["decisions"][1]
    assert (second["kind"], second["node_id"], second["cause"]) == (
        "new_index",
        2,
        "memory_ceiling",
    )
    assert second["passed_over"][0]["reasons"][0]["reason"] == "exhausted"


# --------------------------------------------------------------------------- #
# Criterion 2
# --------------------------------------------------------------------------- #


def test_ac2_budgets_satisfied_plan_is_byte_identical_to_disk_only():
    text = (DATA / "rollover_scenario.json").read_text()
    disk_only = plan(parse_scenario(json.loads(text))).to_json()
    assert disk_only + "\n" == (DATA / "rollover_plan.json").read_text()

    data = json.loads(text)
    data.setdefault("options", {})["memory"] = {"node_memory_budget_bytes": 10**15}
    with_budget = plan_dict(data)
    assert "bounds" in with_budget  # the memory dimension is on...
    # ...and, memory keys aside, the plan is byte for byte the disk-only plan.
    assert dumps(strip_plan(with_budget)) == disk_only
    assert all(not ns["warnings"] for ns in with_budget["create"] + with_budget["failures"])


# --------------------------------------------------------------------------- #
# Criterion 3
# --------------------------------------------------------------------------- #


def test_ac3_node_with_disk_but_not_memory_is_rejected_with_memory_type():
    # Node 1 has the disk but a memory budget of 50 (its own, Option B);
    # node 2 has memory but not the disk. A project of 100 bytes.
    data = scenario(
        [
            {**node(1, 1000), "memory_budget_bytes": 50},
            {**node(2, 10), "memory_budget_bytes": 10_000},
        ],
        [namespace(10, 100, [(101, 1, 100)]), namespace(11, 110, [])],
    )
    result = plan_dict(with_memory(data, None))
    ns, empty = result["create"]
    # The project keeps the disk-only decision (node 1), so the namespace is
    # planned; the rejection is a memory-typed warning, not node_unavailable.
    assert ns["errors"] == [] and result["failures"] == []
    assert node_ids(ns) == [1]
    (warning,) = ns["warnings"]
    assert warning["type"] == "memory_budget_insufficient"
    assert warning["type"] != "node_unavailable" and "memory" in warning["type"]
    assert warning["replica_idx"] == 0
    assert warning["details"].startswith("Node 1 has the unclaimed storage for project 1")
    assert "(100 bytes requested, 50 available)" in warning["details"]
    # The empty replica (GitLab's create_empty_replica) has no memory cost:
    # no memory check and no warning there.
    assert empty["warnings"] == [] and node_ids(empty) == [1]

    # The decision record says the same, per dimension.
    explained = explain(plan(parse_scenario(with_memory(data, None))), namespace_id=100)
    (decision,) = explained[0]["decisions"]
    assert decision["warning"] == "memory_budget_insufficient"
    assert decision["requested"] == {"disk": 100, "memory": 100}
    assert decision["available"] == {"disk": 1000, "memory": 50}


def test_ac3_a_node_short_of_memory_is_passed_over_for_one_with_both():
    data = scenario(
        [
            {**node(1, 1000), "memory_budget_bytes": 50},
            {**node(2, 1000), "memory_budget_bytes": 10_000},
        ],
        [namespace(10, 100, [(101, 1, 100)])],
    )
    result = plan(parse_scenario(with_memory(data, None)))
    (ns,) = result.to_dict()["create"]
    assert node_ids(ns) == [2] and ns["warnings"] == []
    (decision,) = explain(result)[0]["decisions"]
    assert decision["passed_over"] == [
        {
            "node_id": 1,
            "reasons": [
                {
                    "node_id": 1,
                    "reason": "insufficient_unclaimed_memory",
                    "dimension": "memory",
                    "requested": 100,
                    "available": 50,
                }
            ],
        }
    ]
    text = render_text(explain(result))
    assert "node 1 passed over: insufficient unclaimed memory (requested 100, available 50" in text


# --------------------------------------------------------------------------- #
# Criterion 4
# --------------------------------------------------------------------------- #


def test_ac4_memory_split_exhausts_two_nodes_with_distinct_diagnostic():
    data = scenario([node(1, 1_000_000), node(2, 1_000_000)], [hot(6, 50)])
    result = plan_dict(with_memory(data, 400))
    (ns,) = result["create"]
    # Exactly two indices, one per node...
    assert node_ids(ns) == [1, 2]
    # ...and the planner says it could not split further because the nodes
    # ran out: a memory type, distinct from disk exhaustion's node_unavailable.
    assert warning_types(ns) == ["memory_node_exhausted"]
    (warning,) = ns["warnings"]
    assert "the nodes ran out" in warning["details"]
    assert "Over max_memory_bytes: index" in warning["details"]

    # Disk-driven exhaustion of the same two nodes is GitLab's error instead.
    disk_bound = scenario([node(1, 100), node(2, 100)], [hot(6, 50)])
    (failed,) = plan_dict(disk_bound)["failures"]
    assert {e["type"] for e in failed["errors"]} == {"node_unavailable"}
    assert "node_unavailable" not in warning_types(ns)


def test_ac4_the_split_is_balanced_when_the_ceiling_cannot_be_kept():
    # 300 bytes need three 100-byte indices; two nodes allow two, so each
    # index takes about half (the seed's "50/50 is the best case").
    data = scenario([node(1, 1_000_000), node(2, 1_000_000)], [hot(6, 50)])
    (ns,) = plan_dict(with_memory(data, 400))["create"]
    assert [index[4] for index in layout(ns)[0]] == [150, 150]


# --------------------------------------------------------------------------- #
# Criterion 5
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("data", "want_layout", "want_warnings"),
    [
        pytest.param(
            scenario([node(1, 1_000_000)], [hot(5, 30)]),
            [[(1, N, N, 150, 150, 100)]],
            ["memory_node_exhausted"],
            id="one node: nothing to split onto",
        ),
        pytest.param(
            scenario(
                [node(1, 1_000_000), node(2, 1_000_000), node(3, 1_000_000)],
                [hot(5, 30)],
                max_indices_per_replica=2,
            ),
            # A second index would reach the cap of 2 with projects still to
            # come, and GitLab fails a replica at the cap on its next project
            # (10.4): the split is not attempted.
            [[(1, N, N, 150, 150, 100)]],
            ["memory_index_limit_reached"],
            id="the index cap stops the split",
        ),
        pytest.param(
            scenario(
                [
                    {**node(1, 1_000_000), "memory_budget_bytes": 400},
                    {**node(2, 1_000_000), "memory_budget_bytes": 40},
                ],
                [hot(3, 60)],
            ),
            # Node 2 has the disk for a new index but not the memory.
            [[(1, N, N, 180, 180, 100)]],
            ["memory_budget_insufficient"],
            id="the other node has the disk but not the memory",
        ),
        pytest.param(
            scenario(
                [node(1, 20), node(2, 20)],
                [namespace(10, 100, [(101, 1, 1), (102, 2, 1)], replicas=2)],
            ),
            [[(1, N, N, 2, 2, 1)], [(2, N, N, 2, 2, 1)]],
            ["memory_placement_abandoned"],
            id="splitting replica 0 would leave no node for replica 1: disk-only plan",
        ),
    ],
)
def test_ac5_unsatisfiable_ceiling_is_fully_planned_with_warning_not_failure(
    data, want_layout, want_warnings
):
    budget = 4 if want_warnings == ["memory_placement_abandoned"] else 400
    memory_on = with_memory(data, budget if "memory_budget_bytes" not in data["nodes"][0] else None)
    result = plan_dict(memory_on)
    assert result["failures"] == []
    (ns,) = result["create"]
    assert ns["errors"] == []
    assert layout(ns) == want_layout
    assert warning_types(ns) == want_warnings
    # Every project with statistics is placed, once per replica.
    for replica in ns["replicas"]:
        assert sum(index["required_storage_bytes"] for index in replica["indices"]) == sum(
            p["repository_size"] for p in data["namespaces"][0]["projects"]
        )


def test_ac5_memory_never_turns_a_plan_into_a_failure():
    # The disk-only plan of the same fixture fails for disk reasons; with
    # memory on it fails in exactly the same way (GitLab's verdict), and a
    # namespace that only memory would have failed is planned.
    data = scenario([node(1, 100), node(2, 100)], [hot(6, 50)])
    disk_only = plan_dict(data)
    memory_on = plan_dict(with_memory(data, 400))
    assert strip_plan(memory_on)["failures"] == disk_only["failures"]
    assert all(e["type"] == "node_unavailable" for f in memory_on["failures"] for e in f["errors"])


# --------------------------------------------------------------------------- #
# Criterion 6
# --------------------------------------------------------------------------- #


def test_ac6_plan_output_carries_memory_fields_and_warnings():
    data = scenario([node(1, 1_000_000), {**node(2, 1_000_000), "reserved_memory_bytes": 30}], [])
    data["namespaces"] = [hot(6, 50), namespace(11, 110, [(111, 7, 10)])]
    result = plan_dict(with_memory(data, 400))
    ns = {plan["namespace_id"]: plan for plan in result["create"]}
    # Per index: the estimated memory cost and the ceiling.
    assert layout(ns[100]) == [[(1, N, 103, 150, 150, 100), (2, 104, N, 150, 150, 100)]]
    assert layout(ns[110]) == [[(1, N, N, 10, 10, 100)]]
    # Per node: the budget before and after (reserved memory counts as used).
    nodes = {n["id"]: n for n in result["nodes"]}
    assert {
        node_id: (
            n["memory_budget_bytes"],
            n["unclaimed_memory_bytes_before"],
            n["unclaimed_memory_bytes_after"],
        )
        for node_id, n in nodes.items()
    } == {1: (400, 400, 240), 2: (400, 370, 220)}
    assert all(
        {"estimated_memory_bytes", "max_memory_bytes"} <= set(index)
        for n in result["nodes"]
        for index in n["indices"]
    )
    # The degradation warning.
    assert warning_types(ns[100]) == ["memory_node_exhausted"]
    # The bounds: the busiest node against the best achievable.
    assert result["bounds"] == {
        "disk": {"lower_bound": 0.000155, "max_utilization": 0.00016, "ratio": 1.032258},
        # 310 bytes over 770 of room; the busiest node took 160 of 400.
        "memory": {"lower_bound": 0.402597, "max_utilization": 0.405405, "ratio": 1.006975},
    }
    # Deterministic, sorted, no memory key missing from the JSON.
    text = plan(parse_scenario(with_memory(data, 400))).to_json()
    assert text == plan(parse_scenario(with_memory(data, 400))).to_json()
    assert json.loads(text)["bounds"]["memory"]["ratio"] == 1.006975


def test_ac6_a_node_without_any_budget_is_unlimited_and_says_so():
    # Memory is on (node 1 reports a budget); node 2 has none (no Option B
    # report, no Option A setting): it is not memory-constrained.
    data = scenario(
        [{**node(1, 150), "memory_budget_bytes": 400}, node(2, 1_000_000)], [hot(3, 60)]
    )
    result = plan_dict(with_memory(data, None))
    (ns,) = result["create"]
    assert layout(ns) == [[(1, N, 101, 60, 60, 100), (2, 102, N, 120, 120, None)]]
    node_2 = result["nodes"][1]
    assert (
        node_2["memory_budget_bytes"],
        node_2["unclaimed_memory_bytes_before"],
        node_2["unclaimed_memory_bytes_after"],
    ) == (None, None, None)
    # An unlimited node could absorb everything: the memory bound is 0.
    assert result["bounds"]["memory"]["lower_bound"] == 0.0


# --------------------------------------------------------------------------- #
# Criterion 7
# --------------------------------------------------------------------------- #


def test_ac7_budget_unset_gives_the_same_plan_as_before():
    text = (DATA / "rollover_scenario.json").read_text()
    data = json.loads(text)
    data.setdefault("options", {})["memory"] = {
        "node_memory_budget_bytes": None,
        "memory_ratio": 0.25,
        "concurrency_factor": 2,
    }
    for n in data["nodes"]:
        n["memory_budget_bytes"] = None
        n["reserved_memory_bytes"] = 123
        n["process_health"] = {"webserver": {"rss_bytes": 5 * GIB, "shards_loaded": 3}}
    assert plan(parse_scenario(data)).to_json() + "\n" == (DATA / "rollover_plan.json").read_text()
    assert not parse_scenario(data).memory_on


# --------------------------------------------------------------------------- #
# Criterion 8
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "health",
    [
        pytest.param("absent", id="process_health absent"),
        pytest.param(None, id="process_health null"),
        pytest.param({}, id="process_health empty"),
        pytest.param({"indexer": {"rss_bytes": 10}}, id="no webserver key"),
        pytest.param({"webserver": {}}, id="webserver without figures"),
        pytest.param({"webserver": {"rss_bytes": None}}, id="rss null"),
    ],
)
@pytest.mark.parametrize("own_budget", [False, True], ids=["option A", "option B"])
def test_ac8_missing_process_health_still_memory_aware_and_not_excluded(health, own_budget):
    first = node(1, 1_000_000)
    if health != "absent":
        first["process_health"] = health
    if own_budget:
        first["memory_budget_bytes"] = 400
    second = {**node(2, 1_000_000), "process_health": {"webserver": {"rss_bytes": 9}}}
    data = scenario([first, second], [hot()])
    result = plan_dict(with_memory(data, None if own_budget else 400))
    assert result["failures"] == []
    (ns,) = result["create"]
    # Memory-aware (the split happened) and the node without telemetry took
    # the first index: it was not excluded.
    assert "bounds" in result
    assert node_ids(ns)[0] == 1 and len(node_ids(ns)) == 2


# --------------------------------------------------------------------------- #
# The seed's reported cluster
# --------------------------------------------------------------------------- #


def node_memory(result: dict[str, Any], data: dict[str, Any]) -> dict[int, int]:
    reserved = {n["id"]: n.get("reserved_memory_bytes") or 0 for n in data["nodes"]}
    placed = {
        n["id"]: sum(i["estimated_memory_bytes"] for i in n["indices"]) for n in result["nodes"]
    }
    return {node_id: reserved[node_id] + placed.get(node_id, 0) for node_id in reserved}


def test_the_seed_reported_cluster_is_balanced_by_the_memory_aware_plan():
    data = json.loads((DATA / "seed_reported_cluster.json").read_text())
    parsed = parse_scenario(data)

    disk_only = plan(parsed, memory_aware=False).to_dict()
    memory = node_memory(disk_only, data)
    # The reported shape: ~136 GiB of webserver memory on node 0, ~5 GiB on node 1.
    assert round(memory[0] / GIB) == 136 and round(memory[1] / GIB) == 5
    assert memory[0] / memory[1] > 25

    aware = plan(parsed).to_dict()
    (ns,) = aware["create"]
    assert node_ids(ns) == [0, 1]
    memory = node_memory(aware, data)
    assert max(memory.values()) / min(memory.values()) < 1.15
    budget = data["options"]["memory"]["node_memory_budget_bytes"]
    assert max(memory.values()) < budget
    # Two nodes bind: the split could not go further, and says so.
    assert warning_types(ns) == ["memory_node_exhausted"]
    assert aware["failures"] == []


def test_the_concurrency_factor_is_a_named_constant_with_default_4():
    assert CONCURRENCY_FACTOR == 4
    data = with_memory(scenario([node(1, 1000)], [hot(1)]), 1000)
    del data["options"]["memory"]["memory_ratio"]
    (ns,) = plan_dict(data)["create"]
    # Defaults: memory_ratio 0.5, max_memory_bytes = 1000 // 4.
    assert layout(ns) == [[(1, N, N, 60, 30, 250)]]
    data["options"]["memory"]["concurrency_factor"] = 2.5
    (ns,) = plan_dict(data)["create"]
    assert layout(ns)[0][0][5] == 400


# --------------------------------------------------------------------------- #
# The estimate, the ceiling and the contract extension
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("ratio", "sizes", "want"),
    [
        pytest.param(0.5, [3, 3], 3, id="0.5: 6 bytes make 3, not 2 + 2 rounded per project"),
        pytest.param(0.1, [15], 2, id="0.1 is exactly 1/10: 1.5 rounds up to 2"),
        pytest.param(1.5, [1, 1, 1], 5, id="1.5: 4.5 rounds up once"),
        pytest.param(2, [7, 0], 14, id="an integral ratio is exact"),
    ],
)
def test_an_index_estimate_is_the_repository_bytes_times_the_ratio_rounded_up_once(
    ratio, sizes, want
):
    data = scenario(
        [node(1, 10**6)], [namespace(10, 100, [(101 + i, 1 + i, s) for i, s in enumerate(sizes)])]
    )
    (ns,) = plan_dict(with_memory(data, 10**6, ratio=ratio))["create"]
    assert layout(ns)[0][0][4] == want


def test_the_estimate_ignores_the_buffer_factor():
    data = scenario([node(1, 10**6)], [hot(1, 100)], buffer_factor=3)
    (ns,) = plan_dict(with_memory(data, 10**6, ratio=0.5))["create"]
    assert layout(ns)[0][0][3:5] == (300, 50)


@pytest.mark.parametrize(
    ("budget", "factor", "want"),
    [(400, 4, 100), (401, 4, 100), (1000, 2.5, 400), (10, 3, 3), (0, 4, 0)],
)
def test_max_memory_bytes_is_the_budget_over_the_concurrency_factor_rounded_down(
    budget, factor, want
):
    data = scenario([node(1, 10**6)], [hot(1, 0)])
    (ns,) = plan_dict(with_memory(data, budget, concurrency=factor))["create"]
    assert layout(ns)[0][0][5] == want


def test_reserved_memory_is_an_optional_non_negative_node_field():
    data = with_memory(scenario([node(1, 10**6)], [hot(1)]), 400)
    data["nodes"][0]["reserved_memory_bytes"] = None
    assert parse_scenario(data).nodes[0].reserved_memory_bytes is None
    data["nodes"][0]["reserved_memory_bytes"] = -1
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data)
    assert caught.value.field_path == "nodes[0].reserved_memory_bytes"


def test_reserved_memory_counts_against_the_budget_but_not_the_ceiling():
    # Node 1 already holds 350 of its 400: a 60-byte project needs a node
    # with the memory, so it goes to node 2; the ceiling stays 400 // 4.
    data = scenario([{**node(1, 10**6), "reserved_memory_bytes": 350}, node(2, 10**6)], [hot(1)])
    result = plan_dict(with_memory(data, 400))
    (ns,) = result["create"]
    assert layout(ns) == [[(2, N, N, 60, 60, 100)]]


def test_the_command_line_plans_and_explains_with_memory():
    source = str(DATA / "seed_reported_cluster.json")
    done = run("plan", "--input", source)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result["bounds"]) == {"disk", "memory"}
    assert result["failures"] == []
    done = run("explain", "--input", source)
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "warning memory_node_exhausted (replica 0)" in text
    assert "(the last index reached its max_memory_bytes)" in text
    assert "stays on node 0 past the index's memory limit" in text
