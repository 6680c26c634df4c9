"""Callbacks: a node reports the result of a task (reference 3.3, 7.4, 7.5).

``POST /api/v4/internal/search/zoekt/<uuid>/callback`` answers 422 for an
unknown node and 202 otherwise, even for a task the node does not own. A
success marks the repository indexed (or destroys it, for a delete) and the
task done; a failure reschedules the task with an exponential backoff until
its retries run out, then fails it and spends one of the repository's
retries. Every report is safe to repeat.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from tests.api.helpers import ERROR_KEYS, db_snapshot, make_repository, make_task
from tests.factories import IndexFactory, NodeFactory
from zoekt import actions, clock
from zoekt.models import Index, Repository, Task
from zoekt.tasks import handle_task_failed_task

pytestmark = pytest.mark.django_db

NODE_SCHEMA_VERSION = 2531


@pytest.fixture
def node(now):
    return NodeFactory(
        schema_version=NODE_SCHEMA_VERSION, metadata={"name": "zoekt-0", "concurrency": 4}
    )


@pytest.fixture
def repository(index) -> Repository:
    return make_repository(index, state=Repository.State.INITIALIZING, retries_left=3)


@pytest.fixture
def index_task(repository) -> Task:
    """An index task the node was handed and is working on."""
    return make_task(repository, state=Task.State.PROCESSING)


@pytest.fixture
def delete_task(index) -> Task:
    repository = make_repository(index, state=Repository.State.DELETED, retries_left=3)
    return make_task(repository, task_type=Task.TaskType.DELETE_REPO, state=Task.State.PROCESSING)


def success(task: Task, *, size: int = 123_456, files: int = 7) -> dict:
    if task.task_type == Task.TaskType.DELETE_REPO:
        return {
            "name": "delete",
            "success": True,
            "payload": {"task_id": task.id, "service_type": "zoekt"},
        }
    return {
        "name": "index",
        "success": True,
        "payload": {"task_id": task.id, "schema_version": 1},
        "additional_payload": {"repo_stats": {"size_in_bytes": size, "index_file_count": files}},
    }


def failure(task: Task) -> dict:
    name = "delete" if task.task_type == Task.TaskType.DELETE_REPO else "index"
    return {
        "name": name,
        "success": False,
        "error": "gitaly: repository not found",
        "payload": {"task_id": task.id},
    }


def report(node_api, node, body: dict, *, action: str | None = None, **kwargs) -> dict:
    response = node_api.callback(node.uuid, body, **kwargs)
    assert response.status_code == 202, response.content
    reply = response.json()
    assert set(reply) == {"message", "action"}
    assert reply["message"] == "accepted"
    if action is not None:
        assert reply["action"] == action
    return reply


def fresh(instance):
    instance.refresh_from_db()
    return instance


# --- who may report ---------------------------------------------------------------------------


def test_a_callback_from_an_unknown_node_is_refused_and_writes_nothing(node_api, index_task):
    before = db_snapshot()

    response = node_api.callback("5d0a0f6c-1b9e-4c55-8f0e-3c1d2b7a9e10", success(index_task))

    assert response.status_code == 422
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert body["errors"] == {"uuid": ["No node has this uuid."]}
    assert db_snapshot() == before


def test_a_report_on_another_nodes_task_is_accepted_and_ignored(node_api, node, now):
    others = make_task(
        make_repository(IndexFactory(zoekt_node=NodeFactory())), state=Task.State.PROCESSING
    )
    before = db_snapshot()

    report(node_api, node, success(others), action="ignored_unknown_task")
    report(node_api, node, failure(others), action="ignored_unknown_task")

    assert db_snapshot() == before


def test_a_report_on_a_task_that_does_not_exist_is_accepted_and_ignored(node_api, node):
    before = db_snapshot()

    body = {"name": "index", "success": True, "payload": {"task_id": 999_999}}
    report(node_api, node, body, action="ignored_unknown_task")

    assert db_snapshot() == before


# --- the payload is free JSON, as in GitLab ---------------------------------------------------


def callback_logs(caplog) -> list[dict]:
    return [
        record.msg
        for record in caplog.records
        if isinstance(record.msg, dict) and record.msg.get("event") == "callback"
    ]


@pytest.mark.parametrize("form", [False, True], ids=["json", "form"])
@pytest.mark.parametrize("success_", [True, False], ids=["success", "failure"])
def test_a_payload_without_a_task_id_is_accepted_ignored_and_logged(
    node_api, node, index_task, caplog, form, success_
):
    caplog.set_level(logging.INFO)
    before = db_snapshot()
    body = {"name": "index", "success": success_, "payload": {"key": "value"}}

    report(node_api, node, body, form=form, action="ignored_unknown_task")

    assert db_snapshot() == before
    (logged,) = callback_logs(caplog)
    assert logged["payload"] == {"key": "value"}
    assert logged["task_id"] is None
    assert logged["level"] == ("info" if success_ else "error")


def test_a_payload_with_keys_of_its_own_is_applied_and_logged_whole(
    node_api, node, repository, index_task, caplog
):
    caplog.set_level(logging.INFO)
    payload = {"task_id": index_task.id, "schema_version": 1, "trace": {"span": "a1"}}
    body = {**success(index_task), "payload": payload}

    report(node_api, node, body, action="done")

    assert fresh(index_task).state == Task.State.DONE
    assert fresh(repository).state == Repository.State.READY
    (logged,) = callback_logs(caplog)
    assert logged["payload"] == payload
    assert logged["task_id"] == index_task.id


@pytest.mark.parametrize("form", [False, True], ids=["json", "form"])
def test_the_callback_line_carries_the_additional_payload_as_gitlabs_does(
    node_api, node, repository, index_task, caplog, form
):
    caplog.set_level(logging.INFO)

    report(node_api, node, success(index_task, size=123_456, files=7), form=form, action="done")

    (logged,) = callback_logs(caplog)
    assert logged["additional_payload"] == {
        "repo_stats": {"size_in_bytes": 123_456, "index_file_count": 7}
    }
    assert logged["level"] == "info"


def test_a_callback_without_an_additional_payload_logs_it_as_null(
    node_api, node, repository, index_task, caplog
):
    caplog.set_level(logging.INFO)

    report(node_api, node, failure(index_task), action="retry_scheduled")

    (logged,) = callback_logs(caplog)
    assert "additional_payload" in logged
    assert logged["additional_payload"] is None
    assert logged["level"] == "error"


def test_a_callback_from_an_unknown_node_logs_its_payload(node_api, index_task, caplog):
    caplog.set_level(logging.INFO)
    body = {"name": "index", "success": True, "payload": {"key": "value"}}

    response = node_api.callback("5d0a0f6c-1b9e-4c55-8f0e-3c1d2b7a9e10", body)

    assert response.status_code == 422
    logged = [
        r.msg
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg.get("event") == "callback_unknown_node"
    ]
    assert [r["payload"] for r in logged] == [{"key": "value"}]
    assert [r["additional_payload"] for r in logged] == [None]


# --- success ------------------------------------------------------------------------------------


def test_an_index_success_makes_the_repository_ready_with_the_reported_stats(
    node_api, node, repository, index_task, now
):
    report(node_api, node, success(index_task, size=123_456, files=7), action="done")

    repository = fresh(repository)
    assert repository.state == Repository.State.READY
    assert repository.indexed_at == now
    assert repository.size_bytes == 123_456
    assert repository.index_file_count == 7
    assert repository.retries_left == Repository.DB_DEFAULT_RETRIES_LEFT == 10
    # The node's schema version, not the one echoed in the payload.
    assert repository.schema_version == NODE_SCHEMA_VERSION
    assert fresh(index_task).state == Task.State.DONE


def test_an_index_success_sent_form_encoded_is_applied(node_api, node, repository, index_task):
    report(node_api, node, success(index_task, size=99), form=True, action="done")

    assert fresh(repository).size_bytes == 99
    assert fresh(index_task).state == Task.State.DONE


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(Repository.State.PENDING, Repository.State.READY, id="pending-becomes-ready"),
        pytest.param(Repository.State.READY, Repository.State.READY, id="ready-stays-ready"),
        pytest.param(
            Repository.State.ORPHANED, Repository.State.ORPHANED, id="orphaned-is-left-alone"
        ),
    ],
)
def test_an_index_success_changes_only_pending_or_initializing_states(
    node_api, node, repository, index_task, before, after
):
    Repository.objects.filter(pk=repository.pk).update(state=before)

    report(node_api, node, success(index_task))

    assert fresh(repository).state == after


def test_an_index_success_without_repo_stats_keeps_the_stored_size(
    node_api, node, repository, index_task
):
    Repository.objects.filter(pk=repository.pk).update(size_bytes=55, index_file_count=3)
    body = success(index_task)
    del body["additional_payload"]

    report(node_api, node, body, action="done")

    repository = fresh(repository)
    assert (repository.size_bytes, repository.index_file_count) == (55, 3)
    assert repository.state == Repository.State.READY


@pytest.mark.parametrize(
    ("seconds_ago", "advanced"),
    [
        pytest.param(30, False, id="30-s-ago-not-advanced"),
        pytest.param(31, True, id="31-s-ago-advanced"),
    ],
)
def test_the_index_is_marked_indexed_only_when_more_than_30_s_passed(
    node_api, node, index, index_task, now, seconds_ago, advanced
):
    previous = now - timedelta(seconds=seconds_ago)
    Index.objects.filter(pk=index.pk).update(last_indexed_at=previous)

    report(node_api, node, success(index_task))

    assert fresh(index).last_indexed_at == (now if advanced else previous)


def test_a_repeated_index_success_changes_nothing_the_second_time(node_api, node, index_task):
    report(node_api, node, success(index_task, size=100), action="done")
    clock.advance(60)
    before = db_snapshot()

    report(node_api, node, success(index_task, size=200), action="ignored_already_done")

    assert db_snapshot() == before


def test_a_delete_success_destroys_the_repository(node_api, node, delete_task):
    report(node_api, node, success(delete_task), action="done")

    assert not Repository.objects.filter(pk=delete_task.zoekt_repository_id).exists()
    assert fresh(delete_task).state == Task.State.DONE


def test_a_repeated_delete_success_changes_nothing_the_second_time(node_api, node, delete_task):
    report(node_api, node, success(delete_task))
    clock.advance(60)
    before = db_snapshot()

    report(node_api, node, success(delete_task), action="ignored_already_done")

    assert db_snapshot() == before


def test_a_success_after_a_failure_report_still_completes_the_task(
    node_api, node, repository, index_task
):
    report(node_api, node, failure(index_task), action="retry_scheduled")

    report(node_api, node, success(index_task), action="done")

    assert fresh(index_task).state == Task.State.DONE
    assert fresh(repository).state == Repository.State.READY


# --- failure and retries --------------------------------------------------------------------


def seconds_until(task: Task, now) -> float:
    return (fresh(task).perform_at - now).total_seconds()


def test_a_first_failure_reschedules_the_task_in_5_to_7_5_minutes(node_api, node, index_task, now):
    report(node_api, node, failure(index_task), action="retry_scheduled")

    task = fresh(index_task)
    assert task.retries_left == 2
    assert task.state == Task.State.PROCESSING
    assert 300 <= seconds_until(task, now) <= 450


def test_a_second_failure_reschedules_the_task_in_10_to_15_minutes(node_api, node, index_task, now):
    report(node_api, node, failure(index_task))
    second_at = clock.advance(450)

    report(node_api, node, failure(index_task), action="retry_scheduled")

    task = fresh(index_task)
    assert task.retries_left == 1
    assert 600 <= seconds_until(task, second_at) <= 900


@pytest.mark.parametrize(
    ("retries_left", "jitter", "delay"),
    [
        pytest.param(3, 0.0, 300, id="first-failure-no-jitter"),
        pytest.param(3, 0.5, 375, id="first-failure-half-jitter"),
        pytest.param(3, 1.0, 450, id="first-failure-full-jitter"),
        pytest.param(2, 0.0, 600, id="second-failure-no-jitter"),
        pytest.param(2, 1.0, 900, id="second-failure-full-jitter"),
    ],
)
def test_the_retry_delay_is_5_minutes_doubled_per_attempt_plus_up_to_half_as_jitter(
    node_api, node, index_task, now, monkeypatch, retries_left, jitter, delay
):
    monkeypatch.setattr(actions.random, "random", lambda: jitter)
    Task.objects.filter(pk=index_task.pk).update(retries_left=retries_left)

    report(node_api, node, failure(index_task), action="retry_scheduled")

    assert seconds_until(index_task, now) == delay


def test_a_repeated_failure_report_changes_nothing_the_second_time(node_api, node, index_task):
    report(node_api, node, failure(index_task), action="retry_scheduled")
    before = db_snapshot()

    report(node_api, node, failure(index_task), action="ignored_already_rescheduled")

    assert db_snapshot() == before


def test_a_failure_report_on_a_finished_task_changes_nothing(node_api, node, index_task):
    report(node_api, node, success(index_task))
    before = db_snapshot()

    report(node_api, node, failure(index_task), action="ignored_not_processing")

    assert db_snapshot() == before


@pytest.mark.parametrize(
    "state",
    [Task.State.DONE, Task.State.SKIPPED, Task.State.ORPHANED],
    ids=["done", "skipped", "orphaned"],
)
def test_a_failure_report_on_a_task_no_longer_live_changes_nothing(
    node_api, node, index_task, state
):
    Task.objects.filter(pk=index_task.pk).update(state=state)
    before = db_snapshot()

    report(node_api, node, failure(index_task), action="ignored_not_processing")

    assert db_snapshot() == before


# --- a failure on a task that is still pending (GitLab: every task but a failed one) -------


@pytest.fixture
def pending_task(repository) -> Task:
    """An index task that is due and still pending (GitLab retries it on a failure too)."""
    return make_task(repository, state=Task.State.PENDING)


def test_a_failure_on_a_pending_task_spends_a_retry_with_backoff(node_api, node, pending_task, now):
    report(node_api, node, failure(pending_task), action="retry_scheduled")

    task = fresh(pending_task)
    assert task.retries_left == 2
    assert task.state == Task.State.PENDING
    assert 300 <= seconds_until(task, now) <= 450


def test_a_pending_task_is_not_handed_out_before_its_retry_is_due(
    node_api, node, pending_task, now
):
    report(node_api, node, failure(pending_task), action="retry_scheduled")

    assert node_api.heartbeat(node.uuid).json()["tasks"] == []
    clock.advance(450)
    (task,) = node_api.heartbeat(node.uuid).json()["tasks"]
    assert task["payload"]["Callback"]["payload"]["task_id"] == pending_task.id


def test_a_repeated_failure_on_a_pending_task_spends_one_retry(node_api, node, pending_task):
    report(node_api, node, failure(pending_task), action="retry_scheduled")
    before = db_snapshot()

    report(node_api, node, failure(pending_task), action="ignored_already_rescheduled")

    assert db_snapshot() == before
    assert fresh(pending_task).retries_left == 2


def test_the_final_failure_of_a_pending_task_fails_it_and_queues_the_repository_handling(
    node_api, node, pending_task, django_capture_on_commit_callbacks
):
    Task.objects.filter(pk=pending_task.pk).update(retries_left=1)

    with django_capture_on_commit_callbacks() as callbacks:
        report(node_api, node, failure(pending_task), action="failed")

    task = fresh(pending_task)
    assert (task.state, task.retries_left) == (Task.State.FAILED, 0)
    assert [c.args for c in callbacks] == [(handle_task_failed_task.name, (pending_task.id,))]


def test_a_failure_on_a_pending_task_scheduled_for_later_changes_nothing(
    node_api, node, repository, now
):
    """Not offered since it was scheduled, so the report cannot be about a run of it."""
    task = make_task(repository, state=Task.State.PENDING, perform_at=now + timedelta(minutes=5))
    before = db_snapshot()

    report(node_api, node, failure(task), action="ignored_already_rescheduled")

    assert db_snapshot() == before


def test_the_final_failure_fails_the_task_and_queues_the_repository_handling(
    node_api, node, index_task, django_capture_on_commit_callbacks
):
    Task.objects.filter(pk=index_task.pk).update(retries_left=1)

    with django_capture_on_commit_callbacks() as callbacks:
        report(node_api, node, failure(index_task), action="failed")

    task = fresh(index_task)
    assert (task.state, task.retries_left) == (Task.State.FAILED, 0)
    assert len(callbacks) == 1
    # Sent after commit, by name, with the task id.
    assert callbacks[0].args == (handle_task_failed_task.name, (index_task.id,))


def test_three_failures_in_a_row_fail_the_task(
    node_api, node, index_task, django_capture_on_commit_callbacks
):
    report(node_api, node, failure(index_task), action="retry_scheduled")
    clock.advance(450)
    report(node_api, node, failure(index_task), action="retry_scheduled")
    clock.advance(900)

    with django_capture_on_commit_callbacks() as callbacks:
        report(node_api, node, failure(index_task), action="failed")

    assert fresh(index_task).state == Task.State.FAILED
    assert len(callbacks) == 1


def test_a_repeated_final_failure_changes_nothing_and_queues_nothing(
    node_api, node, index_task, django_capture_on_commit_callbacks
):
    Task.objects.filter(pk=index_task.pk).update(retries_left=1)
    report(node_api, node, failure(index_task))
    before = db_snapshot()

    with django_capture_on_commit_callbacks() as callbacks:
        report(node_api, node, failure(index_task), action="ignored_already_failed")

    assert callbacks == []
    assert db_snapshot() == before


# --- the repository-level handling of a failed task ------------------------------------------


def fail_for_good(node_api, node, task: Task) -> None:
    Task.objects.filter(pk=task.pk).update(retries_left=1)
    report(node_api, node, failure(task), action="failed")


@pytest.mark.parametrize(
    ("task_fixture", "retry_state"),
    [
        pytest.param("index_task", Repository.State.PENDING, id="index-task-back-to-pending"),
        pytest.param(
            "delete_task", Repository.State.PENDING_DELETION, id="delete-task-back-to-deletion"
        ),
    ],
)
def test_a_failed_task_spends_one_repository_retry_and_requeues_the_repository(
    node_api, node, request, task_fixture, retry_state
):
    task = request.getfixturevalue(task_fixture)
    fail_for_good(node_api, node, task)

    result = handle_task_failed_task(task.id)

    repository = Repository.objects.get(pk=task.zoekt_repository_id)
    assert (repository.state, repository.retries_left) == (retry_state, 2)
    assert result["handled"] is True


def test_a_failed_task_fails_a_repository_with_its_last_retry(
    node_api, node, repository, index_task
):
    Repository.objects.filter(pk=repository.pk).update(retries_left=1)
    fail_for_good(node_api, node, index_task)

    handle_task_failed_task(index_task.id)

    repository = fresh(repository)
    assert (repository.state, repository.retries_left) == (Repository.State.FAILED, 0)


def test_handling_the_same_failed_task_twice_spends_only_one_retry(
    node_api, node, repository, index_task
):
    fail_for_good(node_api, node, index_task)
    handle_task_failed_task(index_task.id)
    before = db_snapshot()

    second = actions.do_handle_task_failed(index_task.id)

    assert second["handled"] is False
    assert db_snapshot() == before
    assert fresh(repository).retries_left == 2


def test_the_handler_ignores_a_task_that_has_not_failed(node_api, node, repository, index_task):
    before = db_snapshot()

    result = actions.do_handle_task_failed(index_task.id)

    assert result["handled"] is False
    assert db_snapshot() == before


# --- no failure handling is lost or doubled -------------------------------------------------


def test_the_database_refuses_a_second_handling_of_one_failed_task(node_api, node, index_task):
    from zoekt.models import HandledTaskFailure

    fail_for_good(node_api, node, index_task)
    before = Repository.objects.get(pk=index_task.zoekt_repository_id).retries_left
    assert actions.do_handle_task_failed(index_task.id)["handled"] is True
    # The mark lives in the database, not in Redis: a cache flush forgets nothing.
    from django.core.cache import cache

    cache.clear()
    assert actions.do_handle_task_failed(index_task.id)["reason"] == "already_handled"
    assert Repository.objects.get(pk=index_task.zoekt_repository_id).retries_left == before - 1
    assert HandledTaskFailure.objects.filter(task_id=index_task.id).count() == 1


def test_a_failed_task_whose_message_was_lost_is_handled_by_the_sweeper(
    node_api, node, index_task, django_capture_on_commit_callbacks
):
    Task.objects.filter(pk=index_task.pk).update(retries_left=1)
    with django_capture_on_commit_callbacks():  # the message is never sent
        report(node_api, node, failure(index_task), action="failed")
    before = Repository.objects.get(pk=index_task.zoekt_repository_id).retries_left

    assert actions.do_sweep_failed_tasks()["swept"] == 0  # not before five minutes
    clock.advance(actions.TASK_FAILED_SWEEP_AFTER_SECONDS + 1)
    assert actions.do_sweep_failed_tasks()["swept"] == 1
    assert actions.do_sweep_failed_tasks()["swept"] == 0  # safe to run twice
    assert Repository.objects.get(pk=index_task.zoekt_repository_id).retries_left == before - 1
    # The late message, if it ever arrives, changes nothing.
    assert actions.do_handle_task_failed(index_task.id)["reason"] == "already_handled"


def test_with_the_broker_down_a_final_failure_is_acknowledged_and_swept_later(
    node_api, node, index_task, django_capture_on_commit_callbacks, caplog
):
    from config.celery import app

    Task.objects.filter(pk=index_task.pk).update(retries_left=1)
    saved = app.conf.broker_url

    def rebuild_pools():  # the connection and producer pools, built again from the URL
        app._pool = None
        app.amqp._producer_pool = None

    app.conf.broker_url = "redis://127.0.0.1:9/0"  # nothing listens there
    rebuild_pools()
    try:
        # The after-commit send runs, fails, and is logged: the node gets its 202.
        with django_capture_on_commit_callbacks(execute=True) as sent:
            report(node_api, node, failure(index_task), action="failed")
        assert len(sent) == 1
        assert any("enqueue_failed" in record.getMessage() for record in caplog.records)
    finally:
        app.conf.broker_url = saved
        rebuild_pools()
    assert fresh(index_task).state == Task.State.FAILED
    clock.advance(actions.TASK_FAILED_SWEEP_AFTER_SECONDS + 1)
    assert actions.do_sweep_failed_tasks()["swept"] == 1
