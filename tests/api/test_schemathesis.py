"""Requests generated from the OpenAPI schema (schemathesis), against every operation.

Each generated case is sent through the WSGI application, authenticated as the caller
of its operation (a node's JWT, an operator's token), and must get an answer below 500
whose status the schema declares, in the JSON error shape naming a field when it is a
4xx; and a refused request must leave the tables exactly as they were. Evictions have
no HTTP API; of moves, only the move of one index by hand
(``POST /api/v1/indices/:id/move``), whose refusals the snapshot's moves cover. The
operations here are all there is. ``ZOEKT_SCHEMA_EXAMPLES`` sets the examples per
operation in the generated phase, besides the cases schemathesis derives from the schema's
examples and bounds (CI runs 5, about 1,700 requests in all; ``make fuzz`` runs 300,
figures in docs/reliability.md).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core import signals
from django.db import close_old_connections, connection
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import CHECKS, load_all_checks

from config.wsgi import application
from tests.api.helpers import (
    ERROR_KEYS,
    NodeAPI,
    db_snapshot,
    make_repository,
    make_task,
    set_app_setting,
)
from zoekt.models import EnabledNamespace, Index, Move, Namespace, Project, Task

load_all_checks()
#: Every check schemathesis has (its CLI's ``--checks all``), with ``schemathesis.toml``'s
#: settings: the test fails if any of them finds a failure.
ALL_CHECKS = list(CHECKS.get_all())
EXAMPLES = int(os.environ.get("ZOEKT_SCHEMA_EXAMPLES", "5"))
#: What each run saw, by operation and status (printed at the end for the figures).
SEEN: Counter = Counter()


def served_schema() -> dict:
    """The schema ``/api/schema/`` serves an operator: its view's generator and renderer.
    Read once, at collection, before the test database that would hold an operator's
    token exists (the endpoint itself refuses an anonymous reader in production mode)."""
    document = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(document))


schema = schemathesis.openapi.from_dict(served_schema())
schema.app = application
schema.location = "/api/schema/"


def snapshot() -> dict:
    """The node protocol's tables, and the catalog and rollout tables operators write."""
    return {
        **db_snapshot(),
        "namespaces": list(Namespace.objects.order_by("id").values()),
        "projects": list(Project.objects.order_by("id").values()),
        "enabled": list(EnabledNamespace.objects.order_by("id").values()),
        "moves": list(Move.objects.order_by("id").values()),
    }


@pytest.fixture(autouse=True)
def one_connection():
    """Keep the test's connection across requests, as Django's test client does: the WSGI
    handler closes it at each request's end, which would end the test's transaction."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture(autouse=True)
def id_sequences_restored(db):
    """The catalog advances the id sequences past the ids it is sent (up to 2^63 - 1), and a
    sequence is outside the test's transaction: put each back where it was, so no later test
    finds its sequence spent."""
    sequences = {}
    with connection.cursor() as cursor:
        for table in ("namespaces", "projects"):
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
            (name,) = cursor.fetchone()
            cursor.execute(f"SELECT last_value, is_called FROM {name}")
            sequences[name] = cursor.fetchone()
    yield
    with connection.cursor() as cursor:
        for name, (last_value, is_called) in sequences.items():
            cursor.execute("SELECT setval(%s, %s, %s)", [name, last_value, is_called])


@pytest.fixture
def operator_token(db) -> str:
    user = get_user_model().objects.create_user("fuzz", password="unused", is_staff=True)
    return Token.objects.create(user=user).key


@pytest.fixture
def fleet(node, index):
    """A node with a task in flight, and indexing on (GitLab's admin endpoints refuse every
    change while it is off: a 400, which the schema cannot make a request avoid)."""
    set_app_setting(zoekt_indexing_enabled=True)
    make_task(make_repository(index), state=Task.State.PROCESSING)
    return node


def within_what_the_schema_cannot_say(case, node) -> None:
    """Bring a case the schema allows within the rules no schema can state, as a real caller
    is; a case the schema forbids is sent as generated.

    * A callback comes from a registered node: its uuid is the fixture node's (an unknown
      uuid is GitLab's 422, tested in tests/api/test_callback.py).
    * A heartbeat's ``disk.used`` is at most its ``disk.all``, and its ``node.services``,
      when sent, name ``zoekt`` (both a 422 otherwise, tested in tests/api/test_heartbeat.py).
    * A shutdown request sends ``allowed_delay`` with a restart only and ``target_node_id``
      with a replace only, and a replace names its target, another node than the one it
      replaces (a 400 naming the field otherwise, tests/api/test_node_shutdown_api.py).
    * A replicas override is sent under one of its two names (both, differing, is a 400).

    Besides, half the cases that name a node or an index in their path (those whose
    generated id is even) name the fixture's, so that the operations on a node that exists
    are sent as often as the 404s of ids that do not.
    """
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return
    existing = {"node_id": node.id, "index_id": Index.objects.filter(zoekt_node=node)[0].id}
    for name, value in existing.items():
        generated = case.path_parameters.get(name) if case.path_parameters else None
        if isinstance(generated, int) and generated % 2 == 0:
            case.path_parameters[name] = value
    if case.path.endswith("/callback"):
        case.path_parameters["uuid"] = str(node.uuid)
    body = case.body
    if case.path.endswith("/heartbeat") and isinstance(body, dict):
        total, used = body.get("disk.all"), body.get("disk.used")
        if isinstance(total, int) and isinstance(used, int) and used > total:
            body["disk.all"], body["disk.used"] = used, total
        services = body.get("node.services")
        if isinstance(services, list) and "zoekt" not in services:
            body["node.services"] = [*services[:15], "zoekt"]
    if case.path.endswith("/shutdown") and isinstance(body, dict):
        if body.get("type") != "restart":
            body.pop("allowed_delay", None)
        if body.get("type") != "replace":
            body.pop("target_node_id", None)
        elif "target_node_id" not in body:
            body["type"] = "remove"
        elif body["target_node_id"] == case.path_parameters.get("node_id"):
            body["target_node_id"] += 1
    replicas = "/admin/zoekt/namespaces/" in case.path and isinstance(body, dict)
    if replicas and "number_of_replicas_override" in body:
        body.pop("number_of_replicas", None)


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_schema_driven_requests(case, fleet, operator_token):
    if case.path.startswith("/api/v4/internal/"):
        headers = {"Gitlab-Shell-Api-Request": NodeAPI.token()}
    else:
        headers = {"Authorization": f"Token {operator_token}"}
    within_what_the_schema_cannot_say(case, fleet)
    before = snapshot()
    response = case.call(headers=headers)
    SEEN[(f"{case.method} {case.path}", response.status_code)] += 1
    case.validate_response(response, checks=ALL_CHECKS, headers=headers)
    if 400 <= response.status_code < 500:
        body = response.json()
        assert set(body) == ERROR_KEYS, body
        assert body["errors"] and all(isinstance(k, str) and k for k in body["errors"]), body
        assert snapshot() == before, "a refused request wrote"


def test_zz_schema_report(capsys):
    """The counts of this run, by operation and status (the figures of docs/reliability.md)."""
    if SEEN:
        with capsys.disabled():
            print(f"\nschema-driven requests: {sum(SEEN.values()):,}")
            for (operation, status), n in sorted(SEEN.items()):
                print(f"  {operation}: {status} x {n:,}")
    assert all(status < 500 for _, status in SEEN)
