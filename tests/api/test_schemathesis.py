"""Requests generated from the OpenAPI schema (schemathesis), against every operation.

Each generated case is sent through the WSGI application, authenticated as the caller
of its operation (a node's JWT, an operator's token), and must get an answer below 500
whose status the schema declares, in the JSON error shape naming a field when it is a
4xx; and a refused request must leave the tables exactly as they were. Evictions have
no HTTP API; of moves, only the move of one index by hand
(``POST /api/v1/indices/:id/move``), whose refusals the snapshot's moves cover. The
operations here are all there is. ``ZOEKT_SCHEMA_EXAMPLES`` sets the examples per
operation in the generated phase, besides the cases schemathesis derives from the schema's
examples and bounds (CI runs 5, about 1,800 requests in all; ``make fuzz`` runs 300,
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
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from config.wsgi import application
from tests.api.helpers import ERROR_KEYS, NodeAPI, db_snapshot, make_repository, make_task
from zoekt.models import EnabledNamespace, Move, Namespace, Project, Task

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


@pytest.fixture
def operator_token(db) -> str:
    user = get_user_model().objects.create_user("fuzz", password="unused", is_staff=True)
    return Token.objects.create(user=user).key


@pytest.fixture
def fleet(node, index):
    return make_task(make_repository(index), state=Task.State.PROCESSING)


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
    before = snapshot()
    response = case.call(headers=headers)
    SEEN[(f"{case.method} {case.path}", response.status_code)] += 1
    case.validate_response(
        response,
        checks=[not_a_server_error, status_code_conformance, content_type_conformance],
    )
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
