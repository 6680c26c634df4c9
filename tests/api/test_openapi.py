"""The OpenAPI schema covers every endpoint, validates, and generates without a warning."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


def test_the_schema_generates_without_warnings_and_validates(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    text = out.read_text()
    for path in (
        "/api/v4/internal/search/zoekt/{uuid}/heartbeat",
        "/api/v4/internal/search/zoekt/{uuid}/callback",
        "/api/v1/namespaces/{root_namespace_id}/search_targets",
        "/api/v1/namespaces/{root_namespace_id}/search_routing",
        "/api/v1/namespaces/{root_namespace_id}/search_request",
        "/api/v4/admin/zoekt/shards",
        "/api/v1/catalog/bulk_upsert",
        "/api/v1/nodes/{node_id}/shutdown",
        "/api/v1/indices/{index_id}/move",
        "/api/v1/balance",
    ):
        assert f"{path}:" in text, path
    assert "Gitlab-Shell-Api-Request" in text
    assert "/search_plan:" not in text


@pytest.mark.django_db
def test_the_schema_is_served_at_api_schema(admin_client):
    response = admin_client.get("/api/schema/", HTTP_HOST="127.0.0.1")
    assert response.status_code == 200
    assert b"openapi:" in response.content


# --- who may read it: an operator in production, anyone in development ---------------------------


@pytest.fixture
def operator_token(db) -> str:
    user = get_user_model().objects.create_user("ops", password="pw-12345678", is_staff=True)
    return Token.objects.create(user=user).key


def test_the_schema_refuses_an_anonymous_reader_in_production(settings):
    settings.DEBUG = False
    response = APIClient().get("/api/schema/", HTTP_HOST="127.0.0.1")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert response.json()["error"]
    assert b"openapi" not in response.content


def test_the_schema_refuses_a_user_who_is_not_an_operator(settings, db):
    settings.DEBUG = False
    client = APIClient()
    client.force_login(get_user_model().objects.create_user("viewer", password="pw-12345678"))
    response = client.get("/api/schema/", HTTP_HOST="127.0.0.1")
    assert response.status_code == 403
    assert b"openapi" not in response.content


def test_the_schema_is_served_to_the_operator_token(settings, operator_token):
    settings.DEBUG = False
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {operator_token}")
    response = client.get("/api/schema/", HTTP_HOST="127.0.0.1")
    assert response.status_code == 200
    assert b"openapi:" in response.content


def test_the_schema_is_open_in_development(settings):
    settings.DEBUG = True
    response = APIClient().get("/api/schema/", HTTP_HOST="127.0.0.1")
    assert response.status_code == 200
    assert b"openapi:" in response.content
