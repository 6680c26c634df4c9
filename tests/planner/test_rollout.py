"""The rollout run (RolloutService, reference 5.5) and its Celery job (RolloutWorker, 5.1)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
import structlog
from django.db import connection

from config.celery import BEAT_SCHEDULE
from planner import selection
from planner import tasks as planner_tasks
from planner.rollout import (
    MESSAGES,
    PLAN_LOG_KEY,
    Outcome,
    RolloutService,
    delete_replicas_without_indices,
)
from planner.tasks import rollout_task
from tests.factories import (
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ProjectFactory,
    ReplicaFactory,
)
from tests.locking import database_conninfo, session_lock_held_elsewhere
from zoekt import app_settings, clock
from zoekt.locks import LockKey
from zoekt.models import EnabledNamespace, Index, Node, ProjectStatistics, Replica

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


set_setting = app_settings.update


def node(unclaimed: int, **kwargs) -> Node:
    return NodeFactory(total_bytes=unclaimed, used_bytes=0, indexed_bytes=0, **kwargs)


def enabled_group(*sizes: int | None, **kwargs) -> EnabledNamespace:
    group = GroupFactory()
    namespace = EnabledNamespaceFactory(root_namespace=group, **kwargs)
    for size in sizes:
        ProjectFactory(namespace=group, repository_size=size)
    return namespace


def records(caplog, event: str) -> list[dict]:
    return [
        record.msg
        for record in caplog.records
        if isinstance(record.msg, dict) and record.msg.get("event") == event
    ]


def plan_records(caplog) -> list[dict]:
    return records(caplog, PLAN_LOG_KEY)


def replica_count(namespace: EnabledNamespace) -> int:
    return Replica.objects.filter(zoekt_enabled_namespace=namespace).count()


@pytest.fixture
def indexing(now):
    set_setting(zoekt_indexing_enabled=True)
    return now


# --- RolloutService ----------------------------------------------------------------------------


def test_a_dry_run_logs_the_whole_plan_and_writes_nothing(now, caplog):
    caplog.set_level(logging.INFO)
    node(10_000)
    namespace = enabled_group(10, 20)
    orphan = ReplicaFactory()  # no indices: a real run would delete it first

    result = RolloutService().execute(dry_run=True, batch_size=10)

    assert result.outcome == Outcome.DRY_RUN
    assert result.message == "Skipping execution of changes because of dry run"
    assert result.re_enqueue is False
    assert replica_count(namespace) == 0
    assert Replica.objects.filter(pk=orphan.pk).exists()
    (record,) = plan_records(caplog)
    assert record["dry_run"] is True
    assert record[PLAN_LOG_KEY] == result.plan.to_dict()
    assert record[PLAN_LOG_KEY]["create"][0]["namespace_id"] == namespace.root_namespace_id


def test_a_run_removes_index_less_replicas_then_plans_logs_and_applies(now, caplog):
    caplog.set_level(logging.INFO)
    node(10_000)
    namespace = enabled_group(10, 20)
    emptied = EnabledNamespaceFactory()
    ReplicaFactory(zoekt_enabled_namespace=emptied)  # its indices went with a lost node
    kept = ReplicaFactory()
    IndexFactory(zoekt_replica=kept)

    result = RolloutService().execute(dry_run=False, batch_size=10)

    assert result.replicas_without_indices_deleted == 1
    assert Replica.objects.filter(pk=kept.pk).exists()
    # The emptied namespace lost its replica, so it was planned again in the same run.
    assert replica_count(emptied) == 1 and replica_count(namespace) == 1
    assert result.outcome == Outcome.SUCCESS
    assert result.message == "Batch is completed with success"
    assert result.re_enqueue is False
    (record,) = plan_records(caplog)
    assert record["dry_run"] is False
    assert {ns["namespace_id"] for ns in record[PLAN_LOG_KEY]["create"]} == {
        namespace.root_namespace_id,
        emptied.root_namespace_id,
    }
    assert set(result.seconds) >= {"cleanup", "select", "load", "plan", "log", "apply"}


def test_the_plan_record_is_one_json_line(now, caplog):
    caplog.set_level(logging.INFO)
    node(10_000)
    enabled_group(10)
    RolloutService().execute(dry_run=True)
    (record,) = [r for r in caplog.records if isinstance(r.msg, dict) and PLAN_LOG_KEY in r.msg]
    formatter = structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(sort_keys=True),
        ]
    )
    line = formatter.format(record)
    assert "\n" not in line
    decoded = json.loads(line)
    assert decoded["event"] == PLAN_LOG_KEY
    assert set(decoded[PLAN_LOG_KEY]) == {
        "create",
        "destroy",
        "unchanged",
        "failures",
        "nodes",
        "total_required_storage_bytes",
    }


def test_no_namespaces_to_roll_out_stops_before_planning(now, caplog):
    caplog.set_level(logging.INFO)
    node(10_000)
    result = RolloutService().execute(dry_run=False)
    assert (result.outcome, result.message, result.re_enqueue) == (
        Outcome.NO_ENABLED_NAMESPACES,
        "No enabled namespaces found",
        False,
    )
    assert result.plan is None and plan_records(caplog) == []


def test_no_available_nodes_stops_before_planning(now, caplog):
    caplog.set_level(logging.INFO)
    namespace = enabled_group(10)
    node(10_000, services=[])
    result = RolloutService().execute(dry_run=False)
    assert (result.outcome, result.message, result.re_enqueue) == (
        Outcome.NO_AVAILABLE_NODES,
        "No available nodes found",
        False,
    )
    assert replica_count(namespace) == 0 and plan_records(caplog) == []


def test_success_re_enqueues_while_namespaces_remain_and_nodes_have_room(now):
    node(10_000)
    namespaces = [enabled_group(10) for _ in range(3)]
    result = RolloutService().execute(dry_run=False, batch_size=2)
    assert result.outcome == Outcome.SUCCESS and result.re_enqueue is True
    assert [replica_count(ns) for ns in namespaces] == [1, 1, 0]
    result = RolloutService().execute(dry_run=False, batch_size=2)
    assert result.re_enqueue is False
    assert [replica_count(ns) for ns in namespaces] == [1, 1, 1]


def test_success_does_not_re_enqueue_once_the_nodes_are_full(now):
    node(30)
    namespaces = [enabled_group(10) for _ in range(2)]  # 30 bytes each
    result = RolloutService().execute(dry_run=False, batch_size=1)
    assert result.outcome == Outcome.SUCCESS
    assert result.re_enqueue is False  # namespaces remain, but no node has room
    assert [replica_count(ns) for ns in namespaces] == [1, 0]


class ShrinkingAfterPlanning(RolloutService):
    """A rollout during which ``shrink`` nodes lose all but 100 bytes, between plan and apply."""

    shrink: tuple[Node, ...] = ()

    def _plan(self, result, batch_size, **kwargs):
        planned = super()._plan(result, batch_size, **kwargs)
        Node.objects.filter(pk__in=[n.pk for n in self.shrink]).update(usable_storage_bytes=100)
        return planned


def shrinking(*nodes: Node) -> RolloutService:
    service = ShrinkingAfterPlanning()
    service.shrink = nodes
    return service


def test_errors_only_is_a_failure_and_never_re_enqueues(now):
    target = node(10_000)
    namespace = enabled_group(100)
    enabled_group(10, last_rollout_failed_at=now)  # waits for the retry interval: not selected
    result = shrinking(target).execute(dry_run=False)
    assert (result.outcome, result.message, result.re_enqueue) == (
        Outcome.FAILURE,
        "Batch is completed with failure",
        False,
    )
    assert [e["type"] for e in result.changes.errors] == ["node_capacity_exceeded"]
    namespace.refresh_from_db()
    assert namespace.last_rollout_failed_at == now


def test_successes_and_errors_is_a_partial_success(now):
    roomy, shrunk = node(10_000), node(9_000)
    accepted = enabled_group(3_000)  # 9,000 bytes: the roomy node
    refused = enabled_group(2_000)  # 6,000 bytes: only the other node has room left
    result = shrinking(shrunk).execute(dry_run=False)
    assert (result.outcome, result.message) == (
        Outcome.PARTIAL_SUCCESS,
        "Batch is completed with partial success",
    )
    assert replica_count(accepted) == 1 and replica_count(refused) == 0
    assert Index.objects.get(zoekt_enabled_namespace=accepted).zoekt_node_id == roomy.id


def test_plan_failures_alone_finish_without_changes(now):
    node(100)
    namespace = enabled_group(1000)  # 3,000 bytes: fits nowhere
    result = RolloutService().execute(dry_run=False)
    assert (result.outcome, result.message) == (
        Outcome.NO_CHANGES,
        "Batch is completed without changes",
    )
    assert result.re_enqueue is False  # the failed namespace now waits for the retry interval
    namespace.refresh_from_db()
    assert namespace.last_rollout_failed_at == now
    assert result.changes.failed_namespace_ids == [namespace.root_namespace_id]


def test_a_namespace_over_gitlabs_project_limit_is_skipped_and_never_re_enqueued(now, monkeypatch):
    monkeypatch.setattr(selection, "MAX_PROJECTS_PER_NAMESPACE", 1)
    node(10_000)
    big = enabled_group(1, 1)  # two project namespaces, one over the limit
    small = enabled_group(1)
    result = RolloutService().execute(dry_run=False, batch_size=1)
    assert result.outcome == Outcome.SUCCESS
    assert result.re_enqueue is False  # the big one is skipped by the re-selection too
    assert (replica_count(big), replica_count(small)) == (0, 1)
    summary = result.summary()
    assert summary["namespaces_skipped"] == [
        {
            "namespace_id": big.root_namespace_id,
            "enabled_namespace_id": big.id,
            "reason": "too_many_project_namespaces",
            "project_namespaces": 2,
            "limit": 1,
        }
    ]
    big.refresh_from_db()
    assert big.last_rollout_failed_at is None  # skipped, not failed
    again = RolloutService().execute(dry_run=False)
    assert again.outcome == Outcome.NO_ENABLED_NAMESPACES
    assert replica_count(big) == 0


def test_a_namespace_whose_projects_all_lack_statistics_waits_and_the_others_roll_out(now):
    """GitLab MR 257616: with GitLab.com's batch size of 1, such a namespace enabled first
    was planned on every run (a replica with no index, deleted by the next run's clean-up
    and planned again) and the namespaces after it never got a replica."""
    set_setting(zoekt_rollout_batch_size=1)
    batch_size = app_settings.current().rollout_batch_size
    node(10**6)
    stats_less = enabled_group(None, None)  # two projects, neither with a statistics row
    others = [enabled_group(10) for _ in range(3)]

    results = [RolloutService().execute(dry_run=False, batch_size=batch_size) for _ in range(6)]

    # The three ordinary namespaces got their replica, one per run, in id order.
    assert [replica_count(ns) for ns in others] == [1, 1, 1]
    assert [ns.id for ns in others] == [
        r.pool.namespaces[0].enabled_namespace_id for r in results[:3]
    ]
    # The stats-less one was never planned, so nothing of it was written or deleted.
    planned = [
        ns_plan["enabled_namespace_id"]
        for r in results
        if r.plan is not None
        for part in ("create", "destroy", "unchanged", "failures")
        for ns_plan in r.plan.to_dict()[part]
    ]
    assert stats_less.id not in planned
    assert replica_count(stats_less) == 0
    assert sum(r.replicas_without_indices_deleted for r in results) == 0
    stats_less.refresh_from_db()
    assert stats_less.last_rollout_failed_at is None  # waiting, not failed
    # Each run names it as waiting, with its reason; it never makes the job re-enqueue.
    waiting = {
        "namespace_id": stats_less.root_namespace_id,
        "enabled_namespace_id": stats_less.id,
        "reason": "waiting_for_project_statistics",
        "project_namespaces": 2,
        "limit": None,
    }
    assert all(r.summary()["namespaces_skipped"] == [waiting] for r in results)
    assert [r.outcome for r in results] == [Outcome.SUCCESS] * 3 + [
        Outcome.NO_ENABLED_NAMESPACES
    ] * 3
    assert [r.re_enqueue for r in results] == [True, True, False] + [False] * 3


def test_a_namespace_waiting_for_statistics_is_planned_once_they_arrive(now):
    node(10**6)
    waiting = enabled_group(None, None)
    assert RolloutService().execute(dry_run=False).outcome == Outcome.NO_ENABLED_NAMESPACES
    project = waiting.root_namespace.projects.order_by("id").last()
    ProjectStatistics.objects.create(
        project=project, namespace_id=project.namespace_id, repository_size=10
    )

    result = RolloutService().execute(dry_run=False)

    assert result.outcome == Outcome.SUCCESS
    assert result.summary()["namespaces_skipped"] == []
    assert replica_count(waiting) == 1
    (index,) = Index.objects.filter(zoekt_enabled_namespace=waiting)
    assert index.reserved_storage_bytes >= 10  # sized from the statistics that arrived


def test_a_namespace_without_projects_is_not_waiting_and_gets_its_empty_index(now):
    node(10**6)
    empty = enabled_group()
    result = RolloutService().execute(dry_run=False)
    assert result.summary()["namespaces_skipped"] == []
    assert replica_count(empty) == 1
    assert Index.objects.filter(zoekt_enabled_namespace=empty).count() == 1


def test_a_replica_that_fails_alone_makes_a_partial_success(now):
    a, b = node(1000), node(900)
    namespace = enabled_group(100, number_of_replicas_override=2)
    result = shrinking(b).execute(dry_run=False)
    assert result.outcome == Outcome.PARTIAL_SUCCESS
    assert replica_count(namespace) == 1
    assert [(e["type"], e["node_id"]) for e in result.changes.errors] == [
        ("node_capacity_exceeded", b.id)
    ]
    namespace.refresh_from_db()
    assert namespace.last_rollout_failed_at is None
    assert Index.objects.get(zoekt_enabled_namespace=namespace).zoekt_node_id == a.id


@pytest.mark.django_db(transaction=True)
def test_a_namespace_whose_lookup_times_out_fails_alone_and_the_run_goes_on(now):
    """Another session holds one enabled namespace's row: its lock times out, the others land."""
    node(10_000)
    first, held, last = enabled_group(10), enabled_group(10), enabled_group(10)
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(database_conninfo()) as other:
            other.execute(
                "SELECT id FROM zoekt_enabled_namespaces WHERE id = %s FOR UPDATE", [held.id]
            )
            taken.set()
            release.wait(timeout=30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(timeout=30)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        result = RolloutService().execute(dry_run=False, batch_size=3)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
        release.set()
        holder.join(timeout=30)

    assert result.outcome == Outcome.PARTIAL_SUCCESS
    assert (replica_count(first), replica_count(held), replica_count(last)) == (1, 0, 1)
    (error,) = result.changes.errors
    assert error["type"] == "provisioning_failed"
    assert error["failed_namespace_id"] == held.root_namespace_id
    assert error["message"].startswith("OperationalError: canceling statement due to lock timeout")
    assert (error["node_id"], error["replica_idx"]) == (None, None)
    held.refresh_from_db()
    assert held.last_rollout_failed_at is None  # not read, so not stamped: the next run retries


def test_index_less_replicas_are_deleted_in_batches(now):
    for _ in range(5):
        ReplicaFactory()
    with_index = ReplicaFactory()
    IndexFactory(zoekt_replica=with_index)
    assert delete_replicas_without_indices(batch_size=2) == 5
    assert list(Replica.objects.values_list("id", flat=True)) == [with_index.id]


def test_every_outcome_has_a_message():
    assert set(MESSAGES) == set(Outcome)


def test_a_preview_plans_what_the_next_run_would_and_writes_nothing(now, caplog):
    caplog.set_level(logging.INFO)
    node(10_000)
    emptied = EnabledNamespaceFactory()
    orphan = ReplicaFactory(zoekt_enabled_namespace=emptied)
    result = RolloutService().preview(batch_size=10)
    assert result.replicas_without_indices_deleted == 1
    # Planned as if its index-less replica were gone, as the next run will see it.
    assert [ns.namespace_id for ns in result.plan.create] == [emptied.root_namespace_id]
    assert Replica.objects.filter(pk=orphan.pk).exists()
    assert plan_records(caplog) == []


# --- the Celery job ----------------------------------------------------------------------------


def test_the_job_is_named_and_scheduled_every_ten_minutes():
    assert rollout_task.name == "zoekt.rollout"
    assert BEAT_SCHEDULE["rollout"] == {
        "task": "zoekt.rollout",
        "schedule": 600.0,
        "options": {"expires": 600},
    }
    # One run at a time: the job's own advisory lock key, shared with no other job.
    assert [
        name for name, key in LockKey.__members__.items() if key.value == LockKey.ROLLOUT.value
    ] == ["ROLLOUT"]


def test_celery_autodiscovers_the_rollout_job():
    code = (
        "import django; django.setup(); from config.celery import app; "
        "app.loader.import_default_modules(); print('zoekt.rollout' in app.tasks)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip().splitlines()[-1] == "True", done.stderr[-2000:]


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        pytest.param({}, "indexing_disabled", id="indexing-disabled"),
        pytest.param(
            {"zoekt_indexing_enabled": True, "zoekt_indexing_paused": True},
            "indexing_paused",
            id="indexing-paused",
        ),
    ],
)
def test_the_job_does_nothing_unless_indexing_runs(now, caplog, settings, reason):
    caplog.set_level(logging.INFO)
    if settings:
        set_setting(**settings)
    node(10_000)
    namespace = enabled_group(10)
    assert rollout_task() == {"skipped": reason}
    assert replica_count(namespace) == 0
    (line,) = records(caplog, "rollout")
    assert line["skipped"] == reason
    assert plan_records(caplog) == []


def test_the_job_applies_logs_the_plan_and_one_summary_line(indexing, caplog):
    caplog.set_level(logging.INFO)
    node(10_000)
    namespace = enabled_group(10)
    summary = rollout_task()
    assert summary["outcome"] == "success"
    assert replica_count(namespace) == 1
    assert len(plan_records(caplog)) == 1
    (line,) = records(caplog, "rollout")
    assert line["message"] == "Batch is completed with success"
    assert line["changes"]["successes"][0]["namespace_id"] == namespace.root_namespace_id


def test_the_job_re_enqueues_itself_when_the_result_asks(indexing, monkeypatch):
    set_setting(zoekt_rollout_batch_size=1)
    node(10_000)
    enabled_group(10)
    enabled_group(10)
    calls = []
    monkeypatch.setattr(rollout_task, "apply_async", lambda **kw: calls.append(kw))
    assert rollout_task()["re_enqueue"] is True
    assert calls == [{"countdown": 0}]
    assert rollout_task()["re_enqueue"] is False
    assert len(calls) == 1


def test_a_run_finding_the_lock_held_by_another_connection_skips_and_logs(indexing, caplog):
    caplog.set_level(logging.INFO)
    node(10_000)
    namespace = enabled_group(10)
    with session_lock_held_elsewhere(LockKey.ROLLOUT):
        assert rollout_task() == {"skipped": "lock_held"}
    assert replica_count(namespace) == 0
    (line,) = records(caplog, "rollout")
    assert line["skipped"] == "lock_held"
    assert plan_records(caplog) == []
    # The other process has let go of the lock.
    assert rollout_task()["outcome"] == "success"


@pytest.mark.django_db(transaction=True)
def test_two_rollouts_started_at_once_run_one_and_skip_the_other(indexing, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    node(10_000)
    namespaces = [enabled_group(10) for _ in range(3)]
    inside, release = threading.Event(), threading.Event()
    outcome: dict = {}

    class Held(RolloutService):
        def execute(self, *args, **kwargs):
            inside.set()  # holding the lock now
            assert release.wait(30)
            return super().execute(*args, **kwargs)

    monkeypatch.setattr(planner_tasks, "RolloutService", Held)

    def first() -> None:
        try:
            with clock.frozen(indexing):  # the frozen clock is per thread
                outcome["first"] = rollout_task()
        finally:
            from django.db import connection as thread_connection

            thread_connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(30)
        outcome["second"] = rollout_task()
    finally:
        release.set()
        thread.join(60)

    assert outcome["second"] == {"skipped": "lock_held"}
    assert outcome["first"]["outcome"] == "success"
    assert [replica_count(ns) for ns in namespaces] == [1, 1, 1]
    lines = records(caplog, "rollout")
    assert sorted("skipped" in line for line in lines) == [False, True]
    assert Index.objects.count() == 3
