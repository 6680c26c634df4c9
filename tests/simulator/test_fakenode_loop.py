"""The fake node's loop (pull_frequency, keep-alive) and its command line."""

from __future__ import annotations

import json
import uuid

import pytest

from simulator import fakenode
from simulator.fakenode import FakeNode, FakeNodeConfig
from tests.simulator.fakenode_stub import (
    SECRET,
    index_task,
    reply,
)

# --- pull_frequency and the loop ----------------------------------------------------------------


def test_the_node_follows_pull_frequency(make_node, stub):
    node = make_node()
    stub.replies = [reply(pull_frequency="500ms")]
    node.step()
    assert node.pull_frequency_seconds == 0.5
    stub.replies = [reply(pull_frequency="1m")]
    node.step()
    assert node.pull_frequency_seconds == 60.0
    stub.replies = [reply(pull_frequency="nonsense")]
    node.step()
    assert node.pull_frequency_seconds == 60.0


def test_the_loop_heartbeats_every_pull_frequency(make_node, stub):
    fast = make_node(name="fast")
    stub.replies = [reply(pull_frequency="100ms") for _ in range(100)]
    fast.run_for(0.55)
    fast_count = len(stub.heartbeats())
    assert 4 <= fast_count <= 8

    slow = make_node(name="slow")
    stub.replies = [reply(pull_frequency="5s") for _ in range(100)]
    slow.run_for(0.55)
    assert len(stub.heartbeats()) - fast_count == 1


def test_a_server_that_refuses_the_heartbeat_does_not_crash_the_node(make_node):
    node = make_node(base_url="http://127.0.0.1:9")  # nothing listens on the discard port
    result = node.step()
    assert result.heartbeat.status is None
    assert result.heartbeat.error


def test_step_is_refused_while_the_loop_runs(make_node):
    node = make_node()
    node.start()
    with pytest.raises(RuntimeError):
        node.step()
    node.stop()


def test_keep_alive_connections_are_reused(make_node, stub):
    node = make_node()
    for _ in range(3):
        node.step()
    assert len({tuple(r["client"]) for r in stub.heartbeats()}) == 1


# --- CLI --------------------------------------------------------------------------------------


def test_cli_runs_n_nodes_and_logs_json_lines(stub, tmp_path, capsys):
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    stub.replies = [reply(pull_frequency="100ms") for _ in range(200)]
    code = fakenode.main(
        [
            "--url",
            stub.url,
            "--secret-file",
            str(secret_file),
            "--count",
            "3",
            "--state-dir",
            str(tmp_path / "nodes"),
            "--duration",
            "0.3",
        ]
    )
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    events = {(line["event"], line["node"]) for line in lines}
    for name in ("zoekt-0", "zoekt-1", "zoekt-2"):
        assert ("started", name) in events
        assert ("heartbeat", name) in events
        assert ("stopped", name) in events
        uuid.UUID((tmp_path / "nodes" / f"{name}.uuid").read_text().strip())
    names = {r["body"]["node.name"] for r in stub.heartbeats()}
    assert names == {"zoekt-0", "zoekt-1", "zoekt-2"}


def cli_configs(tmp_path, *extra: str) -> list[FakeNodeConfig]:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    argv = ["--url", "http://127.0.0.1:9", "--secret-file", str(secret_file), *extra]
    return fakenode.configs_from_args(fakenode.build_parser().parse_args(argv), None)


def test_cli_index_sizes_file_sets_the_index_size_of_every_node(tmp_path):
    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps({"101": 5 * fakenode.GIB, "102": 0}))
    configs = cli_configs(tmp_path, "--count", "2", "--index-sizes", str(sizes))
    assert len(configs) == 2
    for config in configs:
        assert config.index_size(101) == 5 * fakenode.GIB
        assert config.index_size(102) == 0
        # a repository the file does not name keeps the default size
        assert config.index_size(103) == fakenode.default_index_size(103)
    # without the option: the default for every repository
    (plain,) = cli_configs(tmp_path)
    assert plain.index_size(101) == fakenode.default_index_size(101)


def test_cli_index_sizes_reach_the_callback_and_disk(tmp_path, stub):
    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps({"7": 3 * fakenode.GIB}))
    (config,) = cli_configs(tmp_path, "--index-sizes", str(sizes), "--delay", "0")
    config.base_url = stub.url
    config.state_dir = tmp_path / "nodes"
    stub.replies = [reply(index_task(1, 7))]
    result = FakeNode(config).step()
    (callback,) = result.callbacks
    assert callback.body["additional_payload"]["repo_stats"]["size_in_bytes"] == 3 * fakenode.GIB


@pytest.mark.parametrize(
    "content",
    ['["not", "an", "object"]', '{"7": -1}', '{"7": "big"}', '{"seven": 1}', "{broken"],
)
def test_cli_index_sizes_refuses_a_bad_file(tmp_path, content):
    sizes = tmp_path / "sizes.json"
    sizes.write_text(content)
    with pytest.raises(ValueError, match=r"sizes\.json"):
        cli_configs(tmp_path, "--index-sizes", str(sizes))


def test_cli_hotness_scale_and_zipf_exponent_reach_the_memory_model(tmp_path):
    configs = cli_configs(
        tmp_path,
        "--count",
        "2",
        "--memory-limit-gib",
        "2",
        "--zipf-s",
        "0.4",
        "--hotness-scale",
        "0.2",
        "--seed",
        "3",
    )
    models = [config.namespace_memory for config in configs]
    for model in models:
        assert model.memory_limit_bytes == 2 * fakenode.GIB
        assert model.hotness.scale == 0.2
        assert model.hotness.s == 0.4
    # one hotness for the fleet: a namespace is as hot on every node
    assert models[0].hotness(900_001) == models[1].hotness(900_001)
    # the factors average the scale over the Zipf ranks
    hotness = models[0].hotness
    ids = range(100_000)
    assert sum(hotness(ns) for ns in ids) / len(ids) == pytest.approx(0.2, rel=0.05)
    # without --hotness-scale the factors average 1
    (default,) = cli_configs(tmp_path, "--memory-limit-gib", "2")
    assert default.namespace_memory.hotness.scale == 1.0
