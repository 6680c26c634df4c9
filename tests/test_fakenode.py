"""The fake node against a stub HTTP server: request shape, reply handling, task execution.

The stub answers heartbeats from a script and records every request, so each
test states exactly what the server said and checks exactly what the node
sent. Bodies are also run through the real serializers, so the fake node
cannot drift from what the control plane accepts.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest

from api.serializers import CallbackSerializer, HeartbeatSerializer
from simulator import fakenode
from simulator.fakenode import FakeNode, FakeNodeConfig, parse_go_duration
from simulator.models import DiskModel, NamespaceMemoryModel

SECRET = "stub-shell-secret-0123456789abcdef"
HEARTBEAT_KEYS = {
    "node.url",
    "node.search_url",
    "node.name",
    "node.version",
    "node.schema_version",
    "node.concurrency",
    "node.task_count",
    "node.services",
    "disk.all",
    "disk.used",
    "disk.indexed",
    "process_health",
}


# --- the stub server ---------------------------------------------------------------------


class StubServer:
    """Records requests; heartbeats are answered from ``replies`` (then a default reply)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.replies: list[dict] = []
        self.callback_statuses: list[int] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                with stub.lock:
                    stub.requests.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": body,
                            "client": self.client_address,
                        }
                    )
                    if self.path.endswith("/heartbeat"):
                        status = 200
                        reply = stub.replies.pop(0) if stub.replies else stub.default_reply()
                    else:
                        status = stub.callback_statuses.pop(0) if stub.callback_statuses else 202
                        reply = {"message": "accepted"} if status == 202 else {"error": "boom"}
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @staticmethod
    def default_reply(**overrides) -> dict:
        return {
            "id": 7,
            "truncate": False,
            "tasks": [],
            "pull_frequency": "5s",
            "stop_indexing": False,
            **overrides,
        }

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def of_kind(self, kind: str) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["path"].endswith(f"/{kind}")]

    def heartbeats(self) -> list[dict]:
        return self.of_kind("heartbeat")

    def callbacks(self) -> list[dict]:
        return self.of_kind("callback")


@pytest.fixture
def stub():
    server = StubServer()
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


@pytest.fixture
def make_node(stub, tmp_path):
    nodes: list[FakeNode] = []

    def make(**overrides) -> FakeNode:
        options = {"base_url": stub.url, "secret": SECRET, "state_dir": tmp_path, "seed": 1}
        options.update(overrides)
        node = FakeNode(FakeNodeConfig(**options))
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.stop()


def index_task(task_id: int, repo_id: int, **extra) -> dict:
    return {
        "name": "index",
        "payload": {
            "Callback": {"name": "index", "payload": {"task_id": task_id, "schema_version": 2531}},
            "RepoId": repo_id,
            "FileSizeLimit": 1048576,
            "Parallelism": 1,
            "Timeout": "1800s",
            "FileCountLimit": 500000,
            "TrigramMax": 20000,
            "MissingRepo": False,
            "Metadata": {"project_id": str(repo_id)},
            **extra,
        },
    }


def delete_task(task_id: int, repo_id: int) -> dict:
    return {
        "name": "delete",
        "payload": {
            "RepoId": repo_id,
            "Callback": {
                "name": "delete",
                "payload": {"task_id": task_id, "service_type": "zoekt"},
            },
        },
    }


def reply(*tasks: dict, **overrides) -> dict:
    return StubServer.default_reply(tasks=list(tasks), **overrides)


def callback_task_ids(stub) -> list[int]:
    return [r["body"]["payload"]["task_id"] for r in stub.callbacks()]


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
        cwd=Path(__file__).resolve().parent.parent,
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
        cwd=Path(__file__).resolve().parent.parent,
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
