"""The search-target read API: where a search of one root namespace fans out to.

Operators only (the REST_FRAMEWORK defaults: session or token, staff). The
rule lives in ``zoekt.search_targets``; this view only connects it to HTTP.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from zoekt.reasons import Reason
from zoekt.search_plans import gitlab_plan
from zoekt.search_targets import search_targets

NO_TARGET_REASONS = (
    Reason.NAMESPACE_NOT_ENABLED,
    Reason.SEARCH_DISABLED,
    Reason.NO_READY_REPLICA,
    Reason.NO_SEARCHABLE_REPLICA,
)


#: The errors both read endpoints answer.
READ_ERRORS = {
    401: OpenApiResponse(description="No credentials, or a bad token"),
    403: OpenApiResponse(description="A user who is not staff"),
    404: OpenApiResponse(description="A namespace id that is not an integer"),
    503: OpenApiResponse(description="PostgreSQL unavailable; Retry-After says when"),
}


# Reply shapes, for the OpenAPI schema only.
class TargetIndexSerializer(serializers.Serializer):
    index_id = serializers.IntegerField()
    project_namespace_id_from = serializers.IntegerField(allow_null=True)
    project_namespace_id_to = serializers.IntegerField(allow_null=True)


class SearchTargetSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    node_name = serializers.CharField()
    search_base_url = serializers.CharField()
    replica_id = serializers.IntegerField()
    indices = TargetIndexSerializer(many=True)


class SearchTargetsSerializer(serializers.Serializer):
    namespace_id = serializers.IntegerField()
    search_enabled = serializers.BooleanField(help_text="True when targets is not empty.")
    targets = SearchTargetSerializer(many=True)
    reason = serializers.ChoiceField(
        choices=[str(reason) for reason in NO_TARGET_REASONS],
        allow_null=True,
        help_text="Why targets is empty; null when it is not.",
    )


SEARCH_TARGETS_EXAMPLE = {
    "namespace_id": 9970,
    "search_enabled": True,
    "targets": [
        {
            "node_id": 1,
            "node_name": "zoekt-0",
            "search_base_url": "http://zoekt-0.zoekt:6070",
            "replica_id": 12,
            "indices": [
                {"index_id": 31, "project_namespace_id_from": None, "project_namespace_id_to": 5000}
            ],
        },
        {
            "node_id": 2,
            "node_name": "zoekt-1",
            "search_base_url": "http://zoekt-1.zoekt:6070",
            "replica_id": 12,
            "indices": [
                {"index_id": 32, "project_namespace_id_from": 5001, "project_namespace_id_to": None}
            ],
        },
    ],
    "reason": None,
}


class SearchTargetsView(APIView):
    @extend_schema(
        operation_id="zoekt_namespace_search_targets",
        summary="The nodes and indices a search of a root namespace fans out to",
        description=(
            "Routed by coverage: for each part of the namespace's project-namespace id "
            "space, exactly one ready index on a searchable node, with the range it is "
            "asked for (the lowest-id replica that covers everything alone, else a cover "
            "drawn from every replica). With none, targets is empty and reason says why. "
            "An unknown namespace id answers 200 with namespace_not_enabled."
        ),
        responses={200: SearchTargetsSerializer, **READ_ERRORS},
        examples=[
            OpenApiExample("Two indices on two nodes", value=SEARCH_TARGETS_EXAMPLE),
            OpenApiExample(
                "No replica on searchable nodes",
                value={
                    "namespace_id": 9970,
                    "search_enabled": False,
                    "targets": [],
                    "reason": "no_searchable_replica",
                },
            ),
        ],
    )
    def get(self, request, root_namespace_id: int):
        return Response(search_targets(root_namespace_id).as_dict())


class ForwardToSerializer(serializers.Serializer):
    endpoint = serializers.CharField(help_text="The node's search_base_url.")
    node_id = serializers.IntegerField()
    node_name = serializers.CharField()
    replica_id = serializers.IntegerField()
    project_namespace_id_ranges = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField(allow_null=True)),
        help_text="[from, to] pairs this node is asked for; null is an open end.",
    )
    projects = serializers.IntegerField(help_text="Ready projects it serves.")


class ProxySerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    search_base_url = serializers.CharField()
    url = serializers.CharField(help_text="Where GitLab posts the proxied search.")


class SearchPlanSerializer(serializers.Serializer):
    namespace_id = serializers.IntegerField()
    search_enabled = serializers.BooleanField()
    reason = serializers.ChoiceField(
        choices=[str(reason) for reason in NO_TARGET_REASONS], allow_null=True
    )
    version = serializers.IntegerField(help_text="GitLab's search request version (2).")
    traversal_ids_prefix = serializers.CharField(help_text="The namespace's filter: ^<id>-.")
    proxy = ProxySerializer(allow_null=True)
    forward_to = ForwardToSerializer(many=True)
    targets = serializers.DictField(
        child=serializers.ListField(child=serializers.IntegerField()),
        allow_null=True,
        help_text="GitLab's legacy map: node id -> project ids; null over 30,000 projects.",
    )
    targets_omitted = serializers.CharField(allow_null=True)


class SearchPlanView(APIView):
    @extend_schema(
        operation_id="zoekt_namespace_search_plan",
        summary="A namespace search in GitLab's own shapes: the v2 proxy plan and the targets map",
        description=(
            "The same routing as search_targets, as GitLab's search sends it: a proxy node "
            "(the one serving the most projects) to POST `/webserver/api/v2/search` to, the "
            "`forward_to` entries (one per node, its search_base_url as `endpoint`, and the "
            "project-namespace ranges it serves), the traversal-id prefix that scopes the "
            "query, and RoutingService's legacy `{node_id: [project_id]}` map (null over "
            "30,000 projects). The caller adds its query AST."
        ),
        responses={200: SearchPlanSerializer, **READ_ERRORS},
    )
    def get(self, request, root_namespace_id: int):
        return Response(gitlab_plan(root_namespace_id))
