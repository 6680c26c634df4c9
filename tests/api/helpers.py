"""Helpers for the node-protocol tests: a signed client, request bodies, task builders
and a snapshot of the fleet tables for "nothing changed" assertions."""

from __future__ import annotations

import json
from datetime import datetime
from urllib.parse import urlencode

from django.conf import settings as django_settings
from django.db import connection
from django.test import Client

from api.authentication import encode_node_token
from tests.factories import ProjectFactory, RepositoryFactory
from zoekt import app_settings, clock
from zoekt.models import Index, Node, Project, Repository, Task
from zoekt.scheduling.task_creation import BEING_QUEUED, queue_for_admission

GIB = 1024**3
HOST = "127.0.0.1"
FORM = "application/x-www-form-urlencoded"

HEARTBEAT_REPLY_KEYS = {"id", "truncate", "tasks", "pull_frequency", "stop_indexing"}
ERROR_KEYS = {"error", "errors"}


def heartbeat_url(node_uuid) -> str:
    return f"/api/v4/internal/search/zoekt/{node_uuid}/heartbeat"


def callback_url(node_uuid) -> str:
    return f"/api/v4/internal/search/zoekt/{node_uuid}/callback"


def heartbeat_body(extra: dict | None = None, *, without: tuple[str, ...] = ()) -> dict:
    """The four required heartbeat keys (a node 10 % full), plus ``extra``, minus ``without``."""
    body = {
        "node.url": "http://zoekt-0:6065",
        "node.name": "zoekt-0",
        "disk.all": 100 * GIB,
        "disk.used": 10 * GIB,
    }
    body.update(extra or {})
    for key in without:
        body.pop(key)
    return body


# GitLab's ``process_metrics`` keys, for the indexer and the webserver alike (all integers);
# the webserver adds ``shards_loaded`` and this project's ``memory_limit_bytes``.
PROCESS_METRICS_KEYS = frozenset(
    {
        "mmap_current",
        "mmap_max",
        "restarts_1m",
        "restarts_5m",
        "restarts_15m",
        "rss_bytes",
        "uptime_seconds",
    }
)
WEBSERVER_ONLY_KEYS = frozenset({"shards_loaded", "memory_limit_bytes"})


def process_metrics(**changes) -> dict:
    """A healthy process's ``process_metrics`` block, every GitLab key, with ``changes``."""
    return {
        "mmap_current": 10,
        "mmap_max": 1000,
        "restarts_1m": 0,
        "restarts_5m": 0,
        "restarts_15m": 0,
        "rss_bytes": 1024,
        "uptime_seconds": 60,
        **changes,
    }


def form_encoded(body: dict) -> str:
    """A form body: nested objects become JSON strings, lists repeat their key."""
    flat = {
        key: json.dumps(value) if isinstance(value, dict) else value for key, value in body.items()
    }
    return urlencode(flat, doseq=True)


class NodeAPI:
    """Sends node requests signed as a node signs them (the first configured secret)."""

    def __init__(self, client: Client):
        self.client = client

    @staticmethod
    def token() -> str:
        return encode_node_token(django_settings.GITLAB_SHELL_SECRETS[0])

    def post(
        self,
        url: str,
        body,
        *,
        form: bool = False,
        token: str | None = None,
        raw=None,
        content_type: str = "application/json",
    ):
        """POST ``body`` as JSON (or form-encoded), or ``raw`` as it is; ``token=""`` sends none."""
        headers = {} if token == "" else {"Gitlab-Shell-Api-Request": token or self.token()}
        if raw is not None:
            data = raw
        elif form:
            data, content_type = form_encoded(body), FORM
        else:
            data, content_type = json.dumps(body), "application/json"
        return self.client.post(url, data=data, content_type=content_type, headers=headers)

    def heartbeat(self, node_uuid, body: dict | None = None, **kwargs):
        body = heartbeat_body() if body is None else body
        return self.post(heartbeat_url(node_uuid), body, **kwargs)

    def callback(self, node_uuid, body: dict, **kwargs):
        return self.post(callback_url(node_uuid), body, **kwargs)


set_app_setting = app_settings.update


def make_repository(index: Index, *, project: Project | None = None, **kwargs) -> Repository:
    project = project or ProjectFactory(repository_size=kwargs.pop("repository_size", 4096))
    return RepositoryFactory(zoekt_index=index, project=project, **kwargs)


def make_task(
    repository: Repository,
    *,
    task_type: int = Task.TaskType.INDEX_REPO,
    state: int = Task.State.PENDING,
    perform_at: datetime | None = None,
    retries_left: int = Task.MODEL_DEFAULT_RETRIES_LEFT,
) -> Task:
    """A task of the repository's node, as bulk task creation makes it."""
    fields = {
        "zoekt_node_id": repository.zoekt_index.zoekt_node_id,
        "zoekt_repository_id": repository.id,
        "project_identifier": repository.project_identifier,
        "task_type": task_type,
        "state": state,
        "retries_left": retries_left,
        "priority": BEING_QUEUED,
    }
    fields["perform_at"] = perform_at if perform_at is not None else clock.now()
    task = Task.objects.create(**fields)
    queue_for_admission([task.id])
    task.refresh_from_db()
    return task


def make_index_task(index: Index, **kwargs) -> Task:
    repo_kwargs = {
        k: kwargs.pop(k) for k in ("project", "repository_size", "indexed_at") if k in kwargs
    }
    return make_task(make_repository(index, **repo_kwargs), **kwargs)


def table_counts() -> dict[str, int]:
    counts = {}
    with connection.cursor() as cursor:
        for table in ("zoekt_nodes", "zoekt_tasks", "zoekt_repositories"):
            cursor.execute(f"SELECT count(*) FROM {table}")
            counts[table] = cursor.fetchone()[0]
    return counts


def db_snapshot() -> dict:
    """Row counts and every row of the node, task, repository and index tables."""
    return {
        "counts": table_counts(),
        "nodes": list(Node.objects.order_by("id").values()),
        "tasks": list(Task.objects.order_by("id").values()),
        "repositories": list(Repository.objects.order_by("id").values()),
        "indices": list(Index.objects.order_by("id").values()),
    }
