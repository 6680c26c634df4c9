"""The fake node executes what the stub server hands out and calls back: index and
delete, truncate and stop_indexing, de-duplication, success rate and delays.
"""

from __future__ import annotations

import time

import pytest

from api.serializers import CallbackSerializer
from simulator import fakenode
from simulator.fakenode import FakeNodeConfig
from tests.simulator.fakenode_stub import (
    callback_task_ids,
    delete_task,
    index_task,
    reply,
)

# --- executing tasks and calling back --------------------------------------------------------


def test_index_callback_echoes_the_payload_and_reports_repo_stats(make_node, stub):
    node = make_node(index_size=lambda repo_id: repo_id * 1000, index_file_bytes=15_000)
    stub.replies = [reply(index_task(41, 31))]
    result = node.step()
    assert [c.status for c in result.callbacks] == [202]
    body = stub.callbacks()[0]["body"]
    assert body == {
        "name": "index",
        "success": True,
        "payload": {"task_id": 41, "schema_version": 2531},
        "additional_payload": {"repo_stats": {"size_in_bytes": 31_000, "index_file_count": 3}},
    }
    assert CallbackSerializer(data=body).is_valid()
    assert node.repos == {31: fakenode.HeldRepo(31_000, 3)}


def test_delete_removes_the_repository_and_its_bytes(make_node, stub):
    node = make_node(index_size=lambda _: 5000)
    stub.replies = [reply(index_task(1, 10), index_task(2, 11)), reply(delete_task(3, 10))]
    node.step()
    node.step()
    node.step()
    assert stub.callbacks()[-1]["body"] == {
        "name": "delete",
        "success": True,
        "payload": {"task_id": 3, "service_type": "zoekt"},
    }
    assert CallbackSerializer(data=stub.callbacks()[-1]["body"]).is_valid()
    assert set(node.repos) == {11}
    assert stub.heartbeats()[-1]["body"]["disk.indexed"] == 5000


def test_a_missing_repository_is_indexed_as_empty(make_node, stub):
    node = make_node(index_size=lambda _: 5000)
    stub.replies = [reply(index_task(1, 10)), reply(index_task(2, 10, MissingRepo=True))]
    node.step()
    node.step()
    assert stub.callbacks()[-1]["body"]["additional_payload"] == {
        "repo_stats": {"size_in_bytes": 0, "index_file_count": 0}
    }
    assert node.repos == {}


def test_tasks_for_one_repository_run_in_the_order_handed_out(make_node, stub):
    node = make_node(task_delay=(0.0, 0.05), concurrency=4, seed=3)
    stub.replies = [reply(index_task(1, 10), delete_task(2, 10), index_task(3, 11))]
    node.start()
    deadline = time.monotonic() + 5
    while len(stub.callbacks()) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    node.stop()
    assert set(node.repos) == {11}
    assert callback_task_ids(stub).index(1) < callback_task_ids(stub).index(2)


# --- truncate, stop_indexing, de-duplication ----------------------------------------------------


def test_truncate_wipes_the_repositories_held(make_node, stub):
    node = make_node(index_size=lambda _: 1000)
    stub.replies = [reply(index_task(1, 10), index_task(2, 11))]
    node.step()
    assert len(node.repos) == 2
    stub.replies = [reply(truncate=True)]
    node.step()
    assert node.repos == {}
    node.step()
    body = stub.heartbeats()[-1]["body"]
    assert body["disk.indexed"] == 0
    assert body["process_health"]["webserver"]["shards_loaded"] == 0


def test_truncate_on_registration_forgets_task_ids_of_an_earlier_server(make_node, stub):
    node = make_node()
    stub.replies = [reply(index_task(1, 10)), reply(index_task(1, 20), truncate=True)]
    node.step()
    node.step()
    assert callback_task_ids(stub) == [1, 1]
    assert set(node.repos) == {20}


def test_stop_indexing_declines_index_tasks_but_runs_deletes(make_node, stub):
    node = make_node()
    stub.replies = [
        reply(index_task(1, 10)),
        reply(index_task(2, 11), delete_task(3, 10), stop_indexing=True),
        reply(index_task(2, 11)),
    ]
    node.step()
    result = node.step()
    assert node.stop_indexing is True
    assert result.heartbeat.declined == [2]
    assert callback_task_ids(stub) == [1, 3]
    assert node.repos == {}
    node.step()
    assert node.stop_indexing is False
    assert callback_task_ids(stub) == [1, 3, 2]
    assert set(node.repos) == {11}


def test_re_sent_processing_tasks_run_once(make_node, stub):
    node = make_node()
    stub.replies = [reply(index_task(1, 10)), reply(index_task(1, 10)), reply(index_task(1, 10))]
    node.step()
    second = node.step()
    third = node.step()
    assert second.heartbeat.duplicates == [1]
    assert third.heartbeat.duplicates == [1]
    assert callback_task_ids(stub) == [1]


def test_a_task_re_sent_while_running_is_not_started_twice(make_node, stub):
    node = make_node(task_delay=0.4)
    stub.replies = [reply(index_task(1, 10), pull_frequency="50ms")] + [
        reply(index_task(1, 10), pull_frequency="50ms") for _ in range(20)
    ]
    node.start()
    deadline = time.monotonic() + 5
    while not stub.callbacks() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    node.stop()
    assert len(stub.heartbeats()) >= 4
    assert callback_task_ids(stub) == [1]
    # While it ran, the node counted it in node.task_count.
    assert any(r["body"]["node.task_count"] == 1 for r in stub.heartbeats())


def test_a_failed_task_offered_again_later_is_retried(make_node, stub):
    node = make_node(success_rate=0.0)
    stub.replies = [reply(index_task(1, 10)), reply(index_task(1, 10))]
    node.step()
    node.step()
    bodies = [r["body"] for r in stub.callbacks()]
    assert [b["payload"]["task_id"] for b in bodies] == [1, 1]
    assert all(b["success"] is False for b in bodies)


def test_a_stale_offer_of_a_task_whose_failure_was_just_reported_is_ignored(make_node, stub):
    node = make_node(success_rate=0.0)
    sent_before_report = time.monotonic()
    stub.replies = [reply(index_task(1, 10))]
    node.step()
    outcome = node.handle_reply(reply(index_task(1, 10)), sent_at=sent_before_report)
    assert outcome.accepted == []
    assert outcome.duplicates == [1]


def test_a_callback_the_server_did_not_take_is_posted_again_and_the_task_not_rerun(make_node, stub):
    node = make_node()
    stub.callback_statuses = [500]
    stub.replies = [reply(index_task(1, 10)), reply(index_task(1, 10))]
    first = node.step()
    assert [c.status for c in first.callbacks] == [500]
    second = node.step()
    assert [c.status for c in second.callbacks] == [202]
    assert second.heartbeat.duplicates == [1]
    assert callback_task_ids(stub) == [1, 1]
    assert set(node.repos) == {10}


# --- success rate and delays ------------------------------------------------------------------


def test_success_rate_zero_reports_failures_with_an_error(make_node, stub):
    node = make_node(success_rate=0.0, failure_error="disk on fire")
    stub.replies = [reply(index_task(1, 10), delete_task(2, 11))]
    node.step()
    bodies = [r["body"] for r in stub.callbacks()]
    assert bodies == [
        {
            "name": "index",
            "success": False,
            "error": "disk on fire",
            "payload": {"task_id": 1, "schema_version": 2531},
        },
        {
            "name": "delete",
            "success": False,
            "error": "disk on fire",
            "payload": {"task_id": 2, "service_type": "zoekt"},
        },
    ]
    assert all(CallbackSerializer(data=b).is_valid() for b in bodies)
    assert node.repos == {}


def test_success_rate_is_deterministic_for_a_seed(make_node, stub):
    tasks = [index_task(i, 100 + i) for i in range(1, 41)]

    def outcomes(seed: int, name: str) -> list[bool]:
        node = make_node(success_rate=0.5, seed=seed, name=name)
        accepted = node.handle_reply(reply(*tasks), sent_at=time.monotonic()).accepted
        return [job.succeed for job in accepted]

    first = outcomes(5, "a")
    assert first == outcomes(5, "b")
    assert first != outcomes(6, "c")
    assert 5 < sum(first) < 35


def test_delays_are_drawn_from_the_range(make_node):
    node = make_node(task_delay=(0.01, 0.03))
    tasks = [index_task(i, i) for i in range(1, 30)]
    delays = [j.delay for j in node.handle_reply(reply(*tasks), sent_at=0).accepted]
    assert all(0.01 <= d <= 0.03 for d in delays)
    assert len(set(delays)) > 1


def test_config_is_checked():
    with pytest.raises(ValueError, match="success_rate"):
        FakeNodeConfig(base_url="http://x", secret="s", success_rate=1.5)
    with pytest.raises(ValueError, match="secret"):
        FakeNodeConfig(base_url="http://x")
    with pytest.raises(ValueError, match="task_delay"):
        FakeNodeConfig(base_url="http://x", secret="s", task_delay=(0.5, 0.1))
