"""HTTP views: authenticate, validate with a serializer, one ``do_*`` call, a small reply."""

from __future__ import annotations

import uuid

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ErrorDetail, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from api import serializers
from api.authentication import GitlabShellJWTAuthentication
from api.errors import PayloadTooLarge, UnprocessableEntity
from api.parsers import FormParser, JSONParser, MultiPartParser
from zoekt import actions, nodeapimetrics
from zoekt.logging import get_logger
from zoekt.models import Node

log = get_logger(__name__)

INVALID_UUID = {"uuid": ["Must be a valid UUID."]}


def _error_codes(detail) -> set[str]:
    if isinstance(detail, dict):
        return {code for value in detail.values() for code in _error_codes(value)}
    if isinstance(detail, list):
        return {code for value in detail for code in _error_codes(value)}
    return {detail.code if isinstance(detail, ErrorDetail) else "invalid"}


def validated(
    serializer: serializers.NodeAPISerializer,
    endpoint: str,
    uuid_text: str,
    *,
    unprocessable_codes: frozenset[str] = frozenset(),
) -> tuple[uuid.UUID, dict]:
    """The node's uuid and the validated body, or the error GitLab would answer.

    As in GitLab the body's parameters are checked first: a malformed one is a 400.
    A well-formed body whose only errors are ``unprocessable_codes`` (a node the
    model would not save), or a uuid that is not a UUID, is a 422. Undeclared keys
    are counted and logged whatever the outcome.
    """
    valid = serializer.is_valid()
    nodeapimetrics.note_unknown_keys(endpoint, uuid_text, serializer.unknown_keys)
    errors = {} if valid else dict(serializer.errors)
    if errors and not _error_codes(errors) <= unprocessable_codes:
        raise ValidationError(errors)
    try:
        node_uuid = uuid.UUID(uuid_text)
    except ValueError:
        errors.update(INVALID_UUID)
    if errors:
        raise UnprocessableEntity(errors)
    return node_uuid, serializer.validated_data


class NodeAPIView(APIView):
    """Base for the internal node API: JWT authentication, body size cap, no user."""

    node_api = True
    authentication_classes = [GitlabShellJWTAuthentication]
    permission_classes: list = []
    parser_classes = [JSONParser, FormParser, MultiPartParser]

    def initial(self, request, *args, **kwargs):
        # Refuse an oversize body before reading or parsing it.
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > serializers.MAX_BODY_BYTES:
            raise PayloadTooLarge(f"Request body exceeds {serializers.MAX_BODY_BYTES} bytes.")
        super().initial(request, *args, **kwargs)
        if len(request.body) > serializers.MAX_BODY_BYTES:
            raise PayloadTooLarge(f"Request body exceeds {serializers.MAX_BODY_BYTES} bytes.")


#: The node's uuid in the path: a UUID (anything else is answered 422, as GitLab does).
UUID_PARAMETER = OpenApiParameter(
    "uuid", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The node's uuid"
)

#: What every node endpoint may answer besides its own codes.
COMMON_RESPONSES = {
    401: OpenApiResponse(description="A missing or bad Gitlab-Shell-Api-Request token"),
    404: OpenApiResponse(description="A path that is not a node endpoint"),
    411: OpenApiResponse(description="A chunked body: send it with Content-Length"),
    413: OpenApiResponse(description="A body over the size cap"),
    503: OpenApiResponse(
        description="PostgreSQL (or the broker) unavailable; Retry-After says when to try again"
    ),
}

HEARTBEAT_EXAMPLE = {
    "node.url": "http://zoekt-0.zoekt:6065",
    "node.search_url": "http://zoekt-0.zoekt:6070",
    "node.name": "zoekt-0",
    "node.version": "v1.16.2",
    "node.schema_version": 2531,
    "node.concurrency": 8,
    "node.task_count": 0,
    "node.services": ["zoekt"],
    "disk.all": 107374182400,
    "disk.used": 32212254720,
    "disk.indexed": 21474836480,
    "process_health": {
        "indexer": {
            "rss_bytes": 536870912,
            "mmap_current": 200,
            "mmap_max": 262144,
            "restarts_1m": 0,
            "restarts_5m": 0,
            "restarts_15m": 0,
            "uptime_seconds": 86400,
        },
        "webserver": {
            "rss_bytes": 8589934592,
            "mmap_current": 12000,
            "mmap_max": 262144,
            "restarts_1m": 0,
            "restarts_5m": 0,
            "restarts_15m": 0,
            "uptime_seconds": 86400,
            "shards_loaded": 420,
        },
    },
}


class HeartbeatView(NodeAPIView):
    @extend_schema(
        operation_id="zoekt_node_heartbeat",
        summary="A node reports itself and receives its tasks",
        request=serializers.HeartbeatSerializer,
        parameters=[UUID_PARAMETER],
        responses={
            **COMMON_RESPONSES,
            200: OpenApiResponse(description="id, truncate, tasks, pull_frequency, stop_indexing"),
            400: OpenApiResponse(description="A malformed parameter"),
            422: OpenApiResponse(
                description="A node GitLab's model refuses (an empty or invalid URL, no known "
                "service), or a uuid that is not a UUID"
            ),
        },
        examples=[OpenApiExample("A node's heartbeat", value=HEARTBEAT_EXAMPLE, request_only=True)],
    )
    def post(self, request, uuid: str):
        node_uuid, data = validated(
            serializers.HeartbeatSerializer(data=request.data),
            "heartbeat",
            uuid,
            unprocessable_codes=serializers.NODE_INVALID_CODES,
        )
        reply = actions.do_heartbeat(node_uuid, data)
        return Response(reply.as_dict())


class CallbackView(NodeAPIView):
    @extend_schema(
        operation_id="zoekt_node_callback",
        summary="A node reports the result of a task",
        request=serializers.CallbackSerializer,
        parameters=[UUID_PARAMETER],
        responses={
            **COMMON_RESPONSES,
            202: OpenApiResponse(description="Accepted"),
            400: OpenApiResponse(description="A malformed parameter"),
            422: OpenApiResponse(
                description="No node has this uuid (GitLab's answer), or it is not a UUID"
            ),
        },
        examples=[
            OpenApiExample(
                "Index succeeded",
                value={
                    "name": "index",
                    "success": True,
                    "payload": {"task_id": 42, "schema_version": 2531},
                    "additional_payload": {
                        "repo_stats": {"size_in_bytes": 1048576, "index_file_count": 3}
                    },
                },
                request_only=True,
            ),
            OpenApiExample(
                "Delete failed",
                value={
                    "name": "delete",
                    "success": False,
                    "error": "disk full",
                    "payload": {"task_id": 43, "service_type": "zoekt"},
                },
                request_only=True,
            ),
        ],
    )
    def post(self, request, uuid: str):
        node_uuid, data = validated(
            serializers.CallbackSerializer(data=request.data), "callback", uuid
        )
        node = Node.objects.filter(uuid=node_uuid).first()
        log_fields = {
            "node_uuid": str(node_uuid),
            "name": data["name"],
            "success": data["success"],
            "task_id": data["payload"].get("task_id"),
            "error": data.get("error"),
            "payload": data["payload"],
            # As GitLab's line: what the indexer added (``repo_stats``), null when it sent none.
            "additional_payload": data.get("additional_payload"),
        }
        if node is None:
            log.error("callback_unknown_node", **log_fields)
            raise UnprocessableEntity({"uuid": ["No node has this uuid."]})
        outcome = actions.do_apply_callback(node, data)
        (log.info if data["success"] else log.error)(
            "callback", action=outcome.action, **log_fields
        )
        return Response(
            {"message": "accepted", "action": outcome.action}, status=status.HTTP_202_ACCEPTED
        )
