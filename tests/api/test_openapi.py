"""The OpenAPI schema covers every endpoint, validates, and generates without a warning."""

from __future__ import annotations

import pytest
from django.core.management import call_command


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
    ):
        assert f"{path}:" in text, path
    assert "Gitlab-Shell-Api-Request" in text
    assert "/search_plan:" not in text


@pytest.mark.django_db
def test_the_schema_is_served_at_api_schema(admin_client):
    response = admin_client.get("/api/schema/", HTTP_HOST="127.0.0.1")
    assert response.status_code == 200
    assert b"openapi:" in response.content
