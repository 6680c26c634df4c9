"""Memory-aware planning through the database edge: settings → loader → core → plan log.

Acceptance criteria 6, 7 and 8 of the memory issue, the node-reported budget
(source B) and its version gate, nodes of different sizes, the reserved
memory of existing indices, and the memory watermark that keeps a node from
taking new indices.
"""

from __future__ import annotations

import copy
import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from planner.core import CONCURRENCY_FACTOR, plan_dict
from planner.loader import load_scenario
from planner.rollout import PLAN_LOG_KEY, Outcome, RolloutService
from planner.scenario import parse_scenario
from planner.selection import SelectionService
from tests.memory.helpers import (
    GIB,
    capture,
    enabled_group,
    indices_of,
    node,
    placed,
    plan_record,
    set_setting,
)
from zoekt import buffer_factor, memory
from zoekt.models import EnabledNamespace, Index

pytestmark = pytest.mark.django_db

# Budget 4,000 bytes, ratio 0.5, concurrency factor 4: an index may hold 1,000 bytes of
# estimated memory, i.e. two projects of repository_size 1,000 (500 each).
BUDGET = 4_000
CEILING = BUDGET // CONCURRENCY_FACTOR
SIZE = 1_000
DISK = 100 * GIB


def strip_memory(scenario: dict) -> dict:
    """The same scenario with every memory input removed: the disk-only planner's input."""
    out = copy.deepcopy(scenario)
    out["options"].pop("memory", None)
    for entry in out["nodes"]:
        entry.pop("memory_budget_bytes", None)
        entry.pop("reserved_memory_bytes", None)
        entry.pop("process_health", None)
    return out


def preview_scenario() -> dict:
    return load_scenario(SelectionService().execute())


def test_the_concurrency_factor_is_the_cores_constant_and_not_a_setting(now):
    set_setting(zoekt_node_memory_budget_bytes=BUDGET)
    node(DISK, "a")
    enabled_group(SIZE)
    options = preview_scenario()["options"]["memory"]
    assert options == {
        "node_memory_budget_bytes": BUDGET,
        "memory_ratio": 0.5,
        "concurrency_factor": CONCURRENCY_FACTOR,
    }
    assert CONCURRENCY_FACTOR == 4
    from zoekt.models import ApplicationSetting

    assert not any("concurrency" in f.name for f in ApplicationSetting._meta.concrete_fields)


def test_an_integral_memory_ratio_is_written_as_an_integer(now):
    set_setting(zoekt_node_memory_budget_bytes=BUDGET, zoekt_memory_ratio=1.0)
    node(DISK, "a")
    enabled_group(SIZE)
    assert preview_scenario()["options"]["memory"]["memory_ratio"] == 1


# --- AC6: the unconditional plan log carries the memory figures -------------------------


def test_ac6_the_plan_log_carries_estimates_ceilings_budgets_before_and_after_and_warnings(
    now, caplog
):
    capture(caplog)
    set_setting(zoekt_node_memory_budget_bytes=BUDGET)
    first = node(DISK, "zoekt-a")
    second = node(DISK - 1, "zoekt-b")  # second in candidate order
    # Five projects of 500 estimated bytes: two per index, two nodes, the fifth cannot split.
    hot = enabled_group(*[SIZE] * 5)

    result = RolloutService().execute(dry_run=False, batch_size=10)

    assert result.outcome == Outcome.SUCCESS
    record = plan_record(caplog)
    assert record["dry_run"] is False
    plan = record[PLAN_LOG_KEY]
    assert plan == result.plan.to_dict()
    indices = indices_of(plan, hot.root_namespace_id)
    # Per index: the estimated memory cost and the ceiling.
    assert [(i["node_id"], i["estimated_memory_bytes"]) for i in indices] == [
        (first.id, 1_000),
        (second.id, 1_500),
    ]
    assert {i["max_memory_bytes"] for i in indices} == {CEILING}
    # Per node: the budget, and unclaimed memory before and after.
    nodes = {n["id"]: n for n in plan["nodes"]}
    assert nodes[first.id]["memory_budget_bytes"] == BUDGET
    assert nodes[first.id]["unclaimed_memory_bytes_before"] == BUDGET
    assert nodes[first.id]["unclaimed_memory_bytes_after"] == BUDGET - 1_000
    assert nodes[second.id]["unclaimed_memory_bytes_after"] == BUDGET - 1_500
    # The degradation warning (1d): the namespace is fully planned, not a failure.
    (ns_plan,) = plan["create"]
    assert plan["failures"] == []
    assert [w["type"] for w in ns_plan["warnings"]] == ["memory_node_exhausted"]
    assert "memory" in ns_plan["warnings"][0]["type"]
    # With every plan, the bounds (the best achievable utilisation and the plan's).
    assert set(plan["bounds"]) == {"disk", "memory"}
    assert {"lower_bound", "max_utilization", "ratio"} <= set(plan["bounds"]["memory"])
    # Provisioned: two indices on two nodes, and no rollout failure stamped.
    assert sorted(
        Index.objects.filter(zoekt_enabled_namespace=hot).values_list("zoekt_node_id", flat=True)
    ) == sorted([first.id, second.id])
    assert EnabledNamespace.objects.get(pk=hot.pk).last_rollout_failed_at is None


def test_ac6_a_dry_run_logs_the_same_memory_payload(now, caplog):
    capture(caplog)
    set_setting(zoekt_node_memory_budget_bytes=BUDGET)
    node(DISK, "zoekt-a")
    hot = enabled_group(*[SIZE] * 3)
    result = RolloutService().execute(dry_run=True, batch_size=10)
    plan = plan_record(caplog)[PLAN_LOG_KEY]
    assert result.outcome == Outcome.DRY_RUN
    assert all("estimated_memory_bytes" in i for i in indices_of(plan, hot.root_namespace_id))
    assert "unclaimed_memory_bytes_after" in plan["nodes"][0]


# --- AC7: the budget setting unset, the plan is the disk-only plan ------------------------


def test_ac7_with_the_budget_unset_the_rollouts_plan_is_the_disk_only_plan(now, caplog):
    capture(caplog)
    # Nodes that report everything memory planning could use: gated limits, RSS at 90 % of
    # them (over the high memory watermark), and a namespace that would split on memory.
    node(DISK, "a", rss=9_000, shards=12, limit=10_000)
    node(DISK - 1, "b", rss=100, limit=2_000)
    node(DISK - 2, "c")
    hot = enabled_group(*[SIZE] * 5)
    placed(node(DISK - 3, "d", rss=1), SIZE)  # a node already holding an index

    scenario = preview_scenario()
    disk_only = plan_dict(strip_memory(scenario))

    # No node budget and no reserved memory reach the planner; nobody is left out for memory.
    assert scenario["options"]["memory"]["node_memory_budget_bytes"] is None
    assert all(entry["memory_budget_bytes"] is None for entry in scenario["nodes"])
    assert all("reserved_memory_bytes" not in entry for entry in scenario["nodes"])
    assert len(scenario["nodes"]) == 4
    result = RolloutService().execute(dry_run=False, batch_size=10)
    logged = plan_record(caplog)[PLAN_LOG_KEY]
    assert json.dumps(logged, sort_keys=True) == json.dumps(disk_only, sort_keys=True)
    assert result.plan.to_json() == json.dumps(
        disk_only, sort_keys=True, indent=2, separators=(",", ": ")
    )
    assert "bounds" not in logged
    assert "estimated_memory_bytes" not in json.dumps(logged)
    # The disk-only plan keeps the namespace in one index on the first node.
    assert len(indices_of(logged, hot.root_namespace_id)) == 1


def test_ac7_setting_the_budget_is_what_turns_memory_planning_on(now):
    node(DISK, "a")
    node(DISK - 1, "b")
    hot = enabled_group(*[SIZE] * 4)
    off = plan_dict(preview_scenario())
    set_setting(zoekt_node_memory_budget_bytes=BUDGET)
    on = plan_dict(preview_scenario())
    assert len(indices_of(off, hot.root_namespace_id)) == 1
    assert len({i["node_id"] for i in indices_of(on, hot.root_namespace_id)}) == 2


# --- AC8: nodes without process health are planned, not excluded -----------------------------


@pytest.mark.parametrize(
    "health",
    [
        pytest.param(..., id="process-health-absent"),
        pytest.param(None, id="process-health-null"),
        pytest.param({}, id="process-health-empty"),
        pytest.param({"indexer": {"rss_bytes": 5}}, id="no-webserver-key"),
        pytest.param({"webserver": {}}, id="webserver-without-counters"),
    ],
)
def test_ac8_nodes_without_webserver_health_get_a_memory_aware_plan(now, caplog, health):
    capture(caplog)
    set_setting(zoekt_node_memory_budget_bytes=BUDGET)
    first = node(DISK, "a", process_health=health)
    second = node(DISK - 1, "b", process_health=health)
    hot = enabled_group(*[SIZE] * 4)

    result = RolloutService().execute(dry_run=False, batch_size=10)

    assert result.outcome == Outcome.SUCCESS
    assert [entry["id"] for entry in result.scenario["nodes"]] == [first.id, second.id]
    plan = plan_record(caplog)[PLAN_LOG_KEY]
    assert plan["failures"] == []
    indices = indices_of(plan, hot.root_namespace_id)
    assert [i["node_id"] for i in indices] == [first.id, second.id]  # split on memory
    assert [i["estimated_memory_bytes"] for i in indices] == [1_000, 1_000]
    assert "bounds" in plan


# --- source B: the node's own limit, behind the version gate ----------------------------------


def test_source_b_a_gated_node_is_planned_against_its_reported_limit_others_against_a(now):
    set_setting(zoekt_node_memory_budget_bytes=BUDGET)
    own = node(DISK, "own", limit=40_000, version="v1.16.0")
    old = node(DISK - 1, "old", limit=40_000, version="v1.15.9")
    silent = node(DISK - 2, "silent")
    unparsable = node(DISK - 3, "dev", limit=40_000, version="dev-build")
    unlimited = node(DISK - 4, "unlimited", limit=9223372036854771712)

    scenario = preview_scenario()

    budgets = {entry["id"]: entry["memory_budget_bytes"] for entry in scenario["nodes"]}
    assert budgets == {
        own.id: 40_000,
        old.id: None,
        silent.id: None,
        unparsable.id: None,
        unlimited.id: None,
    }
    parsed = parse_scenario(scenario)
    assert [parsed.memory_budget(n) for n in parsed.nodes] == [40_000] + [BUDGET] * 4


def test_nodes_of_different_sizes_are_planned_against_their_own_budgets(now):
    set_setting(zoekt_node_memory_budget_bytes=BUDGET)
    big = node(DISK, "big", limit=40_000)  # ceiling 10,000
    small = node(DISK - 1, "small", limit=4_000)  # ceiling 1,000
    roomy = enabled_group(*[SIZE] * 4)  # 2,000 estimated: fits one index on the big node

    plan = plan_dict(preview_scenario())

    (index,) = indices_of(plan, roomy.root_namespace_id)
    assert (index["node_id"], index["max_memory_bytes"]) == (big.id, 10_000)
    assert index["estimated_memory_bytes"] == 2_000
    nodes = {n["id"]: n for n in plan["nodes"]}
    assert nodes[big.id]["memory_budget_bytes"] == 40_000
    assert small.id not in nodes

    # The same fleet planned against the configured budget alone splits the namespace.
    for n in (big, small):
        n.metadata["process_health"]["webserver"].pop("memory_limit_bytes")
        n.save()
    uniform = plan_dict(preview_scenario())
    assert [
        (i["node_id"], i["max_memory_bytes"]) for i in indices_of(uniform, roomy.root_namespace_id)
    ] == [
        (big.id, CEILING),
        (small.id, CEILING),
    ]


def test_a_node_whose_own_budget_is_used_up_takes_no_more_although_it_has_disk(now):
    # GitLab's first fit: the first candidate takes what its memory allows.
    set_setting(zoekt_node_memory_budget_bytes=10**9, zoekt_placement_strategy="first_fit")
    small = node(DISK, "small", limit=4_000)  # first candidate; room for 4 × 1,000
    big = node(DISK - 1, "big", limit=10**9)
    groups = [enabled_group(SIZE, SIZE) for _ in range(5)]  # 1,000 estimated each

    plan = plan_dict(preview_scenario())

    placements = [[i["node_id"] for i in indices_of(plan, g.root_namespace_id)] for g in groups]
    assert placements == [[small.id]] * 4 + [[big.id]]
    nodes = {n["id"]: n for n in plan["nodes"]}
    assert nodes[small.id]["unclaimed_memory_bytes_after"] == 0
    assert nodes[small.id]["unclaimed_storage_bytes_after"] > 0
    assert plan["failures"] == []


# --- memory already used by existing indices ----------------------------------------------


def test_existing_indices_reserve_their_estimated_memory_on_their_node(now):
    set_setting(zoekt_node_memory_budget_bytes=BUDGET, zoekt_placement_strategy="first_fit")
    busy = node(DISK, "busy")
    idle = node(DISK - 1, "idle")
    placed(busy, 2_000, 1_000)  # ready: 1,500 estimated
    placed(busy, 600, state=Index.State.PENDING)  # pre-ready: 300
    placed(busy, 10_000, state=Index.State.ORPHANED)  # not held: not counted
    placed(busy, 10_000, state=Index.State.EVICTED)
    ranged = placed(idle, SIZE, SIZE, SIZE)  # only the first project is in its range
    first_project = ranged.zoekt_enabled_namespace.root_namespace.projects.order_by(
        "project_namespace_id"
    ).first()
    ranged.metadata = {"project_namespace_id_to": first_project.project_namespace_id}
    ranged.save()
    enabled_group(SIZE)

    scenario = preview_scenario()

    reserved = {entry["id"]: entry["reserved_memory_bytes"] for entry in scenario["nodes"]}
    assert reserved == {busy.id: 1_800, idle.id: 500}
    plan = plan_dict(scenario)
    nodes = {n["id"]: n for n in plan["nodes"]}
    assert nodes[busy.id]["unclaimed_memory_bytes_before"] == BUDGET - 1_800


def test_the_loader_costs_one_more_query_with_memory_on_whatever_the_fleet(now):
    set_setting(zoekt_node_memory_budget_bytes=10**12)
    buffer_factor.global_buffer_factor()
    target = node(10**12, "a")
    enabled_group(1, 2, 3)
    counts = []
    for extra in (1, 10):
        for _ in range(extra):
            placed(target, 5, 6)
        pool = SelectionService().execute()
        with CaptureQueriesContext(connection) as queries:
            load_scenario(pool)
        counts.append(len(queries))
    # Replicas, the nodes holding the namespaces' indices, projects; and the reserved memory.
    assert counts == [4, 4]


# --- the memory high watermark: no new index -----------------------------------------------


def test_a_node_over_the_high_memory_watermark_is_not_a_candidate(now):
    set_setting(zoekt_node_memory_budget_bytes=10_000)
    hot = node(DISK, "hot", rss=7_500, version=None)  # 75 % of the configured budget
    warm = node(DISK - 1, "warm", rss=7_499, version=None)
    own = node(DISK - 2, "own", rss=7_500, limit=100_000)  # 7.5 % of its own limit
    enabled_group(SIZE)

    service = SelectionService()
    pool = service.execute()

    assert [n.id for n in pool.nodes] == [warm.id, own.id]
    assert pool.memory_excluded == ((hot.id, 0.75),)


def test_the_memory_watermark_excludes_nobody_while_the_budget_is_unset(now):
    node(DISK, "hot", rss=10**12, limit=1_000)
    node(DISK - 1, "warm")
    assert len(SelectionService().execute().nodes) == 2


def test_zoekt_plan_says_why_a_node_over_the_memory_watermark_is_not_a_candidate(now):
    set_setting(zoekt_node_memory_budget_bytes=10_000)
    hot = node(DISK, "zoekt-hot", rss=8_000, version=None)
    node(DISK - 1, "zoekt-cool", rss=100, version=None)
    enabled_group(SIZE, SIZE)
    out = StringIO()

    call_command("zoekt_plan", stdout=out, stderr=StringIO(), verbosity=0)

    text = out.getvalue()
    assert "Memory planning: on" in text
    (line,) = [line for line in text.splitlines() if f"node {hot.id} (zoekt-hot)" in line]
    assert "high memory watermark" in line
    assert "80.0%" in line and "memory_high_watermark" in line
    assert "estimated memory" in text
    assert "memory budget" in text


def test_zoekt_plan_says_memory_planning_is_off_without_the_budget(now):
    node(DISK, "zoekt-a")
    enabled_group(SIZE)
    out = StringIO()
    call_command("zoekt_plan", stdout=out, stderr=StringIO(), verbosity=0)
    assert "Memory planning: off" in out.getvalue()
    assert "estimated memory" not in out.getvalue()


def test_memory_report_figures_match_what_the_loader_reserves(now):
    set_setting(zoekt_node_memory_budget_bytes=BUDGET)
    busy = node(DISK, "busy")
    placed(busy, 2_000, 1_000)
    enabled_group(SIZE)
    (entry,) = memory.node_memory_report()
    reserved = preview_scenario()["nodes"][0]["reserved_memory_bytes"]
    assert entry.estimated_memory_bytes == reserved == 1_500
