"""The scheduling jobs: the fan-out, the gating, the throttle (6.2), the locks and the log line."""

from __future__ import annotations

import json
import logging

import pytest
from django.core.cache import cache

from config.celery import BEAT_SCHEDULE
from tests.factories import IndexFactory, RepositoryFactory
from tests.locking import advisory_lock_held_elsewhere
from tests.scheduling.conftest import set_setting
from zoekt.locks import LockKey
from zoekt.models import Index, Repository
from zoekt.reasons import Reason
from zoekt.scheduling import events, tasks
from zoekt.scheduling.service import PERIODS, TASKS, SchedulingService, throttle_key

pytestmark = pytest.mark.django_db

GITLAB_TASKS = {
    "auto_index_self_managed",
    "eviction",
    "initial_indexing",
    "node_with_negative_unclaimed_storage_bytes_check",
    "update_index_used_bytes",
    "force_update_overprovisioned_index",
    "indices_to_evict_check",
    "index_mismatched_watermark_check",
    "index_should_be_marked_as_orphaned_check",
    "index_should_be_marked_as_pending_eviction_check",
    "index_to_delete_check",
    "lost_nodes_check",
    "mark_indices_as_ready",
    "repo_should_be_marked_as_orphaned_check",
    "repo_to_index_check",
    "repo_to_reindex_check",
    "repo_to_delete_check",
    "update_index_used_storage_bytes",
    "update_replica_states",
}


def test_every_scheduled_task_of_gitlab_but_the_saas_subscription_ones_is_here():
    assert set(TASKS) == GITLAB_TASKS
    assert "remove_expired_subscriptions" not in TASKS
    assert "saas_rollout" not in TASKS
    assert set(tasks.SCHEDULING_LOCKS) == set(TASKS)


def test_the_periods_are_gitlabs():
    assert PERIODS == {
        "eviction": 300,
        "node_with_negative_unclaimed_storage_bytes_check": 3600,
        "index_mismatched_watermark_check": 600,
        "lost_nodes_check": 600,
        "repo_should_be_marked_as_orphaned_check": 600,
    }


def test_every_task_has_its_own_lock_and_no_lock_is_shared_with_an_event():
    keys = list(tasks.SCHEDULING_LOCKS.values())
    assert len(set(keys)) == len(keys)
    assert tasks.SCHEDULING_LOCKS["update_replica_states"] == LockKey.UPDATE_REPLICA_STATES


def test_beat_runs_the_scheduling_fan_out_every_minute_expiring_after_a_minute():
    assert BEAT_SCHEDULE["scheduling"] == {
        "task": "zoekt.scheduling",
        "schedule": 60.0,
        "options": {"expires": 60},
    }


def test_every_event_job_has_an_explicit_zoekt_name():
    for event, task in events.EVENTS.items():
        assert task.name == f"zoekt.{event}"


# --- the fan-out and its gating ----------------------------------------------------------------


@pytest.fixture
def enqueued(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(
        tasks.run_scheduled_task,
        "apply_async",
        lambda args, **options: calls.append((args, options)),
    )
    return calls


def test_the_fan_out_enqueues_one_job_per_task_each_expiring_after_the_tick(
    indexing_enabled, enqueued
):
    result = tasks.scheduling_task()

    assert result == {"enqueued": len(TASKS)}
    assert [args for args, _ in enqueued] == [(name,) for name in TASKS]
    assert {options["expires"] for _, options in enqueued} == {60}


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        pytest.param({"zoekt_indexing_enabled": False}, Reason.INDEXING_DISABLED, id="disabled"),
        pytest.param(
            {"zoekt_indexing_enabled": True, "zoekt_indexing_paused": True},
            Reason.INDEXING_PAUSED,
            id="paused",
        ),
    ],
)
def test_scheduling_does_nothing_unless_indexing_is_enabled_and_not_paused(
    enqueued, values, reason
):
    set_setting(**values)
    RepositoryFactory(state=Repository.State.PENDING)

    assert tasks.scheduling_task() == {"skipped": reason}
    assert enqueued == []
    assert tasks.run_scheduled_task("repo_to_index_check") == {
        "task": "repo_to_index_check",
        "skipped": reason,
    }


def test_a_scheduled_job_skips_while_another_run_holds_its_lock(indexing_enabled):
    IndexFactory(state=Index.State.INITIALIZING)
    with advisory_lock_held_elsewhere(LockKey.SCHEDULING_MARK_INDICES_AS_READY):
        result = tasks.run_scheduled_task("mark_indices_as_ready")
    assert result == {"task": "mark_indices_as_ready", "skipped": Reason.LOCK_HELD}


def test_an_unknown_task_name_is_an_error(indexing_enabled):
    with pytest.raises(KeyError):
        tasks.run_scheduled_task("dot_com_rollout")
    with pytest.raises(ValueError, match="unknown scheduled task"):
        SchedulingService().execute("dot_com_rollout")


def test_each_run_logs_one_structured_line_with_what_it_found_and_did(
    indexing_enabled, django_capture_on_commit_callbacks, caplog
):
    RepositoryFactory(state=Repository.State.PENDING)
    caplog.set_level(logging.INFO)
    with django_capture_on_commit_callbacks() as callbacks:
        tasks.run_scheduled_task("repo_to_index_check")

    lines = [r for r in caplog.records if r.name == "zoekt.scheduling.tasks"]
    assert len(lines) == 1
    record = lines[0].msg
    assert record["event"] == "scheduled_task"
    assert record["task"] == "repo_to_index_check"
    assert record["dispatched"] == ["index_repos"]
    assert len(callbacks) == 1  # the event, enqueued after commit
    json.dumps(record, default=str)


# --- events: after commit, paused, locks ---------------------------------------------------------


def test_a_dispatched_event_is_enqueued_only_after_the_transaction_commits(
    indexing_enabled, django_capture_on_commit_callbacks, monkeypatch
):
    sent = []
    monkeypatch.setattr(events.index_repos_task, "delay", lambda *a: sent.append(a))
    RepositoryFactory(state=Repository.State.PENDING)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        tasks.run_scheduled_task("repo_to_index_check")
        assert sent == []
    for callback in callbacks:
        callback()
    assert sent == [()]


def test_event_jobs_do_nothing_while_indexing_is_paused(now):
    set_setting(zoekt_indexing_paused=True)
    RepositoryFactory(state=Repository.State.PENDING)

    result = events.index_repos_task()

    assert result["skipped"] == Reason.INDEXING_PAUSED
    assert Repository.objects.get().state == Repository.State.PENDING


def test_an_event_job_skips_while_another_run_holds_its_lock(now):
    RepositoryFactory(state=Repository.State.PENDING)
    with advisory_lock_held_elsewhere(LockKey.EVENT_INDEX_REPOS):
        result = events.index_repos_task()
    assert result["skipped"] == Reason.LOCK_HELD
    assert Repository.objects.get().state == Repository.State.PENDING


def test_a_storage_refresh_event_skips_while_another_run_holds_its_session_lock(now):
    IndexFactory()
    with advisory_lock_held_elsewhere(LockKey.EVENT_UPDATE_INDEX_USED_STORAGE_BYTES):
        result = events.update_index_used_storage_bytes_task()
    assert result["skipped"] == Reason.LOCK_HELD
    assert Index.objects.get().used_storage_bytes == 0


def test_an_event_with_work_left_enqueues_itself_again_after_commit(
    now, monkeypatch, django_capture_on_commit_callbacks
):
    again = []
    monkeypatch.setattr(events.orphan_repos_task, "delay", lambda *a: again.append(a))
    monkeypatch.setattr("zoekt.scheduling.handlers.ORPHANED_REPO_BATCH_SIZE", 2)
    for _ in range(3):
        RepositoryFactory(project=None, project_identifier=10**9 + _)

    with django_capture_on_commit_callbacks(execute=True):
        first = events.orphan_repos_task()
    assert first["repositories_marked_orphaned"] == 2
    assert first["re_emit"] is True
    assert again == [()]


# --- the throttle (reference 6.2) ----------------------------------------------------------------


def test_a_second_run_within_the_period_does_nothing(service, dispatched):
    RepositoryFactory(project=None, project_identifier=42)

    first = service().execute("repo_should_be_marked_as_orphaned_check")
    second = service().execute("repo_should_be_marked_as_orphaned_check")

    assert first["dispatched"] == ["orphan_repos"]
    assert second == {
        "task": "repo_should_be_marked_as_orphaned_check",
        "skipped": Reason.THROTTLED,
        "period_seconds": 600,
    }
    assert dispatched.names == ["orphan_repos"]


def test_a_false_condition_still_uses_up_the_period(service, dispatched):
    first = service().execute("repo_should_be_marked_as_orphaned_check")
    RepositoryFactory(project=None, project_identifier=42)  # now the condition holds
    second = service().execute("repo_should_be_marked_as_orphaned_check")

    assert first["skipped"] == Reason.CONDITION_NOT_MET
    assert second["skipped"] == Reason.THROTTLED
    assert dispatched == []


def test_the_period_is_a_redis_key_that_expires_after_the_period(service):
    service().execute("lost_nodes_check")

    key = throttle_key("lost_nodes_check", 600)
    assert cache.get(key) is not None
    redis = cache._cache.get_client(key)  # Django's RedisCache has no ttl()
    assert 590 < redis.ttl(cache.make_key(key)) <= 600
    cache.delete(key)  # as if the period had passed
    assert service().execute("lost_nodes_check")["skipped"] != Reason.THROTTLED


@pytest.mark.parametrize("task", sorted(PERIODS))
def test_each_throttled_task_runs_once_per_period_unless_bypassed(service, task):
    set_setting(zoekt_node_level_eviction_enabled=True)
    first = service().execute(task)
    second = service().execute(task)
    bypassed = service(bypass_throttle=True).execute(task)

    assert first.get("skipped") != Reason.THROTTLED
    assert second["skipped"] == Reason.THROTTLED
    assert bypassed.get("skipped") != Reason.THROTTLED


@pytest.mark.parametrize("task", sorted(set(TASKS) - set(PERIODS)))
def test_a_task_without_a_period_runs_on_every_tick(service, task):
    set_setting(zoekt_auto_index_root_namespace=True)
    for _ in range(2):
        assert service().execute(task).get("skipped") != Reason.THROTTLED
