"""Generated requests against the node protocol, the catalog API and the search request
(hypothesis): no 5xx, every 4xx in the JSON error shape naming at least one field, and
nothing written by a request that was refused. ``ZOEKT_FUZZ_EXAMPLES`` sets the examples
per endpoint (CI runs the fast part; ``make fuzz`` runs 2,500 per endpoint, figures in
docs/reliability.md)."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.helpers import (
    ERROR_KEYS,
    callback_url,
    db_snapshot,
    heartbeat_body,
    heartbeat_url,
    make_repository,
    make_task,
)
from zoekt.models import Index, Task

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("ZOEKT_FUZZ_EXAMPLES", "150"))
#: What each run saw, by endpoint and status (printed at the end for the figures).
SEEN: Counter = Counter()

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def mutated(base: dict) -> st.SearchStrategy[dict]:
    """``base`` with some keys dropped, some values replaced, some keys added."""
    keys = sorted(base)
    return st.builds(
        lambda drop, replace, extra: {
            **{k: v for k, v in base.items() if k not in drop},
            **replace,
            **extra,
        },
        st.sets(st.sampled_from(keys), max_size=len(keys)),
        st.dictionaries(st.sampled_from(keys), JSON, max_size=len(keys)),
        st.dictionaries(st.text(min_size=1, max_size=20), JSON, max_size=3),
    )


def _check(response, before, endpoint: str) -> None:
    SEEN[(endpoint, response.status_code)] += 1
    assert response.status_code < 500, response.content[:500]
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == ERROR_KEYS, body
        assert body["errors"] and all(isinstance(k, str) and k for k in body["errors"]), body
        assert db_snapshot() == before, "a refused request wrote"


@pytest.fixture
def fleet(node, index):
    task = make_task(make_repository(index), state=Task.State.PROCESSING)
    return node, task


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


@FUZZ
@given(body=st.one_of(mutated(heartbeat_body()), JSON))
def test_generated_heartbeats(node_api, fleet, body):
    node, _task = fleet
    before = db_snapshot()
    _check(node_api.post(heartbeat_url(node.uuid), body), before, "heartbeat")


@FUZZ
@given(
    body=st.one_of(
        mutated(
            {
                "name": "index",
                "success": True,
                "error": "",
                "payload": {"task_id": 1},
                "additional_payload": {"repo_stats": {"size_in_bytes": 1, "index_file_count": 1}},
            }
        ),
        JSON,
    ),
    real_task=st.booleans(),
)
def test_generated_callbacks(node_api, fleet, body, real_task):
    node, task = fleet
    if real_task and isinstance(body, dict) and isinstance(body.get("payload"), dict):
        body["payload"] = {**body["payload"], "task_id": task.id}
    before = db_snapshot()
    _check(node_api.post(callback_url(node.uuid), body), before, "callback")


@FUZZ
@given(
    raw=st.binary(max_size=200),
    content_type=st.sampled_from(
        [
            "application/json",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "text/plain",
        ]
    ),
)
def test_generated_raw_bodies(node_api, fleet, raw, content_type):
    node, _task = fleet
    before = db_snapshot()
    response = node_api.post(heartbeat_url(node.uuid), None, raw=raw, content_type=content_type)
    _check(response, before, "heartbeat-raw")


@FUZZ
@given(
    body=st.one_of(
        st.fixed_dictionaries(
            {
                "namespaces": st.lists(JSON, max_size=3),
                "projects": st.lists(JSON, max_size=3),
                "statistics": st.lists(JSON, max_size=3),
            }
        ),
        JSON,
    )
)
def test_generated_catalog_upserts(admin_client, body):
    before = db_snapshot()
    response = admin_client.post(
        "/api/v1/catalog/bulk_upsert", data=json.dumps(body), content_type="application/json"
    )
    _check(response, before, "catalog")


@FUZZ
@given(
    body=st.one_of(
        mutated(
            {
                "query": {"query_string": {"query": "case:no test"}},
                "project_ids": [1, 2**32, 3],
                "options": {"timeout": "5s", "node_id": 1},
            }
        ),
        st.fixed_dictionaries(
            {
                "query": st.one_of(st.text(max_size=20), JSON),
                "project_ids": st.lists(JSON, max_size=4),
                "options": mutated({"timeout": "5s", "num_context_lines": 1, "node_id": 1}),
            }
        ),
        JSON,
    ),
)
def test_generated_search_requests(admin_client, fleet, body):
    node, _task = fleet
    root_namespace_id = Index.objects.filter(zoekt_node=node).values_list(
        "namespace_id", flat=True
    )[0]
    before = db_snapshot()
    response = admin_client.post(
        f"/api/v1/namespaces/{root_namespace_id}/search_request",
        data=json.dumps(body),
        content_type="application/json",
    )
    _check(response, before, "search_request")


def test_zz_report(capsys):
    """The counts of this run, by endpoint and status (the figures of docs/reliability.md)."""
    if SEEN:
        with capsys.disabled():
            total = sum(SEEN.values())
            print(f"\nfuzz: {total} requests; by endpoint and status: {dict(sorted(SEEN.items()))}")
    assert all(status < 500 for _, status in SEEN)
