"""Outages and edges of the HTTP layer, with the real servers made unreachable (no mock):
a Redis outage leaves the node API up, a PostgreSQL outage is a JSON 503 with
Retry-After, a chunked body is a 411, and an anonymous operator call a 401."""

from __future__ import annotations

import contextlib

import pytest
from django.db import connection

from tests.api.helpers import ERROR_KEYS, heartbeat_body, heartbeat_url, table_counts
from zoekt import app_settings
from zoekt.models import Node
from zoekt.outages import REDIS_ERRORS

NODE = "6f1c2b1e-8a0d-4a4e-9f7b-2d6c1b0e5a11"
#: A port nothing listens on: connecting is refused at once.
CLOSED = "127.0.0.1:9"


@pytest.fixture
def redis_down(settings):
    """The cache's Redis unreachable (Django rebuilds its cache handlers on the change)."""
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://{CLOSED}/0"}}
    app_settings._memo.clear()
    yield
    app_settings._memo.clear()


@pytest.mark.django_db
def test_with_redis_down_a_heartbeat_is_answered_from_the_settings_row(node_api, now, redis_down):
    from django.core.cache import cache

    with pytest.raises(REDIS_ERRORS):  # the outage is real
        cache.get("anything")
    response = node_api.heartbeat(NODE, heartbeat_body())
    assert response.status_code == 200, response.content
    assert response.json()["pull_frequency"]
    assert Node.objects.filter(uuid=NODE).exists()


@contextlib.contextmanager
def database_unreachable():
    """PostgreSQL unreachable inside the block: the connection closed and its settings
    pointed at a closed port; restored (and reconnected on next use) after it."""
    settings_dict = connection.settings_dict
    saved = (settings_dict["HOST"], settings_dict["PORT"])
    connection.close()
    settings_dict["HOST"], settings_dict["PORT"] = CLOSED.split(":")
    try:
        yield
    finally:
        connection.close()
        settings_dict["HOST"], settings_dict["PORT"] = saved


@pytest.mark.django_db(transaction=True)
def test_with_postgresql_down_a_heartbeat_is_a_json_503_with_retry_after(node_api, now):
    app_settings.current()  # the process holds the settings, as a running server does
    before = table_counts()
    with database_unreachable():
        response = node_api.heartbeat(NODE, heartbeat_body())
        callback = node_api.callback(
            NODE, {"name": "index", "success": True, "payload": {"task_id": 1}}
        )
    for answer in (response, callback):
        assert answer.status_code == 503, answer.content
        assert answer["Retry-After"] == "10"
        body = answer.json()
        assert set(body) == ERROR_KEYS and list(body["errors"]) == ["database"]
    # Back up: nothing was written meanwhile, and the next beat is served.
    assert table_counts() == before
    assert node_api.heartbeat(NODE, heartbeat_body()).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_with_postgresql_down_the_health_probe_names_the_database(client):
    with database_unreachable():
        response = client.get("/-/health")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"].startswith("error") and checks["redis"] == "ok"


@pytest.mark.django_db
def test_a_chunked_body_is_refused_with_411_and_writes_nothing(node_api, now):
    before = table_counts()
    response = node_api.client.generic(
        "POST",
        heartbeat_url(NODE),
        b"",
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="chunked",
        HTTP_GITLAB_SHELL_API_REQUEST=node_api.token(),
    )
    assert response.status_code == 411, response.content
    assert list(response.json()["errors"]) == ["body"]
    assert table_counts() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/namespaces/1/search_targets",
        "/api/v1/catalog/bulk_upsert",
    ],
)
def test_an_anonymous_operator_call_is_a_401_everywhere(client, path):
    response = client.get(path)
    assert response.status_code == 401, (path, response.status_code)
    assert set(response.json()) == ERROR_KEYS


def test_the_schema_declares_the_node_uuid_and_the_error_responses(admin_client, db):
    schema = admin_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    heartbeat = schema["paths"]["/api/v4/internal/search/zoekt/{uuid}/heartbeat"]["post"]
    (uuid,) = [p for p in heartbeat["parameters"] if p["name"] == "uuid"]
    assert uuid["schema"] == {"type": "string", "format": "uuid"}
    assert {"200", "400", "401", "411", "413", "422", "503"} <= set(heartbeat["responses"])
