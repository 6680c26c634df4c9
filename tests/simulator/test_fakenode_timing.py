"""Task time in the fake node's timed step mode: rates, concurrency, late frees,
ramped spikes, and the request timings it logs.
"""

from __future__ import annotations

import socket

import pytest

from simulator import fakenode
from simulator.fakenode import FakeNodeConfig
from simulator.models import DiskModel
from tests.simulator.fakenode_stub import (
    callback_task_ids,
    delete_task,
    index_task,
    reply,
)

# --- task time (timed step mode) -----------------------------------------------------------


class SimClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_tasks_are_instant_by_default(make_node, stub):
    node = make_node(index_size=lambda _: 10 * fakenode.MIB, concurrency=1)
    assert node.timed is False
    stub.replies = [reply(index_task(1, 10), index_task(2, 11), index_task(3, 12))]
    result = node.step()
    # Every task accepted ran and called back in the step that accepted it.
    assert [c.task_id for c in result.callbacks] == [1, 2, 3]
    assert set(node.repos) == {10, 11, 12}


def test_an_index_task_of_n_bytes_completes_after_n_over_rate_seconds(make_node, stub):
    clock = SimClock()
    rate = 20 * fakenode.MIB  # bytes a second
    node = make_node(
        index_size=lambda _: 300 * fakenode.MIB, indexing_bytes_per_second=rate, clock=clock
    )
    stub.replies = [reply(index_task(1, 10))]
    assert node.step().callbacks == []  # accepted at t=0, running
    assert node.repos == {}
    clock.t = 14.9
    assert node.step().callbacks == []
    assert stub.heartbeats()[-1]["body"]["node.task_count"] == 1  # still running
    clock.t = 15.0  # 300 MiB / 20 MiB/s
    result = node.step()
    assert [c.task_id for c in result.callbacks] == [1]
    assert node.repos == {10: fakenode.HeldRepo(300 * fakenode.MIB, 3)}
    # The callback went before the heartbeat of that step, which no longer counts it.
    assert stub.heartbeats()[-1]["body"]["node.task_count"] == 0
    assert stub.heartbeats()[-1]["body"]["disk.indexed"] == 300 * fakenode.MIB


def test_at_most_concurrency_tasks_run_at_once_and_the_rest_wait_in_order(make_node, stub):
    clock = SimClock()
    node = make_node(
        index_size=lambda _: 100, indexing_bytes_per_second=10.0, concurrency=2, clock=clock
    )
    stub.replies = [reply(*(index_task(task_id, 100 + task_id) for task_id in range(1, 6)))]
    node.step()  # five accepted at t=0: two run, three queued
    assert node.queued_tasks == 3
    assert node.process_health()["indexer"]["rss_bytes"] == (
        node.config.memory.indexer_base_rss_bytes
        + 2 * node.config.memory.indexer_rss_per_running_task_bytes
    )
    clock.t = 9.0
    assert node.step().callbacks == []
    # A step late: the next two started when the first two ended (10 s), not at the step.
    clock.t = 25.0
    assert [c.task_id for c in node.step().callbacks] == [1, 2, 3, 4]
    assert node.queued_tasks == 0
    clock.t = 29.9
    assert node.step().callbacks == []
    clock.t = 30.0
    assert [c.task_id for c in node.step().callbacks] == [5]
    # Re-offered while queued or running, a task was never started twice.
    assert callback_task_ids(stub) == [1, 2, 3, 4, 5]


def test_a_task_offered_again_while_it_waits_is_not_queued_twice(make_node, stub):
    clock = SimClock()
    node = make_node(
        index_size=lambda _: 100, indexing_bytes_per_second=10.0, concurrency=1, clock=clock
    )
    stub.replies = [reply(index_task(1, 10), index_task(2, 11)), reply(index_task(2, 11))]
    node.step()
    second = node.step()
    assert second.heartbeat.duplicates == [2]
    clock.t = 20.0
    assert [c.task_id for c in node.step().callbacks] == [1, 2]


def test_a_delete_is_quick_but_its_bytes_are_freed_late(make_node, stub):
    clock = SimClock()
    disk = DiskModel(free_delay=300, clock=clock)
    node = make_node(
        index_size=lambda _: 1000,
        indexing_bytes_per_second=100.0,
        delete_task_seconds=2.0,
        disk_model=disk,
        disk_base_used_bytes=0,
    )
    assert node.now() == 0.0  # the disk model's clock, when no clock is given
    stub.replies = [reply(index_task(1, 10))]
    node.step()
    clock.t = 10.0
    node.step()
    assert disk.used_bytes() == 1000
    stub.replies = [reply(delete_task(2, 10))]
    node.step()  # accepted at t=10
    assert 10 in node.repos
    clock.t = 12.0
    assert [c.task_id for c in node.step().callbacks] == [2]
    assert node.repos == {}
    assert disk.used_bytes() == 1000  # freed 300 s after the delete
    clock.t = 312.0
    assert disk.used_bytes() == 0


def test_tasks_for_one_repository_keep_their_order_when_timed(make_node, stub):
    clock = SimClock()
    node = make_node(
        index_size=lambda _: 100, indexing_bytes_per_second=10.0, concurrency=4, clock=clock
    )
    stub.replies = [reply(index_task(1, 10), delete_task(2, 10), index_task(3, 11))]
    node.step()
    clock.t = 10.0
    # The delete waited for the index of the same repository; the other ran beside it.
    assert [c.task_id for c in node.step().callbacks] == [1, 3]
    clock.t = 11.0
    assert [c.task_id for c in node.step().callbacks] == [2]
    assert set(node.repos) == {11}


def test_timed_config_is_checked():
    with pytest.raises(ValueError, match="indexing_bytes_per_second"):
        FakeNodeConfig(base_url="http://x", secret="s", indexing_bytes_per_second=0)
    with pytest.raises(ValueError, match="delete_task_seconds"):
        FakeNodeConfig(base_url="http://x", secret="s", delete_task_seconds=-1)


def test_a_ramped_spike_grows_on_the_disk_then_clears_at_once(make_node):
    clock = SimClock()
    disk = DiskModel(clock=clock)
    node = make_node(disk_model=disk, disk_base_used_bytes=0)
    disk.inject_spike(600, duration=7 * 3600, ramp=3 * 3600)
    assert node.disk_used_bytes() == 0
    clock.t = 1.5 * 3600
    assert node.disk_used_bytes() == 300
    clock.t = 3 * 3600
    assert node.disk_used_bytes() == 600
    clock.t = 7 * 3600 - 1
    assert node.disk_used_bytes() == 600
    clock.t = 7 * 3600
    assert node.disk_used_bytes() == 0


def test_each_request_logs_how_long_the_server_took_to_answer(make_node, stub):
    logged: list[dict] = []
    node = make_node(index_size=lambda _: 5000, log=logged.append)
    stub.replies = [reply(index_task(1, 10))]
    node.step()
    # A server that does not answer: the error is timed too.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    down = make_node(base_url=f"http://127.0.0.1:{closed}", name="zoekt-1", log=logged.append)
    down.heartbeat()
    timed = [r for r in logged if r["event"] in {"heartbeat", "callback", "heartbeat_error"}]
    assert sorted({r["event"] for r in timed}) == ["callback", "heartbeat", "heartbeat_error"]
    for record in timed:
        assert isinstance(record["latency_ms"], float), record
        assert 0 <= record["latency_ms"] < 10_000, record
