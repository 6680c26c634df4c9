"""The fake node's protocol against a stub server: Go durations, identity and
authentication, and the heartbeat body (run through the real serializers, so the fake
node cannot drift from what the control plane accepts).
"""

from __future__ import annotations

import time

import jwt
import pytest

from api.serializers import HeartbeatSerializer
from simulator import fakenode
from simulator.fakenode import parse_go_duration
from tests.simulator.fakenode_stub import (
    HEARTBEAT_KEYS,
    SECRET,
    index_task,
    reply,
)

# --- Go durations --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5s", 5.0),
        ("500ms", 0.5),
        ("1m", 60.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("0", 0.0),
        ("250us", 0.00025),
        ("2h45m30.5s", 9930.5),
        ("100ns", 1e-7),
    ],
)
def test_go_durations_parse_to_seconds(text, seconds):
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "s", "5x", "5 s", "1.2.3s", "ms5"])
def test_malformed_go_durations_are_refused(text):
    with pytest.raises(ValueError):
        parse_go_duration(text)


# --- identity and authentication -------------------------------------------------------------


def test_uuid_is_created_on_first_start_and_reused(make_node, tmp_path):
    first = make_node(name="zoekt-a")
    path = tmp_path / "zoekt-a.uuid"
    assert not path.exists()
    first.step()
    assert path.read_text().strip() == str(first.uuid)

    again = make_node(name="zoekt-a")
    other = make_node(name="zoekt-b")
    assert again.uuid == first.uuid
    assert other.uuid != first.uuid


def test_a_corrupt_uuid_file_is_an_error(make_node, tmp_path):
    (tmp_path / "zoekt-x.uuid").write_text("not-a-uuid\n")
    node = make_node(name="zoekt-x")
    with pytest.raises(ValueError, match="does not hold a uuid"):
        _ = node.uuid


def test_secret_is_read_from_its_file_without_the_trailing_newline(make_node, stub, tmp_path):
    secret_file = tmp_path / "gitlab_shell_secret"
    secret_file.write_text(SECRET + "\n")
    node = make_node(secret=None, secret_file=secret_file)
    node.step()
    token = stub.heartbeats()[0]["headers"]["Gitlab-Shell-Api-Request"]
    jwt.decode(token, SECRET, algorithms=["HS256"], issuer="gitlab-shell")


def test_each_request_carries_a_token_verifiable_with_the_secret(make_node, stub):
    stub.replies = [reply(index_task(1, 10))]
    node = make_node()
    before = int(time.time())
    node.step()
    requests = stub.requests
    assert [r["path"] for r in requests] == [
        f"/api/v4/internal/search/zoekt/{node.uuid}/heartbeat",
        f"/api/v4/internal/search/zoekt/{node.uuid}/callback",
    ]
    for request in requests:
        token = request["headers"]["Gitlab-Shell-Api-Request"]
        claims = jwt.decode(
            token,
            SECRET,
            algorithms=["HS256"],
            issuer="gitlab-shell",
            options={"require": ["iss", "iat", "exp"]},
        )
        assert set(claims) == {"iss", "iat", "exp"}
        assert claims["iss"] == "gitlab-shell"
        assert before <= claims["iat"] <= int(time.time())
        assert claims["exp"] - claims["iat"] == 60
        with pytest.raises(jwt.InvalidSignatureError):
            jwt.decode(token, "another-secret-of-thirty-two-bytes!", algorithms=["HS256"])
        assert request["headers"]["Content-Type"] == "application/json"


def test_the_local_token_matches_the_servers_encoder():
    from api.authentication import encode_node_token

    assert fakenode.encode_node_token(SECRET, now=1_700_000_000) == encode_node_token(
        SECRET, now=1_700_000_000
    )


def test_the_fake_node_does_not_import_django():
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, simulator.fakenode; print('django' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "False"


# --- the heartbeat body ----------------------------------------------------------------------


def test_heartbeat_body_has_gitlabs_dotted_keys_and_passes_the_real_serializer(make_node, stub):
    node = make_node(
        name="zoekt-7",
        index_url="http://zoekt-7.zoekt:6065",
        search_url="http://zoekt-7.zoekt:6070",
        disk_total_bytes=50 * fakenode.GIB,
        disk_base_used_bytes=5 * fakenode.GIB,
        concurrency=3,
        schema_version=2600,
    )
    node.step()
    body = stub.heartbeats()[0]["body"]
    assert set(body) == HEARTBEAT_KEYS
    assert body["node.url"] == "http://zoekt-7.zoekt:6065"
    assert body["node.search_url"] == "http://zoekt-7.zoekt:6070"
    assert body["node.name"] == "zoekt-7"
    assert body["node.version"] == "v1.16.2"
    assert body["node.schema_version"] == 2600
    assert body["node.concurrency"] == 3
    assert body["node.task_count"] == 0
    assert body["node.services"] == ["zoekt"]
    assert body["disk.all"] == 50 * fakenode.GIB
    assert body["disk.used"] == 5 * fakenode.GIB
    assert body["disk.indexed"] == 0
    assert set(body["process_health"]) == {"indexer", "webserver"}
    serializer = HeartbeatSerializer(data=body)
    assert serializer.is_valid(), serializer.errors


def test_disk_and_process_health_follow_the_repositories_held(make_node, stub):
    sizes = {10: 1_000_000, 11: 3_000_000}
    memory = fakenode.MemoryModel(
        webserver_base_rss_bytes=1000, webserver_rss_per_indexed_byte=0.5, memory_limit_bytes=8000
    )
    node = make_node(
        index_size=sizes.__getitem__,
        index_file_bytes=2_000_000,
        memory=memory,
        disk_base_used_bytes=100,
    )
    stub.replies = [reply(index_task(1, 10), index_task(2, 11))]
    node.step()
    node.step()
    body = stub.heartbeats()[-1]["body"]
    assert body["disk.indexed"] == 4_000_000
    assert body["disk.used"] == 100 + 4_000_000
    webserver = body["process_health"]["webserver"]
    assert webserver["rss_bytes"] == 1000 + 2_000_000
    assert webserver["shards_loaded"] == 2
    assert webserver["mmap_current"] == memory.webserver_mmap_base + 4 * (1 + 2)
    assert webserver["mmap_max"] == memory.mmap_max
    assert webserver["memory_limit_bytes"] == 8000
    for process in body["process_health"].values():
        assert process["restarts_1m"] == process["restarts_5m"] == process["restarts_15m"] == 0
        assert type(process["uptime_seconds"]) is int and process["uptime_seconds"] >= 0
        assert "restart_count" not in process
    assert HeartbeatSerializer(data=body).is_valid()


GITLAB_PROCESS_METRICS = {
    "mmap_current",
    "mmap_max",
    "restarts_1m",
    "restarts_5m",
    "restarts_15m",
    "rss_bytes",
    "uptime_seconds",
}


def test_process_health_sends_gitlabs_process_metrics_keys_as_integers(make_node):
    node = make_node(memory=fakenode.MemoryModel(memory_limit_bytes=8000))
    health = node.heartbeat_body()["process_health"]
    assert set(health["indexer"]) == GITLAB_PROCESS_METRICS
    assert set(health["webserver"]) == GITLAB_PROCESS_METRICS | {
        "shards_loaded",
        "memory_limit_bytes",
    }
    for process in health.values():
        assert all(type(value) is int for value in process.values()), process


def test_uptime_is_whole_seconds_since_the_node_started(make_node):
    node = make_node()
    assert node.uptime_seconds() == 0
    node._started_at = time.monotonic() - 90.7
    assert node.uptime_seconds() == 90
    health = node.heartbeat_body()["process_health"]
    assert health["indexer"]["uptime_seconds"] == health["webserver"]["uptime_seconds"] == 90


def test_disk_used_never_exceeds_disk_all(make_node):
    node = make_node(disk_total_bytes=1000, disk_base_used_bytes=900, index_size=lambda _: 500)
    node.handle_reply(reply(index_task(1, 10)), sent_at=time.monotonic())
    node._apply(node._inflight[1])
    body = node.heartbeat_body()
    assert body["disk.indexed"] == 500
    assert body["disk.used"] == 1000
    assert HeartbeatSerializer(data=body).is_valid()
