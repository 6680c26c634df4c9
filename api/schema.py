"""The OpenAPI schema: who may read it, and how the node API's own classes appear in it."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import BasePermission, IsAdminUser
from rest_framework.renderers import JSONRenderer


class SchemaReader(BasePermission):
    """``/api/schema/``: an operator (the operator token or a staff session) in production;
    anyone in development (``DJANGO_DEBUG``). The schema maps every operator endpoint and
    what it accepts, so it is not published to whoever reaches the server."""

    def has_permission(self, request, view) -> bool:
        return settings.DEBUG or IsAdminUser().has_permission(request, view)


class SchemaView(SpectacularAPIView):
    """``/api/schema/``, its refusals in the API's JSON error shape (not in the schema's
    YAML or JSON media type, which a reader asked for the schema itself)."""

    permission_classes = [SchemaReader]

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response


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
