"""The heartbeat: a node reports itself and receives its tasks (reference 3.2, 1.1).

``POST /api/v4/internal/search/zoekt/<uuid>/heartbeat`` registers the node
the first time (``truncate: true``), then rewrites its row at most every 5 s,
and answers with exactly ``id``, ``truncate``, ``tasks``, ``pull_frequency``
and ``stop_indexing``.
"""

from __future__ import annotations

import importlib.util
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from api.serializers import HeartbeatSerializer
from api.views import HEARTBEAT_EXAMPLE
from tests.api.helpers import (
    ERROR_KEYS,
    GIB,
    HEARTBEAT_REPLY_KEYS,
    PROCESS_METRICS_KEYS,
    WEBSERVER_ONLY_KEYS,
    heartbeat_body,
    make_index_task,
    set_app_setting,
    table_counts,
)
from zoekt import clock
from zoekt.models import Node, Task

pytestmark = pytest.mark.django_db

NODE_UUID = uuid.UUID("0b6d4c52-6d7e-4a53-9a55-4a8f4c6c9e01")

FULL_BODY = {
    "node.url": "http://zoekt-7:6065",
    "node.search_url": "http://zoekt-7:6070",
    "node.name": "zoekt-7",
    "node.version": "v1.16.2",
    "node.schema_version": 2531,
    "node.knowledge_graph_schema_version": 3,
    "node.concurrency": 8,
    "node.task_count": 2,
    "node.services": ["zoekt"],
    "disk.all": 100 * GIB,
    "disk.used": 30 * GIB,
    "disk.indexed": 20 * GIB,
    "process_health": {
        "indexer": {
            "mmap_current": 300,
            "mmap_max": 262144,
            "restarts_1m": 0,
            "restarts_5m": 0,
            "restarts_15m": 0,
            "rss_bytes": 512,
            "uptime_seconds": 86400,
        },
        "webserver": {
            "mmap_current": 12000,
            "mmap_max": 262144,
            "restarts_1m": 0,
            "restarts_5m": 1,
            "restarts_15m": 1,
            "rss_bytes": 8192,
            "uptime_seconds": 3600,
            "shards_loaded": 420,
            "memory_limit_bytes": 16 * GIB,
        },
    },
}


def stored_node() -> Node:
    return Node.objects.get(uuid=NODE_UUID)


def beat(node_api, extra: dict | None = None, **kwargs):
    """A heartbeat of NODE_UUID with the required keys plus ``extra``; asserts a 200."""
    response = node_api.heartbeat(NODE_UUID, heartbeat_body(extra), **kwargs)
    assert response.status_code == 200, response.content
    assert set(response.json()) == HEARTBEAT_REPLY_KEYS
    return response.json()


def set_metadata(**values) -> None:
    """What an operator does in the admin: change keys of the stored metadata."""
    node = stored_node()
    Node.objects.filter(pk=node.pk).update(metadata={**node.metadata, **values})


# --- registration ----------------------------------------------------------------------------


def test_the_first_heartbeat_registers_the_node_and_asks_it_to_truncate(node_api, now):
    reply = beat(node_api)

    node = stored_node()
    assert reply == {
        "id": node.id,
        "truncate": True,
        "tasks": [],
        "pull_frequency": "5s",
        "stop_indexing": False,
    }
    assert node.index_base_url == "http://zoekt-0:6065"
    assert node.total_bytes == 100 * GIB
    assert node.used_bytes == 10 * GIB
    assert node.indexed_bytes == 0
    assert node.usable_storage_bytes == 90 * GIB
    assert node.schema_version == 0
    assert node.services == [Node.Service.ZOEKT]
    assert node.metadata == {"name": "zoekt-0"}
    assert node.webserver_last_seen_at is None
    assert node.last_seen_at == now
    assert node.created_at == now
    assert node.updated_at == now


def test_a_later_heartbeat_does_not_ask_the_node_to_truncate(node_api, now):
    first = beat(node_api)
    clock.advance(10)

    second = beat(node_api)

    assert second["truncate"] is False
    assert second["id"] == first["id"]
    assert Node.objects.count() == 1


def test_a_node_already_in_the_table_is_not_asked_to_truncate(node_api, node):
    response = node_api.heartbeat(node.uuid)

    assert response.status_code == 200
    assert response.json()["truncate"] is False
    assert response.json()["id"] == node.id


@pytest.mark.parametrize("form", [False, True], ids=["json-body", "form-encoded-body"])
def test_json_and_form_encoded_heartbeats_are_stored_alike(node_api, now, form):
    reply = beat(node_api, FULL_BODY, form=form)

    node = stored_node()
    assert reply["id"] == node.id and reply["truncate"] is True
    assert node.index_base_url == "http://zoekt-7:6065"
    assert node.search_base_url == "http://zoekt-7:6070"
    assert (node.total_bytes, node.used_bytes, node.indexed_bytes) == (
        100 * GIB,
        30 * GIB,
        20 * GIB,
    )
    assert node.usable_storage_bytes == 90 * GIB
    assert node.schema_version == 2531
    assert node.services == [0]
    assert node.metadata == {
        "name": "zoekt-7",
        "version": "v1.16.2",
        "concurrency": 8,
        "task_count": 2,
        "process_health": FULL_BODY["process_health"],
    }
    assert node.webserver_last_seen_at == now


@pytest.mark.parametrize("missing", ["node.url", "node.name", "disk.all", "disk.used"])
@pytest.mark.parametrize("form", [False, True], ids=["json", "form"])
def test_a_heartbeat_without_a_required_field_is_refused_naming_it(node_api, now, missing, form):
    response = node_api.heartbeat(NODE_UUID, heartbeat_body(without=(missing,)), form=form)

    assert response.status_code == 400
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert body["errors"] == {missing: ["This field is required."]}
    assert body["error"] == f"{missing}: This field is required."
    assert table_counts()["zoekt_nodes"] == 0


def test_the_search_url_falls_back_to_the_node_url(node_api, now):
    beat(node_api)

    assert stored_node().search_base_url == "http://zoekt-0:6065"


def test_a_later_search_url_replaces_the_fallback(node_api, now):
    beat(node_api)
    clock.advance(5)

    beat(node_api, {"node.search_url": "http://zoekt-0:6070"})

    assert stored_node().search_base_url == "http://zoekt-0:6070"


# --- metadata -----------------------------------------------------------------------------


def test_metadata_keys_are_merged_and_an_operator_override_survives(node_api, now):
    beat(node_api, {"node.concurrency": 4, "node.version": "v1", "node.task_count": 1})
    set_metadata(concurrency_override=2)
    clock.advance(5)

    beat(node_api, {"node.name": "renamed", "node.concurrency": 6, "node.task_count": 0})

    assert stored_node().metadata == {
        "name": "renamed",
        "concurrency": 6,
        "task_count": 0,
        "version": "v1",
        "concurrency_override": 2,
    }


def test_process_health_is_stored_whole_with_integer_counters(node_api, now):
    beat(node_api, {"process_health": FULL_BODY["process_health"]})

    stored = stored_node().metadata["process_health"]
    assert stored == FULL_BODY["process_health"]
    for process in stored.values():
        assert all(type(value) is int for value in process.values()), process


def test_a_heartbeat_with_a_webserver_block_stamps_webserver_last_seen_at(node_api, now):
    beat(node_api, {"process_health": {"webserver": {"shards_loaded": 3}}})
    assert stored_node().webserver_last_seen_at == now

    later = clock.advance(5)
    beat(node_api, {"process_health": {"webserver": {"restarts_15m": 0}}})

    node = stored_node()
    assert node.webserver_last_seen_at == later
    assert "webserver_last_seen_at" not in node.metadata


def test_a_heartbeat_without_a_webserver_block_keeps_webserver_last_seen_at(node_api, now):
    indexer_only = {"indexer": {"rss_bytes": 100, "uptime_seconds": 5}}
    beat(node_api, {"process_health": indexer_only})
    assert stored_node().metadata["process_health"] == indexer_only
    assert stored_node().webserver_last_seen_at is None

    seen_at = clock.advance(5)
    beat(node_api, {"process_health": {"webserver": {"shards_loaded": 3}}})
    assert stored_node().webserver_last_seen_at == seen_at

    clock.advance(5)
    beat(node_api, {"process_health": indexer_only})
    node = stored_node()
    assert node.metadata["process_health"] == indexer_only
    assert node.webserver_last_seen_at == seen_at
    assert node.last_seen_at == seen_at + timedelta(seconds=5)

    clock.advance(5)
    beat(node_api)
    node = stored_node()
    assert node.webserver_last_seen_at == seen_at
    assert node.last_seen_at == seen_at + timedelta(seconds=10)
    assert "webserver_last_seen_at" not in node.metadata


def test_a_debounced_heartbeat_does_not_stamp_webserver_last_seen_at(node_api, now):
    beat(node_api, {"process_health": {"indexer": {"restarts_15m": 0}}})
    clock.advance(4.999)

    beat(node_api, {"process_health": {"webserver": {"shards_loaded": 3}}})

    node = stored_node()
    assert node.webserver_last_seen_at is None
    assert node.metadata["process_health"] == {"indexer": {"restarts_15m": 0}}

    seen_at = clock.advance(0.001)
    beat(node_api, {"process_health": {"webserver": {"shards_loaded": 3}}})
    assert stored_node().webserver_last_seen_at == seen_at

    clock.advance(1)
    beat(node_api, {"process_health": {"webserver": {"shards_loaded": 4}}})
    node = stored_node()
    assert node.webserver_last_seen_at == seen_at
    assert node.metadata["process_health"] == {"webserver": {"shards_loaded": 3}}


def test_a_heartbeat_without_process_health_keeps_the_stored_one(node_api, now):
    beat(node_api, {"process_health": {"indexer": {"restarts_15m": 2}}})
    clock.advance(5)

    beat(node_api)

    assert stored_node().metadata["process_health"] == {"indexer": {"restarts_15m": 2}}


@pytest.mark.parametrize("form", [False, True], ids=["json", "form"])
def test_disk_free_is_accepted_and_ignored(node_api, now, form):
    """Older GitLab required ``disk.free``, so older indexers still send it."""
    beat(node_api, {"disk.indexed": 5 * GIB, "disk.free": 1 * GIB}, form=form)

    node = stored_node()
    assert (node.total_bytes, node.used_bytes, node.indexed_bytes) == (100 * GIB, 10 * GIB, 5 * GIB)
    assert node.usable_storage_bytes == 90 * GIB + 5 * GIB
    assert node.metadata == {"name": "zoekt-0"}


def test_the_documented_example_and_the_bench_body_are_valid_gitlab_heartbeats():
    spec = importlib.util.spec_from_file_location(
        "bench_heartbeat", Path(__file__).resolve().parents[2] / "bench" / "heartbeat.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for body in (HEARTBEAT_EXAMPLE, bench.node_body(0), bench.node_body(77)):
        serializer = HeartbeatSerializer(data=body)
        assert serializer.is_valid(), serializer.errors
        health = body["process_health"]
        assert set(health["indexer"]) == PROCESS_METRICS_KEYS
        assert set(health["webserver"]) >= PROCESS_METRICS_KEYS
        assert set(health["webserver"]) <= PROCESS_METRICS_KEYS | WEBSERVER_ONLY_KEYS
        for process in health.values():
            assert all(type(value) is int for value in process.values()), process


# --- services, indexed bytes, schema version --------------------------------------------------


@pytest.mark.parametrize(
    ("services", "stored"),
    [
        pytest.param(["zoekt"], [0], id="zoekt-is-0"),
        pytest.param(["zoekt", "knowledge_graph"], [0], id="unknown-names-dropped"),
        pytest.param(["ZOEKT", "zoekt"], [0], id="names-match-exactly-ZOEKT-dropped"),
    ],
)
def test_services_are_mapped_to_their_numbers(node_api, now, services, stored):
    beat(node_api, {"node.services": services})

    assert stored_node().services == stored


def test_services_not_sent_are_left_alone(node_api, now):
    beat(node_api, {"node.services": ["zoekt"]})
    clock.advance(5)

    beat(node_api)

    assert stored_node().services == [0]


@pytest.mark.parametrize(
    "services",
    [["knowledge_graph"], [], ["ZOEKT"], ["Zoekt", "ZOEKT"]],
    ids=["only-unknown", "empty", "upper-case-ZOEKT", "other-spellings"],
)
def test_a_service_list_with_no_known_service_is_refused(node_api, now, services):
    response = node_api.heartbeat(NODE_UUID, heartbeat_body({"node.services": services}))

    # GitLab's node validation fails: 422, as GitLab answers a node it cannot save.
    assert response.status_code == 422
    assert response.json()["errors"] == {
        "node.services": ["Must name at least one known service (zoekt)."]
    }
    assert table_counts()["zoekt_nodes"] == 0


def test_indexed_bytes_and_schema_version_change_only_when_sent(node_api, now):
    beat(node_api, {"disk.indexed": 5 * GIB, "node.schema_version": 2531})
    clock.advance(5)

    beat(node_api)

    node = stored_node()
    assert node.indexed_bytes == 5 * GIB
    assert node.schema_version == 2531


# --- usable storage ---------------------------------------------------------------------------


def test_usable_storage_is_free_plus_indexed_bytes_on_every_save(node_api, now):
    beat(node_api, {"disk.indexed": 5 * GIB})
    clock.advance(5)

    beat(node_api, {"disk.used": 40 * GIB})

    assert stored_node().usable_storage_bytes == 60 * GIB + 5 * GIB


def test_usable_storage_is_not_recomputed_while_locked(node_api, now):
    beat(node_api)
    locked_until = now + timedelta(hours=1)
    Node.objects.filter(uuid=NODE_UUID).update(
        usable_storage_bytes=7, usable_storage_bytes_locked_until=locked_until
    )
    clock.advance(5)

    beat(node_api, {"disk.used": 50 * GIB})

    node = stored_node()
    assert node.used_bytes == 50 * GIB
    assert node.usable_storage_bytes == 7
    assert node.usable_storage_bytes_locked_until == locked_until


def test_usable_storage_is_recomputed_and_unlocked_once_the_lock_expired(node_api, now):
    beat(node_api)
    Node.objects.filter(uuid=NODE_UUID).update(
        usable_storage_bytes=7, usable_storage_bytes_locked_until=now + timedelta(seconds=3)
    )
    clock.advance(5)

    beat(node_api, {"disk.used": 50 * GIB})

    node = stored_node()
    assert node.usable_storage_bytes == 50 * GIB
    assert node.usable_storage_bytes_locked_until is None


# --- the 5 s debounce -------------------------------------------------------------------------


def test_a_heartbeat_within_5_s_of_the_last_save_writes_nothing(node_api, now):
    beat(node_api)
    before = Node.objects.filter(uuid=NODE_UUID).values().get()
    clock.advance(4.999)

    reply = beat(node_api, {"disk.used": 50 * GIB, "node.name": "other", "disk.indexed": 1})

    assert reply["truncate"] is False
    assert Node.objects.filter(uuid=NODE_UUID).values().get() == before


def test_a_heartbeat_5_s_after_the_last_save_is_written(node_api, now):
    beat(node_api)
    later = clock.advance(5)

    beat(node_api, {"disk.used": 50 * GIB})

    node = stored_node()
    assert node.updated_at == later
    assert node.last_seen_at == later
    assert node.used_bytes == 50 * GIB


def test_a_debounced_heartbeat_still_reports_what_the_node_sent(node_api, now):
    """The reply reflects the request even when the row is not rewritten (GitLab keeps
    the unsaved attributes on the node object)."""
    beat(node_api)
    clock.advance(1)

    reply = beat(node_api, {"disk.used": 90 * GIB})

    assert reply["stop_indexing"] is True
    assert stored_node().used_bytes == 10 * GIB


# --- stop_indexing --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "stop"),
    [
        pytest.param(8_499, False, id="84.99-percent-keeps-indexing"),
        pytest.param(8_500, True, id="85-percent-stops"),
        pytest.param(10_000, True, id="full-disk-stops"),
        pytest.param(0, False, id="empty-disk-keeps-indexing"),
    ],
)
def test_stop_indexing_at_the_critical_watermark(node_api, now, used, stop):
    reply = beat(node_api, {"disk.all": 10_000, "disk.used": used})

    assert reply["stop_indexing"] is stop


def test_stop_indexing_and_no_tasks_while_indexing_is_paused(node_api, node, index):
    task = make_index_task(index)
    set_app_setting(zoekt_indexing_paused=True)

    response = node_api.heartbeat(node.uuid)

    assert response.status_code == 200
    assert response.json()["stop_indexing"] is True
    assert response.json()["tasks"] == []
    task.refresh_from_db()
    assert task.state == Task.State.PENDING


def test_tasks_are_handed_out_again_once_indexing_resumes(node_api, node, index):
    task = make_index_task(index)
    set_app_setting(zoekt_indexing_paused=True)
    node_api.heartbeat(node.uuid)
    set_app_setting(zoekt_indexing_paused=False)

    response = node_api.heartbeat(node.uuid)

    assert response.json()["stop_indexing"] is False
    assert [t["payload"]["Callback"]["payload"]["task_id"] for t in response.json()["tasks"]] == [
        task.id
    ]


# --- pull frequency and concurrency limit ---------------------------------------------------


def concurrency(value: int) -> dict:
    return {"node.concurrency": value}


def test_pull_frequency_is_5s_with_fewer_pending_tasks_than_the_limit(node_api, node, index):
    for _ in range(3):
        make_index_task(index)

    reply = node_api.heartbeat(node.uuid, heartbeat_body(concurrency(2))).json()

    # Two are handed out (now processing); one pending task is left, below the limit of 2.
    assert len(reply["tasks"]) == 2
    assert reply["pull_frequency"] == "5s"


def test_pull_frequency_is_500ms_while_pending_tasks_reach_the_limit(node_api, node, index):
    for _ in range(4):
        make_index_task(index)

    reply = node_api.heartbeat(node.uuid, heartbeat_body(concurrency(2))).json()

    assert len(reply["tasks"]) == 2
    assert reply["pull_frequency"] == "500ms"


def test_pull_frequency_counts_pending_tasks_scheduled_for_later(node_api, node, index, now):
    for _ in range(2):
        make_index_task(index, perform_at=now + timedelta(hours=1))

    reply = node_api.heartbeat(node.uuid, heartbeat_body(concurrency(2))).json()

    assert reply["tasks"] == []
    assert reply["pull_frequency"] == "500ms"


def handed_out(node_api, node, extra: dict | None = None) -> int:
    response = node_api.heartbeat(node.uuid, heartbeat_body(extra))
    assert response.status_code == 200
    return len(response.json()["tasks"])


@pytest.mark.parametrize(
    ("node_concurrency", "ratio", "limit"),
    [
        pytest.param(3, 1.0, 3, id="concurrency-3-ratio-1"),
        pytest.param(3, 2.0, 6, id="concurrency-3-ratio-2"),
        pytest.param(5, 0.5, 3, id="2.5-rounds-half-up"),
        pytest.param(0, 1.0, 20, id="zero-falls-back-to-20"),
    ],
)
def test_the_number_of_tasks_handed_out_is_concurrency_times_the_ratio(
    node_api, node, index, node_concurrency, ratio, limit
):
    set_app_setting(zoekt_cpu_to_tasks_ratio=ratio)
    for _ in range(limit + 2):
        make_index_task(index)

    assert handed_out(node_api, node, concurrency(node_concurrency)) == limit


def test_the_limit_is_capped_at_200(node_api, node, index):
    set_app_setting(zoekt_cpu_to_tasks_ratio=4.0)
    for _ in range(205):
        make_index_task(index, repository_size=None)

    assert handed_out(node_api, node, concurrency(100)) == 200


def test_an_operator_concurrency_override_sets_the_limit(node_api, node, index):
    Node.objects.filter(pk=node.pk).update(metadata={**node.metadata, "concurrency_override": 1})
    for _ in range(3):
        make_index_task(index)

    assert handed_out(node_api, node, concurrency(8)) == 1


def test_while_no_restart_is_live_a_heartbeat_does_not_look_for_one(node_api, now, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from zoekt import restarts

    # However slow the machine, the second heartbeat comes within the memo's time.
    monkeypatch.setattr(restarts, "LIVE_RESTARTS_MEMO_SECONDS", 60.0)
    restarts._forget_live_restarts()  # nothing remembered from an earlier test
    beat(node_api)  # registers, and learns that no restart record is live
    with CaptureQueriesContext(connection) as queries:
        clock.advance(30)
        beat(node_api)

    assert not [q for q in queries.captured_queries if "zoekt_node_shutdowns" in q["sql"]]
