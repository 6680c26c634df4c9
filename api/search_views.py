"""The search API of one root namespace: where a search fans out to, and GitLab's request.

* ``GET .../search_targets``: the covering indices and their nodes
  (``zoekt.search_targets``);
* ``GET .../search_routing``: the same routing with the figures an operator checks it
  by (``zoekt.search_routing``); not GitLab's request;
* ``POST .../search_request``: GitLab's v2 search request for a caller's query and
  project ids, with the proxy to post it to (``zoekt.search_requests``).

Operators only (the REST_FRAMEWORK defaults: session or token, staff). The rules
live in ``zoekt``; these views only check the request's shape and connect them to HTTP.
"""

from __future__ import annotations

from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
)
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from api.errors import PayloadTooLarge
from api.parsers import JSONParser
from api.serializers import StrictSerializer
from zoekt.reasons import Reason
from zoekt.search_requests import (
    SearchOptions,
    SearchRequestRejected,
    search_request,
    too_many,
)
from zoekt.search_routing import MAX_TARGET_PROJECTS, search_routing
from zoekt.search_targets import search_targets

NO_TARGET_REASONS = (
    Reason.NAMESPACE_NOT_ENABLED,
    Reason.SEARCH_DISABLED,
    Reason.NO_READY_REPLICA,
    Reason.NO_SEARCHABLE_REPLICA,
)
#: Why a search request has no route: the above, or none of its projects served.
REQUEST_NO_ROUTE_REASONS = (*NO_TARGET_REASONS, Reason.NO_REQUESTED_PROJECT_SERVED)


#: The errors the read endpoints answer.
READ_ERRORS = {
    401: OpenApiResponse(description="No credentials, or a bad token"),
    403: OpenApiResponse(description="A user who is not staff"),
    404: OpenApiResponse(
        description="No route: a namespace id that is not an integer. An unknown namespace id "
        "answers 200 (search_enabled false, reason namespace_not_enabled), not 404."
    ),
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
            "An unknown namespace id is not a 404: it answers 200 with an empty targets and "
            "reason namespace_not_enabled, as a namespace that exists but is not enabled."
        ),
        responses={
            200: OpenApiResponse(
                SearchTargetsSerializer,
                description="The targets, or none and why: an unknown namespace id included "
                "(reason namespace_not_enabled).",
            ),
            **READ_ERRORS,
        },
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
            OpenApiExample(
                "Unknown namespace",
                description="An id no namespace has, or a namespace not enabled for Zoekt.",
                value={
                    "namespace_id": 987654321,
                    "search_enabled": False,
                    "targets": [],
                    "reason": "namespace_not_enabled",
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


class SearchRoutingSerializer(serializers.Serializer):
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


class SearchRoutingView(APIView):
    @extend_schema(
        operation_id="zoekt_namespace_search_routing",
        summary="The routing of a namespace search, for operators: nodes, ranges, project counts",
        description=(
            "The same routing as search_targets, with the figures an operator checks it by: "
            "one `forward_to` entry per node (its search_base_url as `endpoint`, its "
            "replica, the project-namespace ranges it is asked for and the searchable "
            "projects it serves), the namespace's traversal-id prefix, the node a search "
            "of every project would be proxied through (the one serving the most "
            "projects) and RoutingService's legacy `{node_id: [project_id]}` map (null over "
            "30,000 projects). This is not GitLab's request: POST `search_request` builds "
            "that for a query and the project ids a caller may search."
        ),
        responses={200: SearchRoutingSerializer, **READ_ERRORS},
    )
    def get(self, request, root_namespace_id: int):
        return Response(search_routing(root_namespace_id))


# --- POST /api/v1/namespaces/<root id>/search_request ----------------------------------------

#: The largest body a search request may have: 30,000 ids and a query fit many times over.
MAX_SEARCH_REQUEST_BODY_BYTES = 4 * 1024 * 1024
#: How deep a query AST may nest (GitLab's builder nests a handful of levels).
MAX_QUERY_DEPTH = 64
MAX_INT = 2**31 - 1
MAX_BIGINT = 2**63 - 1
#: A Go duration, as Zoekt reads ``timeout``: "120s", "1m30s", "500ms".
_DURATION_UNIT = "(ns|us|µs|ms|s|m|h)"
_DURATION_PART = rf"[0-9]+(\.[0-9]+)?{_DURATION_UNIT}"
#: A part whose number has a digit other than 0.
_NONZERO_PART = rf"([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*){_DURATION_UNIT}"
#: A Go duration above zero (``1.5s``, ``2m30s``), as the schema's ``pattern`` says it: one
#: part at least has a digit other than 0.
GO_DURATION = rf"\A({_DURATION_PART})*{_NONZERO_PART}({_DURATION_PART})*\Z"


class JSONIntegerField(serializers.IntegerField):
    """A JSON integer: not a string of digits, a float or a boolean."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


def _depth(value, limit: int) -> int:
    """How deep ``value`` nests, counting no further than ``limit + 1``."""
    if limit < 0 or not isinstance(value, dict | list):
        return 0
    children = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(child, limit - 1) for child in children), default=0)


@extend_schema_field(
    {
        "oneOf": [
            # Something besides spaces (a query of spaces is a 400, "may not be blank").
            {"type": "string", "minLength": 1, "pattern": r"\S"},
            {"type": "object", "minProperties": 1},
        ],
        "description": (
            "The caller's query AST node (GitLab's CodeQueryBuilder output), or a plain "
            "string, taken as {query_string: {query: <string>}}."
        ),
    }
)
class QueryField(serializers.Field):
    default_error_messages = {
        "invalid": "Expected a query AST node (a JSON object) or a query string.",
        "blank": "This field may not be blank.",
        "too_deep": f"The query nests deeper than {MAX_QUERY_DEPTH} levels.",
    }

    def to_internal_value(self, data):
        if isinstance(data, str):
            if not data.strip():
                self.fail("blank")
            return data
        if not isinstance(data, dict):
            self.fail("invalid")
        if not data:
            self.fail("blank")
        if _depth(data, MAX_QUERY_DEPTH) > MAX_QUERY_DEPTH:
            self.fail("too_deep")
        return data

    def to_representation(self, value):
        return value


def _option(default: int, help_text: str) -> JSONIntegerField:
    return JSONIntegerField(
        min_value=0, max_value=MAX_INT, required=False, default=default, help_text=help_text
    )


DEFAULTS = SearchOptions()


class SearchOptionsSerializer(StrictSerializer):
    timeout = serializers.RegexField(
        GO_DURATION,
        max_length=32,
        required=False,
        default=DEFAULTS.timeout,
        error_messages={"invalid": "A Go duration above zero, such as 30s or 1m30s."},
        help_text="A Go duration above zero, as Zoekt reads it.",
    )
    num_context_lines = _option(DEFAULTS.num_context_lines, "GitLab's CONTEXT_LINES_COUNT.")
    max_file_match_window = _option(DEFAULTS.max_file_match_window, "")
    max_file_match_results = _option(DEFAULTS.max_file_match_results, "")
    max_line_match_window = _option(DEFAULTS.max_line_match_window, "GitLab's ZOEKT_COUNT_LIMIT.")
    max_line_match_results = _option(DEFAULTS.max_line_match_results, "")
    max_line_match_results_per_file = _option(
        DEFAULTS.max_line_match_results_per_file, "50 chunks of 10 lines."
    )
    file_match_offset = _option(DEFAULTS.file_match_offset, "Sent only when above 0.")
    node_id = JSONIntegerField(
        min_value=1,
        max_value=MAX_BIGINT,
        required=False,
        default=None,
        allow_null=True,
        help_text="The proxy node; one of the request's nodes. Default: the one with the "
        "most projects, ties to the lowest id.",
    )


class SearchRequestInputSerializer(StrictSerializer):
    query = QueryField()
    project_ids = serializers.ListField(
        child=JSONIntegerField(min_value=1, max_value=MAX_BIGINT),
        allow_empty=False,
        min_length=1,
        help_text=f"The projects the caller may search; at most {MAX_TARGET_PROJECTS:,}, "
        "duplicates counted once.",
    )
    options = SearchOptionsSerializer(required=False)

    def validate_project_ids(self, value: list[int]) -> list[int]:
        ids = sorted(set(value))
        if len(ids) > MAX_TARGET_PROJECTS:
            raise serializers.ValidationError(too_many(len(ids)))
        return ids


class SearchProxySerializer(ProxySerializer):
    node_name = serializers.CharField()


class GitLabForwardToSerializer(serializers.Serializer):
    query = serializers.JSONField(
        help_text="{and: {children: [<query>, {repo_ids: [...]} or {meta: {key: project_id, "
        "value: ^(ids)$}}]}}"
    )
    endpoint = serializers.CharField(help_text="The node's search_base_url.")


class GitLabSearchRequestSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    timeout = serializers.CharField()
    num_context_lines = serializers.IntegerField()
    max_file_match_window = serializers.IntegerField()
    max_file_match_results = serializers.IntegerField()
    max_line_match_window = serializers.IntegerField()
    max_line_match_results = serializers.IntegerField()
    max_line_match_results_per_file = serializers.IntegerField()
    forward_to = GitLabForwardToSerializer(many=True)
    file_match_offset = serializers.IntegerField(required=False, help_text="Only when above 0.")


class SearchRequestSerializer(serializers.Serializer):
    namespace_id = serializers.IntegerField()
    search_enabled = serializers.BooleanField()
    # Its codes are listed, not an enum: drf-spectacular would lift a second choice set
    # of a field named reason into a component under a generated name.
    reason = serializers.CharField(
        allow_null=True,
        help_text="Why there is no route; null when there is one: "
        + ", ".join(str(reason) for reason in REQUEST_NO_ROUTE_REASONS)
        + ".",
    )
    proxy = SearchProxySerializer(allow_null=True)
    request = GitLabSearchRequestSerializer(
        allow_null=True, help_text="GitLab's v2 body, to POST to proxy.url as it is."
    )
    unrouted_project_ids = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Requested projects no ready index serves: not in the request.",
    )


SEARCH_REQUEST_INPUT_EXAMPLE = {
    "query": {"query_string": {"query": "case:no test"}},
    "project_ids": [1, 2, 3, 4, 5, 6],
    "options": {"timeout": "30s"},
}

SEARCH_REQUEST_EXAMPLE = {
    "namespace_id": 9970,
    "search_enabled": True,
    "reason": None,
    "proxy": {
        "node_id": 2,
        "node_name": "zoekt-1",
        "search_base_url": "http://zoekt-1.zoekt:6070",
        "url": "http://zoekt-1.zoekt:6070/webserver/api/v2/search",
    },
    "request": {
        "version": 2,
        "timeout": "30s",
        "num_context_lines": 1,
        "max_file_match_window": 0,
        "max_file_match_results": 0,
        "max_line_match_window": 5000,
        "max_line_match_results": 5000,
        "max_line_match_results_per_file": 500,
        "forward_to": [
            {
                "query": {
                    "and": {
                        "children": [
                            {"query_string": {"query": "case:no test"}},
                            {"repo_ids": [1, 2]},
                        ]
                    }
                },
                "endpoint": "http://zoekt-0.zoekt:6070",
            },
            {
                "query": {
                    "and": {
                        "children": [
                            {"query_string": {"query": "case:no test"}},
                            {"repo_ids": [3, 4, 5]},
                        ]
                    }
                },
                "endpoint": "http://zoekt-1.zoekt:6070",
            },
        ],
    },
    "unrouted_project_ids": [6],
}


class SearchRequestView(APIView):
    parser_classes = [JSONParser]

    def initial(self, request, *args, **kwargs):
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > MAX_SEARCH_REQUEST_BODY_BYTES:
            raise PayloadTooLarge(f"Request body exceeds {MAX_SEARCH_REQUEST_BODY_BYTES} bytes.")
        super().initial(request, *args, **kwargs)

    @extend_schema(
        operation_id="zoekt_namespace_search_request",
        summary="GitLab's search request for a query over the projects a caller may search",
        description=(
            "The v2 body GitLab's search posts to a Zoekt webserver acting as proxy, key for "
            "key as GitLab's targets mode builds it, and the proxy to post it to "
            "(`proxy.url`, with GitLab's `Gitlab-Zoekt-Api-Request` JWT). Each requested "
            "project is in exactly one `forward_to` entry: the node whose ready index serves "
            "it (coverage routing, as search_targets); ids above 2^32-1 use GitLab's `meta` "
            "project_id form. Requested projects no ready index serves are listed in "
            "`unrouted_project_ids`. The proxy is `options.node_id` (one of the entries' "
            "nodes) or the node with the most projects, ties to the lowest id. At most "
            f"{MAX_TARGET_PROJECTS:,} projects (GitLab's RoutingService limit). No route: "
            "200 with search_enabled false, reason, and null proxy and request."
        ),
        request=SearchRequestInputSerializer,
        responses={
            200: SearchRequestSerializer,
            400: OpenApiResponse(description="A bad body: the error names the field"),
            **READ_ERRORS,
            413: OpenApiResponse(description="Body too large"),
            415: OpenApiResponse(description="Not a JSON body"),
        },
        examples=[
            OpenApiExample(
                "A query over six projects", value=SEARCH_REQUEST_INPUT_EXAMPLE, request_only=True
            ),
            OpenApiExample(
                "A plain query string",
                value={"query": "case:no test", "project_ids": [1, 2, 3]},
                request_only=True,
            ),
            OpenApiExample(
                "Two nodes, one project unrouted",
                value=SEARCH_REQUEST_EXAMPLE,
                response_only=True,
                status_codes=["200"],
            ),
            OpenApiExample(
                "None of the projects served",
                value={
                    "namespace_id": 9970,
                    "search_enabled": False,
                    "reason": "no_requested_project_served",
                    "proxy": None,
                    "request": None,
                    "unrouted_project_ids": [6],
                },
                response_only=True,
                status_codes=["200"],
            ),
            OpenApiExample(
                "Too many projects",
                value={
                    "error": f"project_ids: {too_many(30_001)}",
                    "errors": {"project_ids": [too_many(30_001)]},
                },
                response_only=True,
                status_codes=["400"],
            ),
        ],
    )
    def post(self, request, root_namespace_id: int):
        serializer = SearchRequestInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            answer = search_request(
                root_namespace_id,
                data["query"],
                data["project_ids"],
                SearchOptions(**data.get("options", {})),
            )
        except SearchRequestRejected as rejected:
            raise exceptions.ValidationError(rejected.errors) from None
        return Response(answer)
