"""Job and plan durations in /metrics: job runs timed into Redis, the last plan's phases."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from celery import shared_task

from config.celery import app as celery_app
from planner.models import RolloutPlan
from tests.dashboard.test_metrics import scrape
from zoekt import jobmetrics
from zoekt.scheduling.tasks import run_scheduled_task

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("prometheus_on_loopback")]


@shared_task(name="tests.job_that_fails")
def job_that_fails() -> None:
    raise RuntimeError("on purpose")


@pytest.fixture
def eager(monkeypatch):
    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)
    jobmetrics.reset()
    yield
    jobmetrics.reset()


def figures() -> dict[str, jobmetrics.JobFigures]:
    return {row.job: row for row in jobmetrics.read()}


def test_a_run_is_recorded_with_its_duration_and_end(now):
    jobmetrics.reset()
    jobmetrics.record("zoekt.rollout", 0.25)
    jobmetrics.record("zoekt.rollout", 0.75, failed=True)
    row = figures()["zoekt.rollout"]
    assert (row.runs, row.failures) == (2, 1)
    assert row.seconds == pytest.approx(1.0)
    assert row.last_seconds == pytest.approx(0.75)
    assert row.last_finished == pytest.approx(now.timestamp())


def test_scheduled_tasks_are_told_apart():
    assert jobmetrics.job_name("zoekt.run_scheduled_task", ["eviction"]) == (
        "zoekt.run_scheduled_task:eviction"
    )
    assert jobmetrics.job_name("zoekt.run_scheduled_task", [], {"name": "lost_nodes_check"}) == (
        "zoekt.run_scheduled_task:lost_nodes_check"
    )
    assert jobmetrics.job_name("zoekt.rollout", []) == "zoekt.rollout"


def test_celery_runs_are_timed_by_the_signals(now, eager):
    run_scheduled_task.delay("mark_indices_as_ready")
    run_scheduled_task.delay("mark_indices_as_ready")
    result = job_that_fails.delay()
    assert result.failed()
    got = figures()
    assert got["zoekt.run_scheduled_task:mark_indices_as_ready"].runs == 2
    assert got["zoekt.run_scheduled_task:mark_indices_as_ready"].failures == 0
    assert got["tests.job_that_fails"].runs == 1
    assert got["tests.job_that_fails"].failures == 1
    assert got["tests.job_that_fails"].last_seconds >= 0


def test_metrics_show_job_runs_failures_and_durations(client, now, eager):
    jobmetrics.record("zoekt.rollout", 1.5)
    jobmetrics.record("zoekt.rollout", 0.5, failed=True)
    metrics = scrape(client)
    job = (("job", "zoekt.rollout"),)
    assert metrics["zoekt_control_job_duration_seconds_count"][job] == 2
    assert metrics["zoekt_control_job_duration_seconds_sum"][job] == 2.0
    assert metrics["zoekt_control_job_failures_total"][job] == 1
    assert metrics["zoekt_control_job_last_duration_seconds"][job] == 0.5
    assert metrics["zoekt_control_job_last_finished_timestamp_seconds"][job] == now.timestamp()


def test_metrics_show_the_last_rollout_plan(client, now):
    RolloutPlan.objects.create(
        created_at=now - timedelta(minutes=20),
        summary={"seconds": {"plan": 9.0}, "bounds": {"disk": {"ratio": 9.0}}},
    )
    RolloutPlan.objects.create(
        created_at=now,
        dry_run=True,
        summary={"seconds": {"plan": 7.0}},
    )
    RolloutPlan.objects.create(
        created_at=now - timedelta(minutes=10),
        summary={
            "seconds": {"select": 0.01, "load": 0.2, "plan": 0.05},
            "bounds": {"disk": {"ratio": 1.25}, "memory": {"ratio": 1.5}},
        },
    )
    metrics = scrape(client)
    assert metrics["zoekt_control_rollout_plan_timestamp_seconds"][()] == (
        (now - timedelta(minutes=10)).timestamp()
    )
    assert metrics["zoekt_control_rollout_plan_phase_seconds"] == {
        (("phase", "load"),): 0.2,
        (("phase", "plan"),): 0.05,
        (("phase", "select"),): 0.01,
    }
    assert metrics["zoekt_control_rollout_plan_utilization_over_bound"] == {
        (("dimension", "disk"),): 1.25,
        (("dimension", "memory"),): 1.5,
    }


def test_no_plan_no_plan_metrics(client, now):
    metrics = scrape(client)
    assert "zoekt_control_rollout_plan_timestamp_seconds" not in metrics


def test_without_redis_the_fleet_is_still_served(client, now, monkeypatch):
    def unreachable():
        raise redis.ConnectionError("Redis is down")

    monkeypatch.setattr(jobmetrics, "_redis", unreachable)
    metrics = scrape(client)
    assert "zoekt_control_nodes" in metrics
    assert "zoekt_control_job_duration_seconds_count" not in metrics


def test_a_job_is_not_failed_by_its_metrics(now, monkeypatch):
    def unreachable():
        raise redis.ConnectionError("Redis is down")

    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)
    monkeypatch.setattr(jobmetrics, "_redis", unreachable)
    result = run_scheduled_task.delay("mark_indices_as_ready")
    assert result.successful()
