"""The OpenAPI schema and its browsable page: who may read them, and how the node API's
own classes appear in the schema."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.urls import reverse
from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.exceptions import NotAuthenticated, PermissionDenied
from rest_framework.permissions import BasePermission, IsAdminUser
from rest_framework.renderers import JSONRenderer


class SchemaReader(BasePermission):
    """``/api/schema/``: an operator (the operator token or a staff session) in production;
    anyone in development (``DJANGO_DEBUG``). The schema maps every operator endpoint and
    what it accepts, so it is not published to whoever reaches the server."""

    def has_permission(self, request, view) -> bool:
        return settings.DEBUG or IsAdminUser().has_permission(request, view)


class JSONRefusals:
    """A view's refusals in the API's JSON error shape, whatever it renders when it answers
    (the schema's YAML or JSON media type, the page's HTML)."""

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response


class SchemaView(JSONRefusals, SpectacularAPIView):
    """``/api/schema/``."""

    permission_classes = [SchemaReader]


class SchemaPageView(JSONRefusals, SpectacularSwaggerView):
    """``/api/schema/ui/``: Swagger UI over ``/api/schema/``, its scripts and styles served
    from this server (``drf-spectacular-sidecar``'s static files, no CDN). Read by whoever
    may read the schema (``SchemaReader``); a browser that may not (no session, or one that
    is not staff) is sent to the admin's login as the dashboard's pages send it, and any
    other refusal (a bad token) is the schema's, in the JSON error shape."""

    permission_classes = [SchemaReader]
    url_name = "schema"

    def handle_exception(self, exc):
        if isinstance(exc, NotAuthenticated | PermissionDenied) and not self.request.auth:
            return redirect_to_login(self.request.get_full_path(), reverse("admin:login"))
        return super().handle_exception(exc)


class GitlabShellJWTScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.GitlabShellJWTAuthentication"
    name = "gitlabShellJWT"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Gitlab-Shell-Api-Request",
            "description": "HS256 JWT signed with GitLab Shell's shared secret; "
            "iss gitlab-shell, exp required (60 s leeway).",
        }


class JSONObjectFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "api.serializers.JSONObjectField"

    def map_serializer_field(self, auto_schema, direction):
        component = auto_schema.resolve_serializer(self.target.serializer_class, direction)
        return component.ref if component else {"type": "object"}


class _ClosedRequestObject:
    """A serializer that refuses keys it does not declare: its request schema says so
    (``additionalProperties: false``), so a generated body with an extra key is one the
    schema forbids, not one it allows and the API refuses."""

    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_basic_serializer(self.target, direction)
        if direction == "request":
            schema["additionalProperties"] = False
        return schema


class StrictSerializerScheme(_ClosedRequestObject, OpenApiSerializerExtension):
    target_class = "api.serializers.StrictSerializer"


class CatalogRowScheme(_ClosedRequestObject, OpenApiSerializerExtension):
    target_class = "api.operator_serializers._CatalogRowSerializer"


#: What the request guard (``api.middleware.RequestGuardMiddleware``) answers on any path
#: under /api/, before a view: declared on every operation.
GUARD_RESPONSES = {
    "411": "A chunked body (`Transfer-Encoding: chunked`): send it with Content-Length. "
    "Body: {error: str, errors: {body: [str]}}.",
}


#: The media type every request body is declared in.
DECLARED_BODY_MEDIA_TYPE = "application/json"


def declare_guard_responses(result, generator, request, public):
    """A postprocessing hook: every operation declares the guard's answers, and its body in
    JSON only. The views read form bodies too (GitLab's API does, for ``curl -d``), but a
    form cannot say null, nor an object without a convention of its own (the node API reads
    ``process_health`` as a JSON string), so the schema promises what is exact: JSON."""
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            content = operation.get("requestBody", {}).get("content")
            if content and DECLARED_BODY_MEDIA_TYPE in content:
                operation["requestBody"]["content"] = {
                    DECLARED_BODY_MEDIA_TYPE: content[DECLARED_BODY_MEDIA_TYPE]
                }
            responses = operation.setdefault("responses", {})
            for status, description in GUARD_RESPONSES.items():
                responses.setdefault(status, {"description": description})
    return result
