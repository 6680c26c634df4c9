"""What a fake node holds, across restarts: the holdings file, its writes and reloads."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from simulator import fakenode
from simulator.fakenode import FakeNode, FakeNodeConfig
from simulator.models import DiskModel, NamespaceMemoryModel
from tests.simulator.fakenode_stub import (
    SECRET,
    delete_task,
    index_task,
    reply,
)

# --- what a node holds, across restarts --------------------------------------------------------


def held_figures(node: FakeNode) -> dict:
    """What a node reports about what it holds: disk, and the webserver's memory and shards."""
    body = node.heartbeat_body()
    webserver = body["process_health"]["webserver"]
    return {
        "disk.indexed": body["disk.indexed"],
        "disk.used": body["disk.used"],
        "rss_bytes": webserver["rss_bytes"],
        "shards_loaded": webserver["shards_loaded"],
        "mmap_current": webserver["mmap_current"],
    }


def hot_memory() -> NamespaceMemoryModel:
    return NamespaceMemoryModel(per_shard_base_bytes=1000, hotness={9: 0.5, 12: 0.1})


def test_a_restarted_node_holds_reports_and_is_sized_by_what_it_indexed(make_node, stub):
    sizes = {10: 4_000_000, 11: 2_000_000, 12: 6_000_000, 13: 1_000_000}
    options = {"name": "zoekt-r", "index_size": sizes.__getitem__, "index_file_bytes": 1_500_000}
    node = make_node(namespace_memory=hot_memory(), **options)
    stub.replies = [
        reply(
            index_task(1, 10, Metadata={"traversal_ids": "9-"}),
            index_task(2, 11, Metadata={"traversal_ids": "9-20-"}),
            index_task(3, 12, Metadata={"traversal_ids": "12-"}),
            index_task(4, 13, Metadata={"traversal_ids": "12-"}),
        ),
        reply(delete_task(5, 13)),
    ]
    node.step()
    node.step()
    before = held_figures(node)
    assert before["disk.indexed"] == 12_000_000
    assert before["rss_bytes"] == 3 * 1000 + 6_000_000 * 0.5 + 6_000_000 * 0.1
    node.stop()

    again = make_node(namespace_memory=hot_memory(), **options)
    assert again.uuid == node.uuid
    assert again.repos == node.repos
    assert node.repos == {
        10: fakenode.HeldRepo(4_000_000, 3),
        11: fakenode.HeldRepo(2_000_000, 2),
        12: fakenode.HeldRepo(6_000_000, 4),
    }
    assert held_figures(again) == before
    again.step()
    sent = stub.heartbeats()[-1]["body"]
    assert sent["disk.indexed"] == 12_000_000
    assert sent["process_health"]["webserver"]["rss_bytes"] == before["rss_bytes"]
    assert sent["process_health"]["webserver"]["shards_loaded"] == 3


def test_the_simple_memory_model_follows_the_reloaded_holdings(make_node, stub):
    memory = fakenode.MemoryModel(webserver_base_rss_bytes=1000, webserver_rss_per_indexed_byte=0.5)
    node = make_node(index_size=lambda _: 2_000_000, memory=memory)
    stub.replies = [reply(index_task(1, 10), index_task(2, 11))]
    node.step()
    node.stop()
    again = make_node(index_size=lambda _: 2_000_000, memory=memory)
    assert held_figures(again)["rss_bytes"] == 1000 + 0.5 * 4_000_000
    assert held_figures(again) == held_figures(node)


def test_holdings_are_written_as_they_change_so_a_killed_node_keeps_them(make_node, stub, tmp_path):
    node = make_node(index_size=lambda _: 5000, holdings_save_interval=0)
    stub.replies = [reply(index_task(1, 10), index_task(2, 11)), reply(delete_task(3, 10))]
    node.step()
    node.step()
    # Not stopped: as if the process were killed. Every change was written already.
    data = json.loads((tmp_path / "zoekt-0.holdings.json").read_text())
    assert data == {
        "format": 1,
        "uuid": str(node.uuid),
        "repos": {"11": {"size_bytes": 5000, "index_file_count": 1, "root_namespace_id": None}},
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zoekt-0.holdings.json", "zoekt-0.uuid"]
    again = FakeNode(FakeNodeConfig(base_url=stub.url, secret=SECRET, state_dir=tmp_path))
    assert again.repos == {11: fakenode.HeldRepo(5000, 1)}


def test_with_tasks_running_in_parallel_the_file_ends_with_the_last_change(
    make_node, stub, tmp_path
):
    node = make_node(
        index_size=lambda repo_id: repo_id, holdings_save_interval=0, concurrency=8, seed=5
    )
    stub.replies = [reply(*(index_task(i, 100 + i) for i in range(1, 41)), pull_frequency="1h")]
    node.start()
    deadline = time.monotonic() + 10
    while len(stub.callbacks()) < 40 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(stub.callbacks()) == 40

    def written() -> set[int]:
        return {
            int(i) for i in json.loads((tmp_path / "zoekt-0.holdings.json").read_text())["repos"]
        }

    # Still running, and no heartbeat for an hour: no change is left unwritten, although
    # writers skip while another one writes.
    while written() != set(node.repos) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert written() == set(node.repos) == set(range(101, 141))
    node.stop()


def test_holdings_writes_are_throttled_and_stop_writes_the_last_change(make_node, stub, tmp_path):
    path = tmp_path / "zoekt-0.holdings.json"
    node = make_node(index_size=lambda _: 5000, holdings_save_interval=3600)
    stub.replies = [reply(index_task(1, 10)), reply(index_task(2, 11))]
    node.step()
    assert set(json.loads(path.read_text())["repos"]) == {"10"}  # the first change at once
    node.step()
    assert set(json.loads(path.read_text())["repos"]) == {"10"}  # the next within the interval
    assert node.save_holdings() is False
    node.stop()
    assert set(json.loads(path.read_text())["repos"]) == {"10", "11"}
    assert node.save_holdings(force=True) is False  # nothing changed since


def test_a_truncate_empties_the_holdings_at_once(make_node, stub):
    node = make_node(index_size=lambda _: 5000, holdings_save_interval=3600)
    stub.replies = [reply(index_task(1, 10)), reply(truncate=True)]
    node.step()
    node.step()
    again = make_node(index_size=lambda _: 5000)
    assert again.repos == {}
    assert again.heartbeat_body()["disk.indexed"] == 0


def test_the_disk_model_counts_the_reloaded_holdings(make_node, stub):
    node = make_node(index_size=lambda _: 7000, disk_model=DiskModel(), disk_base_used_bytes=100)
    stub.replies = [reply(index_task(1, 10), index_task(2, 11))]
    node.step()
    node.stop()
    disk = DiskModel()
    again = make_node(index_size=lambda _: 7000, disk_model=disk, disk_base_used_bytes=100)
    assert disk.held() == {10: 7000, 11: 7000}
    assert again.heartbeat_body()["disk.used"] == 100 + 14_000


def test_holdings_of_another_node_or_a_lost_uuid_are_not_loaded(make_node, stub, tmp_path):
    node = make_node(index_size=lambda _: 5000)
    stub.replies = [reply(index_task(1, 10))]
    node.step()
    node.stop()
    # The uuid file is lost: the node is a new one, and what the old one held is not its own.
    (tmp_path / "zoekt-0.uuid").unlink()
    logged: list[dict] = []
    fresh = make_node(index_size=lambda _: 5000, log=logged.append)
    assert fresh.repos == {}
    assert [r["reason"] for r in logged if r["event"] == "holdings_ignored"] == ["no_uuid_file"]
    # A holdings file naming another uuid is not loaded either.
    (tmp_path / "zoekt-0.uuid").write_text(f"{uuid.uuid4()}\n")
    logged.clear()
    other = make_node(index_size=lambda _: 5000, log=logged.append)
    assert other.repos == {}
    assert [r["reason"] for r in logged if r["event"] == "holdings_ignored"] == ["other_uuid"]


@pytest.mark.parametrize(
    "content",
    ["{broken", '["a list"]', '{"format": 99, "repos": {}}', '{"format": 1, "repos": {"x": {}}}'],
)
def test_an_unreadable_holdings_file_leaves_the_node_empty(make_node, tmp_path, content):
    first = make_node()
    _ = first.uuid
    (tmp_path / "zoekt-0.holdings.json").write_text(content)
    logged: list[dict] = []
    node = make_node(log=logged.append)
    assert node.repos == {}
    assert [r["event"] for r in logged] == ["holdings_unreadable"]


def test_without_persistence_nothing_is_written_or_loaded(make_node, stub, tmp_path):
    node = make_node(index_size=lambda _: 5000, persist_holdings=False)
    stub.replies = [reply(index_task(1, 10))]
    node.step()
    node.stop()
    assert not (tmp_path / "zoekt-0.holdings.json").exists()
    assert make_node(persist_holdings=False).repos == {}


def test_the_cli_writes_what_it_holds_when_stopped_by_sigterm(stub, tmp_path):
    import signal
    import subprocess
    import sys
    from pathlib import Path

    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    state = tmp_path / "nodes"
    stub.replies = [reply(index_task(1, 10), index_task(2, 11), pull_frequency="1h")]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simulator.fakenode",
            "--url",
            stub.url,
            "--secret-file",
            str(secret_file),
            "--state-dir",
            str(state),
            "--delay",
            "0",
            "--concurrency",
            "1",
        ],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while len(stub.callbacks()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(stub.callbacks()) == 2
        # The second change came within the save interval of the first: only stop() writes it.
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert '"event":"stopped"' in out
    held = json.loads((state / "zoekt-0.holdings.json").read_text())["repos"]
    assert set(held) == {"10", "11"}
