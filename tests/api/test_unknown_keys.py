"""Keys the node API does not declare are ignored, counted in /metrics and logged once.

GitLab's API ignores undeclared parameters, so a node newer than the control
plane, or a body from GitLab's own request specs (which carry ``uuid``), keeps
heartbeating and calling back. Unknown keys are dropped at every level (the
top of the body, ``process_health`` and its ``indexer``/``webserver`` blocks,
the callback's ``additional_payload`` and ``repo_stats``); the keys that are
declared are still validated.
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from tests.api.helpers import (
    GIB,
    db_snapshot,
    heartbeat_body,
    make_repository,
    make_task,
    process_metrics,
)
from zoekt import clock, nodeapimetrics
from zoekt.models import Node, Repository, Task

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("prometheus_on_loopback")]

COUNTER = "zoekt_control_node_api_unknown_keys_total"


@pytest.fixture(autouse=True)
def _forget_unknown_keys():
    nodeapimetrics.reset()
    yield
    nodeapimetrics.reset()


def counted(client) -> dict[tuple[str, str], float]:
    """The unknown-key counter of a /metrics scrape, by (endpoint, key)."""
    response = client.get(reverse("metrics"))
    assert response.status_code == 200
    out = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            if sample.name == COUNTER:
                out[(sample.labels["endpoint"], sample.labels["key"])] = sample.value
    return out


def unknown_key_logs(caplog) -> list[dict]:
    return [
        record.msg
        for record in caplog.records
        if isinstance(record.msg, dict) and record.msg.get("event") == "node_api_unknown_key"
    ]


def stored(node: Node) -> Node:
    node.refresh_from_db()
    return node


# --- heartbeat ------------------------------------------------------------------------------

UNKNOWN_HEARTBEAT_KEYS = [
    pytest.param({"node.urll": "http://zoekt-0:6065"}, ["node.urll"], id="top-level-typo"),
    pytest.param({"node.gpu_count": 2}, ["node.gpu_count"], id="newer-node-key"),
    pytest.param({"disk": {"all": 1, "used": 0}}, ["disk"], id="nested-disk-object"),
    pytest.param(
        {"process_health": {"indexer": process_metrics(), "gpu": {"busy": 1}}},
        ["process_health.gpu"],
        id="process_health-block",
    ),
    pytest.param(
        {"process_health": {"indexer": process_metrics(restarts=3, uptime="86400s")}},
        ["process_health.indexer.restarts", "process_health.indexer.uptime"],
        id="indexer-restarts-and-uptime",
    ),
    pytest.param(
        {"process_health": {"webserver": process_metrics(restarts=0, uptime=12, threads=8)}},
        [
            "process_health.webserver.restarts",
            "process_health.webserver.threads",
            "process_health.webserver.uptime",
        ],
        id="webserver-block",
    ),
    pytest.param(
        {"process_health": {"indexer": {"shards_loaded": 1, "restart_count": 0}}},
        ["process_health.indexer.restart_count", "process_health.indexer.shards_loaded"],
        id="webserver-only-and-old-keys-in-indexer",
    ),
]


@pytest.mark.parametrize("form", [False, True], ids=["json", "form"])
@pytest.mark.parametrize(("extra", "unknown"), UNKNOWN_HEARTBEAT_KEYS)
def test_a_heartbeat_with_unknown_keys_is_accepted_and_stores_the_known_ones(
    node_api, node, client, now, extra, unknown, form
):
    clock.advance(60)
    body = heartbeat_body({"disk.indexed": 3 * GIB, **extra})

    response = node_api.heartbeat(node.uuid, body, form=form)

    assert response.status_code == 200, response.content
    node = stored(node)
    assert (node.total_bytes, node.used_bytes, node.indexed_bytes) == (100 * GIB, 10 * GIB, 3 * GIB)
    assert node.last_seen_at == clock.now()
    known_health = {
        process: {k: v for k, v in block.items() if f"process_health.{process}.{k}" not in unknown}
        for process, block in extra.get("process_health", {}).items()
        if f"process_health.{process}" not in unknown
    }
    if "process_health" in extra:
        assert node.metadata["process_health"] == known_health
    else:
        assert "process_health" not in node.metadata
    assert counted(client) == {("heartbeat", key): 1 for key in unknown}


def test_a_node_that_heartbeats_with_an_unknown_key_is_not_reaped_and_truncated(
    node_api, client, now
):
    """A first heartbeat registers the node; the next ones keep it online and untruncated."""
    body = heartbeat_body({"process_health": {"indexer": {"restarts": 0, "uptime": 5}}})
    node_uuid = "7c9e6679-7425-40de-944b-e07fc1f90ae7"

    first = node_api.heartbeat(node_uuid, body)
    clock.advance(5)
    second = node_api.heartbeat(node_uuid, body)

    assert (first.status_code, second.status_code) == (200, 200)
    assert (first.json()["truncate"], second.json()["truncate"]) == (True, False)
    assert Node.objects.get(uuid=node_uuid).last_seen_at == clock.now()
    assert counted(client) == {
        ("heartbeat", "process_health.indexer.restarts"): 2,
        ("heartbeat", "process_health.indexer.uptime"): 2,
    }


def test_gitlabs_spec_body_with_the_uuid_in_it_is_accepted_and_uuid_is_not_counted(
    node_api, node, client, now
):
    body = heartbeat_body({"uuid": str(node.uuid), "node.services": ["zoekt"]})

    response = node_api.heartbeat(node.uuid, body)

    assert response.status_code == 200, response.content
    assert counted(client) == {}


def test_a_uuid_in_the_body_never_overrides_the_one_in_the_path(node_api, node, now):
    other = "9b2f6a3e-0c1d-4e5f-8a7b-6c5d4e3f2a1b"

    response = node_api.heartbeat(node.uuid, heartbeat_body({"uuid": other}))

    assert response.status_code == 200
    assert response.json()["id"] == node.id
    assert not Node.objects.filter(uuid=other).exists()


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        pytest.param({"node.extra": 1, "disk.all": "lots"}, "disk.all", id="top-level"),
        pytest.param(
            {"process_health": {"indexer": {"restarts": 1, "rss_bytes": -1}}},
            "process_health.indexer.rss_bytes",
            id="indexer-block",
        ),
        pytest.param(
            {"process_health": {"webserver": {"uptime": 1, "shards_loaded": "many"}}},
            "process_health.webserver.shards_loaded",
            id="webserver-block",
        ),
    ],
)
def test_the_known_keys_beside_unknown_ones_are_still_validated(node_api, node, now, extra, field):
    clock.advance(60)
    before = db_snapshot()

    response = node_api.heartbeat(node.uuid, heartbeat_body(extra))

    assert response.status_code == 400
    assert set(response.json()["errors"]) == {field}
    assert db_snapshot() == before


def test_an_unknown_key_costs_the_heartbeat_no_extra_query(node_api, node, now):
    plain = heartbeat_body()
    extra = heartbeat_body(
        {"node.future": 1, "process_health": {"indexer": {"restarts": 1, "uptime": 2}}}
    )
    node_api.heartbeat(node.uuid, plain)

    with CaptureQueriesContext(connection) as without_unknown:
        clock.advance(5)
        assert node_api.heartbeat(node.uuid, plain).status_code == 200
    with CaptureQueriesContext(connection) as with_unknown:
        clock.advance(5)
        assert node_api.heartbeat(node.uuid, extra).status_code == 200

    assert len(with_unknown) == len(without_unknown)


# --- the log, once per node and key ---------------------------------------------------------


def test_an_unknown_key_is_logged_once_per_node_and_key(node_api, node, caplog, now):
    caplog.set_level(logging.INFO)
    other = "0f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
    body = heartbeat_body({"node.future": 1, "process_health": {"indexer": {"uptime": 2}}})

    for _ in range(3):
        node_api.heartbeat(node.uuid, body)
        node_api.heartbeat(other, body)

    logged = sorted((r["node_uuid"], r["endpoint"], r["key"]) for r in unknown_key_logs(caplog))
    assert logged == sorted(
        (node_uuid, "heartbeat", key)
        for node_uuid in (str(node.uuid), other)
        for key in ("node.future", "process_health.indexer.uptime")
    )


def test_the_set_of_logged_keys_is_bounded(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(nodeapimetrics, "LOGGED_MAX", 3)

    for i in range(10):
        nodeapimetrics.note_unknown_keys("heartbeat", "node-a", [f"key{i}"])

    assert len(nodeapimetrics._logged) == 3
    assert len(unknown_key_logs(caplog)) == 10
    # The most recent pairs are remembered, so they are not logged again.
    nodeapimetrics.note_unknown_keys("heartbeat", "node-a", ["key9"])
    assert len(unknown_key_logs(caplog)) == 10


def test_the_counted_keys_are_bounded_and_the_rest_count_as_other(monkeypatch, client):
    monkeypatch.setattr(nodeapimetrics, "MAX_SERIES", 2)

    nodeapimetrics.note_unknown_keys("heartbeat", "node-a", ["a", "b"])
    nodeapimetrics.note_unknown_keys("heartbeat", "node-a", ["a", "c", "d"])
    nodeapimetrics.note_unknown_keys("callback", "node-a", ["x" * 1000])

    assert counted(client) == {
        ("heartbeat", "a"): 2,
        ("heartbeat", "b"): 1,
        ("heartbeat", nodeapimetrics.OTHER): 2,
        ("callback", nodeapimetrics.OTHER): 1,
    }


def test_a_long_key_is_cut_in_the_label(client):
    nodeapimetrics.note_unknown_keys("callback", "node-a", ["k" * 1000])

    (label,) = [key for _, key in counted(client)]
    assert label == "k" * nodeapimetrics.MAX_KEY_LENGTH


def test_without_redis_an_unknown_key_still_does_not_fail_the_heartbeat(
    node_api, node, monkeypatch, now
):
    import redis

    def unreachable():
        raise redis.ConnectionError("Redis is down")

    with monkeypatch.context() as patch:
        patch.setattr(nodeapimetrics, "_redis", unreachable)
        response = node_api.heartbeat(node.uuid, heartbeat_body({"node.future": 1}))

    assert response.status_code == 200


# --- callback -------------------------------------------------------------------------------


@pytest.fixture
def processing(index):
    repository = make_repository(index, state=Repository.State.INITIALIZING)
    return repository, make_task(repository, state=Task.State.PROCESSING)


@pytest.mark.parametrize("form", [False, True], ids=["json", "form"])
def test_a_callback_with_unknown_keys_is_applied_and_they_are_counted(
    node_api, node, processing, client, form
):
    repository, task = processing
    body = {
        "uuid": str(node.uuid),
        "name": "index",
        "success": True,
        "duration_seconds": 12,
        "payload": {"task_id": task.id, "schema_version": 1, "trace_id": "abc"},
        "additional_payload": {
            "repo_stats": {"size_in_bytes": 77, "index_file_count": 2, "shards": 1},
            "timings": {"clone": 1},
        },
    }

    response = node_api.callback(node.uuid, body, form=form)

    assert response.status_code == 202, response.content
    assert response.json()["action"] == "done"
    repository.refresh_from_db()
    assert (repository.state, repository.size_bytes) == (Repository.State.READY, 77)
    # ``payload`` is free JSON (the task's own Callback payload echoed back): nothing in it
    # is unknown; ``uuid`` is GitLab's route parameter.
    assert counted(client) == {
        ("callback", "duration_seconds"): 1,
        ("callback", "additional_payload.repo_stats.shards"): 1,
        ("callback", "additional_payload.timings"): 1,
    }


def test_the_known_callback_keys_beside_unknown_ones_are_still_validated(
    node_api, node, processing
):
    _, task = processing
    before = db_snapshot()
    body = {"name": "index", "success": "maybe", "later": 1, "payload": {"task_id": task.id}}

    response = node_api.callback(node.uuid, body)

    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"success"}
    assert db_snapshot() == before
