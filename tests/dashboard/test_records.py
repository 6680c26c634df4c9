"""Rollout plans kept for the dashboard (planner.records), pruned to the last 50."""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from planner import records
from planner.models import RolloutPlan
from planner.rollout import RolloutService
from planner.tasks import rollout_task
from tests.dashboard.builders import GIB, build_fleet, unplaced_namespace
from zoekt import app_settings

pytestmark = pytest.mark.django_db


def test_a_dry_run_keeps_its_plan_summary_and_explanation(now):
    build_fleet(3, 0)
    fits = unplaced_namespace("fits", (10**6, 2 * 10**6))
    too_big = unplaced_namespace("too-big", (10**15,))
    result = RolloutService(record_decisions=True).execute(dry_run=True, batch_size=10)
    row = RolloutPlan.objects.get()
    assert row.dry_run is True
    assert row.plan == result.plan.to_dict()  # exactly the logged plan record
    summary = row.summary
    assert summary["outcome"] == "dry_run"
    assert (summary["create"], summary["failures"]) == (1, 1)
    assert summary["namespaces_selected"] == summary["namespaces_planned"] == 2
    assert summary["nodes_available"] == 3
    assert set(summary["node_names"].values()) == {"zoekt-0", "zoekt-1", "zoekt-2"}
    assert summary["bounds_source"] == "disk_estimate"
    assert set(summary["bounds"]["disk"]) == {"lower_bound", "max_utilization", "ratio"}
    assert summary["seconds"].keys() >= {"select", "load", "plan"}
    explained = {item["namespace_id"]: item for item in row.explanation}
    assert set(explained) == {too_big.root_namespace_id, fits.root_namespace_id}
    failed = explained[too_big.root_namespace_id]
    assert failed["failed"] and failed["errors"][0]["type"] == "node_unavailable"
    assert {node["passed_over"]["insufficient_unclaimed_storage"] for node in failed["nodes"]} == {
        1
    }
    reason = failed["nodes"][0]["last"]["insufficient_unclaimed_storage"]
    assert reason["requested"] > reason["available"]
    ok = explained[fits.root_namespace_id]
    # Balanced (the product's default): the roomiest took it; the other two could have.
    assert sorted(node["taken"] for node in ok["nodes"]) == [[], [], [[0, 0]]]
    assert [node["passed_over"] for node in ok["nodes"] if not node["taken"]] == [
        {"usable_not_chosen": 1}
    ] * 2


def test_a_rollout_without_decision_records_keeps_no_explanation(now):
    build_fleet(2, 0)
    unplaced_namespace("plain", (10**6,))
    RolloutService().execute(dry_run=True, batch_size=10)
    assert RolloutPlan.objects.get().explanation is None


def test_the_rollout_job_keeps_decision_records_for_the_dashboard(now):
    build_fleet(2, 0)
    unplaced_namespace("job", (10**6,))
    row = app_settings.load_row()
    row.zoekt_indexing_enabled = True
    row.save()
    assert rollout_task()["outcome"] == "success"
    plan = RolloutPlan.objects.get()
    assert plan.dry_run is False
    assert plan.explanation[0]["nodes"][0]["taken"] == [[0, 0]]


def test_a_preview_keeps_nothing(now):
    build_fleet(2, 0)
    unplaced_namespace("preview", (10**6,))
    RolloutService(record_decisions=True).preview(batch_size=10)
    assert not RolloutPlan.objects.exists()


def test_nothing_to_plan_keeps_nothing(now):
    build_fleet(2, 0)
    RolloutService().execute(dry_run=True)
    assert not RolloutPlan.objects.exists()


def test_only_the_newest_fifty_plans_are_kept(now):
    RolloutPlan.objects.bulk_create([RolloutPlan(summary={"n": i}) for i in range(53)])
    newest = list(RolloutPlan.objects.order_by("-id").values_list("id", flat=True)[:50])
    assert records.prune() == 3
    assert sorted(RolloutPlan.objects.values_list("id", flat=True), reverse=True) == newest


def test_recording_prunes_in_a_fixed_number_of_statements(now):
    build_fleet(2, 0)
    unplaced_namespace("one", (10**6,))
    result = RolloutService(record_decisions=True).execute(dry_run=True, batch_size=10)
    RolloutPlan.objects.bulk_create([RolloutPlan() for _ in range(60)])
    with CaptureQueriesContext(connection) as captured:
        records.record_rollout_plan(result)
    # savepoint, insert, delete, release
    assert len(captured) == 4
    assert RolloutPlan.objects.count() == records.KEEP


def test_a_failure_to_record_never_fails_the_rollout(now, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    build_fleet(2, 0)
    unplaced_namespace("unlucky", (10**6,))

    def broken(*args, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    monkeypatch.setattr(RolloutPlan.objects, "create", broken)
    result = RolloutService().execute(dry_run=False, batch_size=10)
    assert result.outcome == "success"  # and the transaction is still usable
    assert not RolloutPlan.objects.exists()
    assert "rollout_plan_not_recorded" in caplog.text


def test_explanations_are_capped_per_plan_and_per_namespace_failures_first(now):
    build_fleet(2, 0)
    fitting = [unplaced_namespace(f"fits-{i}", (10**6,)) for i in range(2)]
    failing = [unplaced_namespace(f"fails-{i}", (10**15,) * 4) for i in range(3)]
    result = RolloutService(record_decisions=True).execute(dry_run=True, batch_size=10)
    explanation = records.compact_explanation(result.plan, max_namespaces=3, max_decisions=2)
    assert [item["namespace_id"] for item in explanation] == [
        ns.root_namespace_id for ns in failing
    ]
    assert not {ns.root_namespace_id for ns in fitting} & {i["namespace_id"] for i in explanation}
    for item in explanation:
        assert len(item["decisions"]) == 2
        assert item["decisions_total"] == 4


class _Node:
    def __init__(self, node_id: int, claimed: int) -> None:
        self.id, self.claimed_storage_bytes = node_id, claimed


class _Namespace:
    def __init__(self, namespace_id: int) -> None:
        self.namespace_id = namespace_id


class _Plan:
    def __init__(self, nodes, create) -> None:
        self.nodes, self.create = nodes, create


@pytest.mark.parametrize(
    ("claimed", "largest", "expected"),
    [
        pytest.param(
            {1: 30, 2: 10},
            5,
            {"lower_bound": 0.2, "max_utilization": 0.3, "ratio": 1.5},
            id="total demand over total capacity binds",
        ),
        pytest.param(
            {1: 90},
            30,
            {"lower_bound": 0.45, "max_utilization": 0.9, "ratio": 2.0},
            id="demand binds over the largest project",
        ),
        pytest.param(
            {},
            0,
            {"lower_bound": 0.0, "max_utilization": 0.0, "ratio": 1.0},
            id="nothing claimed",
        ),
    ],
)
def test_disk_bounds_of_a_disk_only_plan(claimed, largest, expected):
    scenario = {
        "options": {"buffer_factor": 1},
        "nodes": [
            {"id": 1, "unclaimed_storage_bytes": 100},
            {"id": 2, "unclaimed_storage_bytes": 100},
        ],
        "namespaces": [{"namespace_id": 7, "projects": [{"repository_size": largest}]}],
    }
    plan = _Plan([_Node(i, c) for i, c in claimed.items()], [_Namespace(7)])
    assert records.disk_bounds(scenario, plan) == expected


def test_a_plan_with_the_memory_dimension_keeps_the_cores_bounds(now):
    row = app_settings.load_row()
    row.zoekt_node_memory_budget_bytes = 8 * GIB
    row.save()
    build_fleet(2, 0)
    unplaced_namespace("memory", (10**6,))
    result = RolloutService(record_decisions=True).execute(dry_run=True, batch_size=10)
    kept = RolloutPlan.objects.get().summary
    if result.plan.bounds is None:  # the loader does not pass memory options (yet)
        assert kept["bounds_source"] == "disk_estimate"
    else:
        assert kept["bounds_source"] == "plan"
        assert kept["bounds"] == result.plan.bounds
