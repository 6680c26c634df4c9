"""simulator.models: disk, memory and search-traffic models (pure Python, stepped clock)."""

from __future__ import annotations

import itertools

import pytest

from simulator.fakenode import FakeNode, FakeNodeConfig
from simulator.models import (
    DiskModel,
    NamespaceMemoryModel,
    ZipfHotness,
    generate_searches,
    zipf_hotness,
    zipf_weights,
)

MIB = 1024**2


class StepClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_disk_grows_by_index_size():
    disk = DiskModel(clock=StepClock())
    disk.index(1, 10 * MIB)
    disk.index(2, 5 * MIB)
    assert disk.indexed_bytes() == 15 * MIB
    assert disk.used_bytes() == 15 * MIB


def test_disk_delete_frees_after_the_delay():
    clock = StepClock()
    disk = DiskModel(free_delay=30, clock=clock)
    disk.index(1, 10 * MIB)
    assert disk.delete(1) == 10 * MIB
    assert disk.indexed_bytes() == 0
    assert disk.used_bytes() == 10 * MIB
    clock.advance(29.9)
    assert disk.pending_free_bytes() == 10 * MIB
    clock.advance(0.2)
    assert disk.used_bytes() == 0


def test_disk_reindex_replaces_and_frees_the_old_index_later():
    clock = StepClock()
    disk = DiskModel(free_delay=10, clock=clock)
    disk.index(1, 10 * MIB)
    disk.index(1, 12 * MIB)
    assert disk.used_bytes() == 22 * MIB
    clock.advance(11)
    assert disk.used_bytes() == 12 * MIB


def test_disk_without_delay_frees_at_once():
    disk = DiskModel(clock=StepClock())
    disk.index(1, MIB)
    disk.delete(1)
    assert disk.used_bytes() == 0


def test_disk_spike_clears_after_its_duration():
    clock = StepClock()
    disk = DiskModel(clock=clock)
    disk.index(1, MIB)
    disk.inject_spike(100 * MIB, duration=60)
    clock.advance(10)
    disk.inject_spike(50 * MIB, duration=5)
    assert disk.spike_bytes() == 150 * MIB
    assert disk.used_bytes() == 151 * MIB
    clock.advance(6)
    assert disk.used_bytes() == 101 * MIB
    clock.advance(45)
    assert disk.used_bytes() == MIB


def test_disk_rejects_bad_values():
    with pytest.raises(ValueError):
        DiskModel(free_delay=-1)
    with pytest.raises(ValueError):
        DiskModel().inject_spike(-1, 1)


def test_zipf_weights_sum_to_one_and_decrease():
    weights = zipf_weights(50, s=1.0)
    assert sum(weights) == pytest.approx(1.0)
    assert all(a > b for a, b in itertools.pairwise(weights))
    assert weights[0] / weights[1] == pytest.approx(2.0)
    assert zipf_weights(4, s=0.0) == pytest.approx([0.25] * 4)
    assert zipf_weights(0) == []


def test_zipf_hotness_is_seeded():
    ids = list(range(100, 120))
    a, b = zipf_hotness(ids, seed=3), zipf_hotness(ids, seed=3)
    assert a == b
    assert sum(a.values()) == pytest.approx(1.0)
    assert sorted(a.values(), reverse=True) == pytest.approx(zipf_weights(20))
    assert zipf_hotness(ids, seed=4) != a


def test_memory_rss_from_shards_and_hotness():
    model = NamespaceMemoryModel(
        per_shard_base_bytes=2 * MIB, hotness={1: 0.5, 2: 0.1}, memory_limit_bytes=8 * 1024 * MIB
    )
    rss = model.rss_bytes(3, {1: 100 * MIB, 2: 50 * MIB, 9: 70 * MIB})
    # 3 shards × 2 MiB + 100 MiB × 0.5 + 50 MiB × 0.1 + 70 MiB × 0 (unknown: default 0)
    assert rss == 6 * MIB + 50 * MIB + 5 * MIB


def test_memory_hotter_namespaces_cost_more():
    hotness = zipf_hotness([1, 2, 3, 4], seed=0)
    model = NamespaceMemoryModel(per_shard_base_bytes=0, hotness=hotness)
    hottest = max(hotness, key=hotness.get)
    coldest = min(hotness, key=hotness.get)
    assert model.rss_bytes(1, {hottest: MIB}) > model.rss_bytes(1, {coldest: MIB})


def test_zipf_hotness_callable_averages_scale():
    hot = ZipfHotness(ranks=10, s=1.0, seed=1, scale=2.0)
    assert hot(5) == hot(5)
    assert sum(hot.scale * w * 10 for w in zipf_weights(10)) / 10 == pytest.approx(2.0)
    assert NamespaceMemoryModel(hotness=hot).factor(5) == hot(5)


def test_traffic_follows_hotness_and_counts_dark():
    weights = {1: 0.5, 2: 0.3, 3: 0.2}
    targets = {1: ["node-a"], 2: ["node-b", "node-c"], 3: []}
    asked: list[int] = []

    def targets_for(ns):
        asked.append(ns)
        return targets[ns]

    result = generate_searches(weights, targets_for, 20_000, seed=7)
    assert result.searches == 20_000
    for ns, weight in weights.items():
        assert result.by_namespace[ns] / 20_000 == pytest.approx(weight, abs=0.02)
    assert result.dark == result.by_namespace[3]
    assert result.dark_by_namespace == {3: result.by_namespace[3]}
    assert result.dark_ratio == pytest.approx(0.2, abs=0.02)
    assert sorted(asked) == [1, 2, 3]  # once per namespace drawn
    again = generate_searches(weights, targets_for, 20_000, seed=7)
    assert again.by_namespace == result.by_namespace


def test_traffic_edge_cases():
    assert generate_searches({}, lambda ns: [], 10).searches == 0
    assert generate_searches({1: 1.0}, lambda ns: [1], 0).dark == 0
    assert generate_searches({1: 1.0}, lambda ns: [], 5).dark_ratio == 1.0


def _node(tmp_path, **kwargs) -> FakeNode:
    return FakeNode(
        FakeNodeConfig(base_url="http://127.0.0.1:9", secret="s", state_dir=tmp_path, **kwargs)
    )


def _apply_index(node: FakeNode, task_id: int, repo_id: int, traversal: str, name="index"):
    reply = {
        "id": 1,
        "tasks": [
            {
                "name": name,
                "payload": {
                    "RepoId": repo_id,
                    "Callback": {"name": name, "payload": {"task_id": task_id}},
                    "Metadata": {"traversal_ids": traversal},
                },
            }
        ],
    }
    outcome = node.handle_reply(reply, sent_at=0.0)
    for job in outcome.accepted:
        node._apply(job)


def test_fakenode_disk_hook(tmp_path):
    clock = StepClock()
    disk = DiskModel(free_delay=30, clock=clock)
    node = _node(tmp_path, disk_model=disk, index_size=lambda repo: 10 * MIB)
    base = node.config.disk_base_used_bytes
    _apply_index(node, 1, 7, "5-")
    assert node.heartbeat_body()["disk.used"] == base + 10 * MIB
    disk.inject_spike(MIB, 5)
    assert node.disk_used_bytes() == base + 11 * MIB
    _apply_index(node, 2, 7, "5-", name="delete")
    body = node.heartbeat_body()
    assert body["disk.indexed"] == 0
    assert body["disk.used"] == base + 11 * MIB
    clock.advance(31)
    assert node.disk_used_bytes() == base


def test_fakenode_memory_hook(tmp_path):
    memory = NamespaceMemoryModel(
        per_shard_base_bytes=MIB, hotness={5: 0.5}, memory_limit_bytes=4 * 1024 * MIB
    )
    node = _node(tmp_path, namespace_memory=memory, index_size=lambda repo: 10 * MIB)
    _apply_index(node, 1, 7, "5-12-")
    _apply_index(node, 2, 8, "6-")
    webserver = node.process_health()["webserver"]
    assert webserver["shards_loaded"] == 2
    assert webserver["rss_bytes"] == 2 * MIB + 5 * MIB
    assert webserver["memory_limit_bytes"] == 4 * 1024 * MIB


def test_fakenode_defaults_unchanged(tmp_path):
    node = _node(tmp_path, index_size=lambda repo: 10 * MIB)
    _apply_index(node, 1, 7, "5-")
    webserver = node.process_health()["webserver"]
    assert "memory_limit_bytes" not in webserver
    assert webserver["rss_bytes"] == int(200 * MIB + 0.3 * 10 * MIB)
    assert node.disk_used_bytes() == node.config.disk_base_used_bytes + 10 * MIB
