"""The OpenAPI schema covers every endpoint, validates, and generates without a warning."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from api.errors import NO_ROUTE
from tests.zoekt.test_zones import zoned
from zoekt.models import NodeShutdown


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
        "/api/v1/indices/{index_id}/balance",
        "/api/v1/capacity",
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


# --- the browsable page (Swagger UI, served from this server: no CDN) --------------------------

PAGE = "/api/schema/ui/"


def test_the_schema_page_is_swagger_ui_served_from_this_server(settings, admin_client):
    settings.DEBUG = False
    response = admin_client.get(PAGE, HTTP_HOST="127.0.0.1")
    assert response.status_code == 200
    page = response.content.decode()
    assert "SwaggerUIBundle" in page
    assert "/api/schema/" in page
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert "https://" not in page and "http://" not in page


def test_the_schema_page_s_scripts_are_static_files_of_this_server():
    for name in ("swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "swagger-ui.css"):
        assert finders.find(f"drf_spectacular_sidecar/swagger-ui-dist/{name}"), name


def test_the_schema_page_sends_an_anonymous_reader_to_the_login_in_production(settings):
    settings.DEBUG = False
    response = Client().get(PAGE, HTTP_HOST="127.0.0.1")
    assert response.status_code == 302
    assert response["Location"] == "/admin/login/?next=/api/schema/ui/"


def test_the_schema_page_sends_a_user_who_is_not_an_operator_to_the_login(settings, db):
    settings.DEBUG = False
    client = Client()
    client.force_login(get_user_model().objects.create_user("viewer", password="pw-12345678"))
    response = client.get(PAGE, HTTP_HOST="127.0.0.1")
    assert response.status_code == 302
    assert response["Location"] == "/admin/login/?next=/api/schema/ui/"
    assert b"SwaggerUIBundle" not in response.content


def test_the_schema_page_refuses_a_bad_token_in_the_json_error_shape(settings, db):
    settings.DEBUG = False
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    response = client.get(PAGE, HTTP_HOST="127.0.0.1")
    assert response.status_code == 401
    assert response.json()["error"]


def test_the_schema_page_is_served_to_the_operator_token(settings, operator_token):
    settings.DEBUG = False
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {operator_token}")
    response = client.get(PAGE, HTTP_HOST="127.0.0.1")
    assert response.status_code == 200
    assert b"SwaggerUIBundle" in response.content


def test_the_schema_page_is_open_in_development(settings, db):
    settings.DEBUG = True
    response = Client().get(PAGE, HTTP_HOST="127.0.0.1")
    assert response.status_code == 200
    assert b"SwaggerUIBundle" in response.content


def test_the_readme_links_the_schema_page():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert PAGE in readme


# --- what the schema promises is what the endpoint answers ------------------------------------

TARGETS = "/api/v1/namespaces/{root_namespace_id}/search_targets"


def json_schema(document: dict, schema: dict) -> dict:
    """A response's schema, with the document's components to resolve its references."""
    components = _nullable(document["components"])
    return {**_nullable(schema), "components": components}


def _nullable(node):
    if isinstance(node, list):
        return [_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _nullable(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable"):
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


@pytest.fixture
def targets_operation(admin_client) -> tuple[dict, dict]:
    response = admin_client.get("/api/schema/?format=json", HTTP_HOST="127.0.0.1")
    document = response.json()
    return document, document["paths"][TARGETS]["get"]


UNKNOWN_ID = 987_654_321


def test_search_targets_answers_an_unknown_namespace_as_its_schema_says(
    admin_client, targets_operation
):
    document, operation = targets_operation
    response = admin_client.get(f"/api/v1/namespaces/{UNKNOWN_ID}/search_targets")
    declared = operation["responses"][str(response.status_code)]
    body = response.json()
    schema = declared["content"]["application/json"]["schema"]
    jsonschema.validate(body, json_schema(document, schema))
    examples = declared["content"]["application/json"]["examples"]
    assert {**examples["UnknownNamespace"]["value"], "namespace_id": UNKNOWN_ID} == body


def test_search_targets_declares_a_404_only_for_a_path_no_route_matches(
    admin_client, targets_operation
):
    _, operation = targets_operation
    response = admin_client.get("/api/v1/namespaces/not-an-id/search_targets")
    assert response.status_code == 404
    assert response.json()["errors"] == {"path": [NO_ROUTE]}
    description = operation["responses"]["404"]["description"]
    assert "not an integer" in description
    assert "an unknown namespace id answers 200" in description.lower()


# --- a request body the schema allows is one the endpoint takes, and no other ------------------


@pytest.fixture
def schema_document(admin_client) -> dict:
    return admin_client.get("/api/schema/?format=json", HTTP_HOST="127.0.0.1").json()


def schema_allows(document: dict, path: str, method: str, body: dict) -> bool:
    content = document["paths"][path][method]["requestBody"]["content"]["application/json"]
    validator = jsonschema.Draft202012Validator(json_schema(document, content["schema"]))
    return validator.is_valid(body)


def assert_agrees(response, allowed: bool, field: str) -> None:
    """Taken (2xx) exactly when the schema allows the body; refused with a 400 naming
    ``field`` when it does not."""
    if allowed:
        assert 200 <= response.status_code < 300, response.content
    else:
        assert response.status_code == 400, response.content
        assert set(response.json()["errors"]) == {field}, response.content


REASONS = [
    pytest.param("Zoekt 1.18 upgrade", True, id="words"),
    pytest.param("  host reboot\n", True, id="words-within-spaces"),
    pytest.param("\t", False, id="a-tab"),
    pytest.param("   ", False, id="spaces"),
    pytest.param("", False, id="empty"),
    pytest.param("up\x00grade", False, id="a-nul"),
    pytest.param(7, False, id="a-number"),
]


@pytest.mark.parametrize("reason, allowed", REASONS)
@pytest.mark.parametrize("target", ["node", "zone"])
def test_a_shutdown_reason_the_schema_allows_is_one_the_api_takes(
    admin_client, schema_document, target, reason, allowed
):
    node = zoned("zoekt-1", "eu-1a")
    if target == "node":
        path, url = "/api/v1/nodes/{node_id}/shutdown", f"/api/v1/nodes/{node.id}/shutdown"
    else:
        path, url = "/api/v1/zones/{zone}/shutdown", "/api/v1/zones/eu-1a/shutdown"
    body = {"type": "restart", "reason": reason}

    assert schema_allows(schema_document, path, "put", body) is allowed
    response = admin_client.put(url, data=json.dumps(body), content_type="application/json")
    assert_agrees(response, allowed, "reason")
    assert NodeShutdown.objects.exists() is allowed


@pytest.mark.parametrize(
    "zone, stored",
    [
        pytest.param("eu-1a", "eu-1a", id="a-label"),
        pytest.param(" eu-1a\t", "eu-1a", id="a-label-within-spaces"),
        pytest.param(" " + "z" * 63 + " ", "z" * 63, id="the-longest-label-within-spaces"),
        pytest.param("   ", None, id="spaces"),
        pytest.param("", None, id="empty"),
        pytest.param(None, None, id="null"),
        pytest.param("eu 1a", "rack-1", id="a-space-inside"),
        pytest.param("-eu", "rack-1", id="a-leading-dash"),
        pytest.param("z" * 64, "rack-1", id="too-long"),
        pytest.param(7, "rack-1", id="a-number"),
    ],
)
def test_a_zone_the_schema_allows_is_one_the_api_takes(admin_client, schema_document, zone, stored):
    node = zoned("zoekt-1", "rack-1")
    allowed = stored != "rack-1"
    body = {"zone": zone}

    assert schema_allows(schema_document, "/api/v1/nodes/{node_id}", "patch", body) is allowed
    response = admin_client.patch(
        f"/api/v1/nodes/{node.id}", data=json.dumps(body), content_type="application/json"
    )
    assert_agrees(response, allowed, "zone")
    node.refresh_from_db()
    assert node.zone == stored


@pytest.mark.parametrize(
    "query, allowed",
    [
        pytest.param("case:no test", True, id="words"),
        pytest.param(" test\r", True, id="words-within-spaces"),
        pytest.param("\r", False, id="a-carriage-return"),
        pytest.param(" \t\n", False, id="spaces"),
        pytest.param("", False, id="empty"),
    ],
)
def test_a_search_query_the_schema_allows_is_one_the_api_takes(
    admin_client, schema_document, query, allowed
):
    path = "/api/v1/namespaces/{root_namespace_id}/search_request"
    body = {"query": query, "project_ids": [1]}

    assert schema_allows(schema_document, path, "post", body) is allowed
    response = admin_client.post(
        "/api/v1/namespaces/987654321/search_request",
        data=json.dumps(body),
        content_type="application/json",
    )
    if allowed:
        assert response.status_code != 400, response.content
    else:
        assert_agrees(response, allowed, "query")


@pytest.mark.parametrize("name, allowed", [("Gitlab Org", True), (" \t", False)])
def test_a_catalog_name_the_schema_allows_is_one_the_api_takes(
    admin_client, schema_document, name, allowed
):
    path = "/api/v1/catalog/bulk_upsert"
    content = schema_document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    body = content["examples"]["AGroupWithOneProject"]["value"]
    body["namespaces"][0]["name"] = name

    assert schema_allows(schema_document, path, "post", body) is allowed
    response = admin_client.post(path, data=json.dumps(body), content_type="application/json")
    if allowed:
        assert response.status_code == 200, response.content
    else:
        assert response.status_code == 400, response.content
        assert list(response.json()["errors"]) == ["namespaces[0].name"], response.content
