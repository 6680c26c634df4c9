"""A stub control plane for the fake node's tests: it answers heartbeats from a script and
records every request, so each test states exactly what the server said and checks
exactly what the node sent."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
