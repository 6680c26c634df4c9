"""drf-spectacular extensions: how the node API's own classes appear in the OpenAPI schema."""

from __future__ import annotations

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerFieldExtension,
)


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
