"""Bad input to the node protocol is refused with a 4xx naming the field, and writes nothing.

Every case runs against a fleet with a registered node, an index, a
repository and a task the node is processing, 60 s after the node's last
heartbeat, so that any write that slipped through would show: the row counts
of ``zoekt_nodes``, ``zoekt_tasks`` and ``zoekt_repositories`` and every row
of those tables (and of ``zoekt_indices``) must be unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable

import jwt
import pytest

from tests.api.helpers import (
    ERROR_KEYS,
    FORM,
    callback_url,
    db_snapshot,
    heartbeat_body,
    heartbeat_url,
    make_repository,
    make_task,
    process_metrics,
)
from zoekt import clock
from zoekt.models import Task

pytestmark = pytest.mark.django_db

BIG = 2**63  # one more than the largest bigint
#: One byte more than a node may report (``zoekt.capacity.MAX_BYTES``, 1 PiB): a bigint,
#: but one whose sums overflowed (``disk.indexed`` near 2**63 gave a 500 once).
OVER_MAX_BYTES = 2**50 + 1
TOKEN_HEADER = "Gitlab-Shell-Api-Request"


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad request: to ``endpoint``, refused with ``status`` naming ``fields``."""

    endpoint: str  # "heartbeat" or "callback"
    fields: tuple[str, ...]
    body: Callable[[int], dict] | None = None  # given the processing task's id
    status: int = 400
    form: bool = False
    raw: str | None = None
    content_type: str = "application/json"  # of a raw body
    token: Callable[[], str] | None = None
    uuid: str | None = None


def hb(extra: dict | None = None, *, without: tuple[str, ...] = ()) -> Callable[[int], dict]:
    return lambda task_id: heartbeat_body(extra, without=without)


def health(**blocks) -> dict:
    return {"process_health": blocks}


def cb(**changes) -> Callable[[int], dict]:
    """A valid index-success callback for the task, with ``changes`` applied
    (``payload`` and ``additional_payload`` changes are merged, a None value removes a key)."""

    def build(task_id: int) -> dict:
        body = {
            "name": "index",
            "success": True,
            "payload": {"task_id": task_id, "schema_version": 1},
            "additional_payload": {"repo_stats": {"size_in_bytes": 10, "index_file_count": 1}},
        }
        for key, value in changes.items():
            if value is None:
                body.pop(key)
            elif isinstance(value, dict) and isinstance(body.get(key), dict):
                body[key] = {**body[key], **value}
            else:
                body[key] = value
        return body

    return build


def token(claims: dict | None = None, *, secret: str | None = None) -> Callable[[], str]:
    """A token built when the test runs; a claim given as None is left out."""

    def build() -> str:
        from django.conf import settings

        issued = int(time.time())
        values = {"iss": "gitlab-shell", "iat": issued, "exp": issued + 60, **(claims or {})}
        values = {name: value for name, value in values.items() if value is not None}
        key = secret or settings.GITLAB_SHELL_SECRETS[0]
        return jwt.encode(values, key, algorithm="HS256")

    return build


OVERSIZE = json.dumps({**heartbeat_body(), "node.version": "v" * (64 * 1024)})

CASES = [
    # --- heartbeat: wrong types -----------------------------------------------------------
    pytest.param(Case("heartbeat", ("disk.all",), hb({"disk.all": "lots"})), id="disk.all-text"),
    pytest.param(Case("heartbeat", ("disk.all",), hb({"disk.all": True})), id="disk.all-boolean"),
    pytest.param(Case("heartbeat", ("disk.used",), hb({"disk.used": 1.5})), id="disk.used-float"),
    pytest.param(Case("heartbeat", ("disk.all",), hb({"disk.all": None})), id="disk.all-null"),
    pytest.param(
        # Of the wrong type: a malformed parameter (400), as the schema says a string.
        Case("heartbeat", ("node.url",), hb({"node.url": 42})),
        id="node.url-number",
    ),
    pytest.param(
        Case("heartbeat", ("node.url",), hb({"node.url": "ftp://zoekt-0"}), status=422),
        id="node.url-ftp",
    ),
    pytest.param(
        Case("heartbeat", ("node.url",), hb({"node.url": "not a url"}), status=422),
        id="node.url-not-a-url",
    ),
    pytest.param(
        Case(
            "heartbeat", ("node.search_url",), hb({"node.search_url": "zoekt-0:6070"}), status=422
        ),
        id="node.search_url-without-scheme",
    ),
    pytest.param(
        Case("heartbeat", ("node.url",), hb({"node.url": "http://x/" + "a" * 1024})),
        id="node.url-over-1024-chars",
    ),
    pytest.param(
        Case("heartbeat", ("node.name",), hb({"node.name": ["zoekt-0"]})), id="node.name-list"
    ),
    pytest.param(
        Case("heartbeat", ("node.name",), hb({"node.name": ""}), status=422), id="node.name-blank"
    ),
    # --- heartbeat: a node GitLab's model refuses (422) -----------------------------------------
    pytest.param(
        Case("heartbeat", ("node.url",), hb({"node.url": ""}), status=422), id="node.url-empty"
    ),
    pytest.param(
        Case("heartbeat", ("node.url",), hb({"node.url": "   "}), status=422),
        id="node.url-whitespace",
    ),
    pytest.param(
        Case("heartbeat", ("node.url",), hb({"node.url": ""}), form=True, status=422),
        id="form-node.url-empty",
    ),
    pytest.param(
        Case("heartbeat", ("node.search_url",), hb({"node.search_url": ""}), status=422),
        id="node.search_url-empty",
    ),
    pytest.param(
        Case("heartbeat", ("node.services",), hb({"node.services": []}), status=422),
        id="node.services-empty",
    ),
    pytest.param(
        Case("heartbeat", ("node.services",), hb({"node.services": ["gpu"]}), status=422),
        id="node.services-none-known",
    ),
    pytest.param(
        Case(
            "heartbeat", ("node.url", "uuid"), hb({"node.url": ""}), uuid="not-a-uuid", status=422
        ),
        id="node.url-empty-and-non-uuid-in-url",
    ),
    pytest.param(
        Case("heartbeat", ("node.url", "disk.all"), hb({"node.url": "", "disk.all": "lots"})),
        id="malformed-parameter-beside-an-invalid-node-is-400",
    ),
    pytest.param(
        Case("heartbeat", ("node.services",), hb({"node.services": "zoekt"})),
        id="node.services-string",
    ),
    pytest.param(
        Case("heartbeat", ("node.concurrency",), hb({"node.concurrency": "many"})),
        id="node.concurrency-text",
    ),
    pytest.param(
        Case("heartbeat", ("node.schema_version",), hb({"node.schema_version": 2**15})),
        id="node.schema_version-over-smallint",
    ),
    pytest.param(
        Case("heartbeat", ("process_health",), hb({"process_health": "{not json"})),
        id="process_health-malformed-json-string",
    ),
    pytest.param(
        Case("heartbeat", ("process_health",), hb({"process_health": [1, 2]})),
        id="process_health-list",
    ),
    pytest.param(
        Case("heartbeat", ("process_health.webserver.non_field_errors",), hb(health(webserver=3))),
        id="process_health.webserver-number",
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("process_health.indexer.uptime_seconds",),
            hb(health(indexer={"uptime_seconds": "long"})),
        ),
        id="uptime_seconds-text",
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("process_health.indexer.uptime_seconds",),
            hb(health(indexer={"uptime_seconds": 86400.5})),
        ),
        id="indexer-uptime_seconds-float",
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("process_health.webserver.uptime_seconds",),
            hb(health(webserver={"uptime_seconds": 3600.25})),
        ),
        id="webserver-uptime_seconds-float",
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("process_health.indexer.uptime_seconds",),
            hb(health(indexer={"uptime_seconds": 0.5})),
            form=True,
        ),
        id="form-uptime_seconds-float",
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("process_health.webserver.restarts_15m",),
            hb(health(webserver={"restarts_15m": 1.5})),
        ),
        id="restarts_15m-float",
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("process_health.indexer.restarts_15m",),
            hb(health(indexer={"restarts_15m": True})),
        ),
        id="restarts_15m-boolean",
    ),
    # --- heartbeat: negative and oversized numbers --------------------------------------------
    pytest.param(Case("heartbeat", ("disk.all",), hb({"disk.all": -1})), id="disk.all-negative"),
    pytest.param(Case("heartbeat", ("disk.used",), hb({"disk.used": -1})), id="disk.used-negative"),
    pytest.param(
        Case("heartbeat", ("disk.indexed",), hb({"disk.indexed": -1})), id="disk.indexed-negative"
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("process_health.indexer.rss_bytes",),
            hb(health(indexer={"rss_bytes": -1})),
        ),
        id="rss_bytes-negative",
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("process_health.webserver.restarts_15m",),
            hb(health(webserver={"restarts_15m": -1})),
        ),
        id="restarts_15m-negative",
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("process_health.indexer.restarts_1m",),
            hb(health(indexer={"restarts_1m": 2**31})),
        ),
        id="restarts_1m-over-integer",
    ),
    pytest.param(Case("heartbeat", ("disk.free",), hb({"disk.free": -1})), id="disk.free-negative"),
    pytest.param(
        Case("heartbeat", ("disk.all", "disk.used"), hb({"disk.all": BIG, "disk.used": BIG})),
        id="disk-over-bigint",
    ),
    pytest.param(
        Case("heartbeat", ("disk.indexed",), hb({"disk.indexed": BIG})),
        id="disk.indexed-over-bigint",
    ),
    pytest.param(
        Case("heartbeat", ("disk.indexed",), hb({"disk.indexed": 2**63 - 2})),
        id="disk.indexed-a-bigint-whose-usable-storage-overflows",
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("disk.all", "disk.used"),
            hb({"disk.all": OVER_MAX_BYTES, "disk.used": OVER_MAX_BYTES}),
        ),
        id="disk-over-a-pebibyte",
    ),
    pytest.param(
        Case(
            "heartbeat",
            ("process_health.webserver.memory_limit_bytes",),
            hb(health(webserver={"memory_limit_bytes": BIG})),
        ),
        id="memory_limit_bytes-over-bigint",
    ),
    pytest.param(
        Case("heartbeat", ("disk.all",), hb({"disk.all": "9" * 30}), form=True),
        id="form-disk.all-30-digits",
    ),
    # --- heartbeat: inconsistent, missing and unknown fields -----------------------------------
    pytest.param(
        Case("heartbeat", ("disk.used",), hb({"disk.all": 100, "disk.used": 101}), status=422),
        id="disk.used-over-disk.all",
    ),
    pytest.param(
        Case("heartbeat", ("node.url",), hb(without=("node.url",))), id="node.url-missing"
    ),
    pytest.param(
        Case("heartbeat", ("disk.used",), hb(without=("disk.used",)), form=True),
        id="form-disk.used-missing",
    ),
    pytest.param(
        Case("heartbeat", ("node.services",), hb({"node.services": ["ZOEKT"]}), status=422),
        id="node.services-upper-case-ZOEKT-only",
    ),
    pytest.param(
        Case(
            "heartbeat", ("node.services",), hb({"node.services": ["ZOEKT"]}), form=True, status=422
        ),
        id="form-node.services-upper-case-ZOEKT-only",
    ),
    pytest.param(
        Case("heartbeat", ("process_health",), hb({"process_health": "{not json"}), form=True),
        id="form-process_health-malformed-json",
    ),
    # --- heartbeat: the request itself ----------------------------------------------------------
    pytest.param(Case("heartbeat", ("body",), raw='{"node.url": '), id="malformed-json"),
    pytest.param(Case("heartbeat", ("non_field_errors",), raw="[]"), id="json-array-body"),
    pytest.param(
        Case("heartbeat", ("body",), raw="[" * 5000 + "]" * 5000), id="json-nested-too-deeply"
    ),
    pytest.param(
        Case("heartbeat", ("process_health",), hb({"process_health": "[" * 5000 + "]" * 5000})),
        id="process_health-json-string-nested-too-deeply",
    ),
    pytest.param(
        Case("heartbeat", ("body",), raw="&".join(["x=1"] * 1200), content_type=FORM),
        id="form-with-too-many-fields",
    ),
    pytest.param(
        Case(
            "heartbeat", ("content_type",), raw="node.url=x", content_type="text/plain", status=415
        ),
        id="unsupported-content-type",
    ),
    pytest.param(Case("heartbeat", ("body",), raw=OVERSIZE, status=413), id="body-over-64-KiB"),
    pytest.param(
        Case("heartbeat", ("uuid",), hb(), uuid="not-a-uuid", status=422), id="non-uuid-in-url"
    ),
    pytest.param(
        Case("heartbeat", (TOKEN_HEADER,), hb(), token=lambda: "garbage", status=401),
        id="garbage-token",
    ),
    pytest.param(
        Case(
            "heartbeat",
            (TOKEN_HEADER,),
            hb(),
            token=token({"exp": int(time.time()) - 3600}),
            status=401,
        ),
        id="expired-token",
    ),
    pytest.param(
        Case("heartbeat", (TOKEN_HEADER,), hb(), token=token({"iss": "gitlab"}), status=401),
        id="wrong-issuer-token",
    ),
    pytest.param(
        Case("heartbeat", (TOKEN_HEADER,), hb(), token=token(secret="x" * 64), status=401),
        id="wrong-secret-token",
    ),
    pytest.param(
        Case("heartbeat", (TOKEN_HEADER,), hb(), token=lambda: "", status=401),
        id="missing-token",
    ),
    # --- callback ------------------------------------------------------------------------------
    pytest.param(Case("callback", ("name",), cb(name="reindex")), id="callback-name-unknown"),
    pytest.param(Case("callback", ("name",), cb(name=None)), id="callback-name-missing"),
    pytest.param(Case("callback", ("success",), cb(success=None)), id="success-missing"),
    pytest.param(
        Case("callback", ("success",), cb(success=None), form=True), id="form-success-missing"
    ),
    pytest.param(Case("callback", ("success",), cb(success="maybe")), id="success-not-boolean"),
    pytest.param(Case("callback", ("payload",), cb(payload=None)), id="payload-missing"),
    pytest.param(Case("callback", ("payload",), cb(payload=[1])), id="payload-list"),
    pytest.param(
        Case("callback", ("payload",), cb(payload="{not json"), form=True),
        id="form-payload-malformed-json",
    ),
    pytest.param(
        Case("callback", ("payload.task_id",), cb(payload={"task_id": "abc"})),
        id="task_id-text",
    ),
    pytest.param(
        Case("callback", ("payload.task_id",), cb(payload={"task_id": 0})), id="task_id-zero"
    ),
    pytest.param(
        Case("callback", ("payload.task_id",), cb(payload={"task_id": -5})),
        id="task_id-negative",
    ),
    pytest.param(
        Case("callback", ("payload.task_id",), cb(payload={"task_id": BIG})),
        id="task_id-over-bigint",
    ),
    pytest.param(
        Case("callback", ("payload.task_id",), cb(payload={"schema_version": 1, "task_id": None})),
        id="task_id-null",
    ),
    pytest.param(
        Case(
            "callback",
            ("additional_payload.repo_stats.size_in_bytes",),
            cb(additional_payload={"repo_stats": {"size_in_bytes": -5}}),
        ),
        id="size_in_bytes-negative",
    ),
    pytest.param(
        Case(
            "callback",
            ("additional_payload.repo_stats.size_in_bytes",),
            cb(additional_payload={"repo_stats": {"size_in_bytes": BIG}}),
        ),
        id="size_in_bytes-over-bigint",
    ),
    pytest.param(
        Case(
            "callback",
            ("additional_payload.repo_stats.size_in_bytes",),
            cb(additional_payload={"repo_stats": {"size_in_bytes": OVER_MAX_BYTES}}),
        ),
        id="size_in_bytes-over-a-pebibyte",
    ),
    pytest.param(
        Case(
            "callback",
            ("additional_payload.repo_stats.index_file_count",),
            cb(additional_payload={"repo_stats": {"index_file_count": "seven"}}),
        ),
        id="index_file_count-text",
    ),
    pytest.param(
        Case("callback", ("error",), cb(success=False, error="e" * 10_001)),
        id="error-text-too-long",
    ),
    pytest.param(Case("callback", ("body",), raw="{"), id="callback-malformed-json"),
    pytest.param(
        Case("callback", ("body",), raw=json.dumps({"error": "e" * 70_000}), status=413),
        id="callback-body-over-64-KiB",
    ),
    pytest.param(
        Case("callback", ("uuid",), cb(), uuid="1234", status=422), id="callback-non-uuid-in-url"
    ),
    pytest.param(
        Case("callback", ("success",), cb(success="maybe"), uuid="1234"),
        id="callback-malformed-body-and-non-uuid-is-400",
    ),
    pytest.param(
        Case("callback", (TOKEN_HEADER,), cb(), token=token({"iss": None}), status=401),
        id="callback-token-without-issuer",
    ),
    pytest.param(
        Case("callback", (TOKEN_HEADER,), cb(), token=token(secret="y" * 64), status=401),
        id="callback-wrong-secret-token",
    ),
]


@pytest.fixture
def fleet(node, index):
    """A node processing one index task, last seen a minute ago."""
    task = make_task(make_repository(index), state=Task.State.PROCESSING)
    clock.advance(60)
    return node, task


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(node_api, fleet, case):
    node, task = fleet
    node_uuid = case.uuid or str(node.uuid)
    url = heartbeat_url(node_uuid) if case.endpoint == "heartbeat" else callback_url(node_uuid)
    body = case.body(task.id) if case.body else None
    before = db_snapshot()

    response = node_api.post(
        url,
        body,
        form=case.form,
        raw=case.raw,
        content_type=case.content_type,
        token=case.token() if case.token else None,
    )

    assert response.status_code == case.status, response.content
    reply = response.json()
    assert set(reply) == ERROR_KEYS
    assert set(reply["errors"]) == set(case.fields)
    first_field, messages = next(iter(reply["errors"].items()))
    assert reply["error"] == f"{first_field}: {messages[0]}"
    assert db_snapshot() == before


def test_the_valid_requests_the_matrix_starts_from_are_accepted(node_api, fleet):
    """The matrix's baseline: the valid bodies it starts from are accepted."""
    node, task = fleet

    assert node_api.post(heartbeat_url(node.uuid), hb()(task.id)).status_code == 200
    full = hb(
        {
            "disk.free": 90,
            "node.services": ["zoekt", "ZOEKT"],
            **health(indexer=process_metrics(), webserver=process_metrics(shards_loaded=1)),
        }
    )(task.id)
    assert node_api.post(heartbeat_url(node.uuid), full).status_code == 200
    assert node_api.post(heartbeat_url(node.uuid), full, form=True).status_code == 200
    assert node_api.post(callback_url(node.uuid), cb()(task.id)).status_code == 202
