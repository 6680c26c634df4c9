"""The operator API: GitLab's Zoekt admin endpoints and the catalog bulk upsert.

Staff only, by session or DRF token. Token authentication is tried first, so
a request without credentials is a 401 with ``WWW-Authenticate: Token`` (as
GitLab answers), and a signed-in user who is not staff is a 403. Views only
authenticate, validate, make one ``do_*`` call and reply; ``ObjectNotFound``
becomes a 404 and ``Rejected`` a 400, both in the shared error shape.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
)
from rest_framework import exceptions, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.parsers import FormParser, JSONParser
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from api import operator_serializers as s
from api.authentication import OperatorTokenAuthentication
from api.errors import Conflict, PayloadTooLarge
from zoekt import app_settings, catalog, operator_actions, shutdowns
from zoekt.audit import Actor, Via
from zoekt.logging import get_logger
from zoekt.models import ZONE_PATTERN, EnabledNamespace, Index, Node
from zoekt.operator_errors import RejectedByState

log = get_logger(__name__)

TAG_ADMIN = ["zoekt admin"]
TAG_CATALOG = ["catalog"]
INDEXING_DISABLED_MESSAGE = "application setting zoekt_indexing_enabled is not enabled"
# GitLab's MAX_RESULTS for the indexed namespaces of a node.
MAX_INDEXED_NAMESPACES = 20
# The catalog takes up to 10,000 rows a table; this leaves room for long names.
MAX_CATALOG_BODY_BYTES = 32 * 1024 * 1024


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(
        response=OpenApiTypes.OBJECT,
        description=f"{description}. Body: {{error: str, errors: {{field: [str]}}}}.",
    )


COMMON_ERRORS = {
    401: _error("No credentials (session or `Authorization: Token <key>`)"),
    403: _error("Authenticated, but not a staff user"),
    429: _error(
        "Too many wrong tokens from this address (ZOEKT_OPERATOR_TOKEN_FAILURE_RATE); "
        "`Retry-After` says when to try again"
    ),
}
GATED_ERRORS = {
    400: _error(f"Invalid parameters, or `{INDEXING_DISABLED_MESSAGE}`"),
    **COMMON_ERRORS,
}


def ensure_zoekt_indexing_enabled() -> None:
    """GitLab's ``ensure_zoekt_indexing_enabled!``: PUT and PATCH need indexing enabled."""
    if not app_settings.current().indexing_enabled:
        raise exceptions.ValidationError({"zoekt_indexing_enabled": [INDEXING_DISABLED_MESSAGE]})


def api_actor(request) -> Actor:
    """The operator behind an API request, for the audit trail."""
    return Actor.from_request(request, Via.API)


class OperatorAPIView(APIView):
    authentication_classes = [OperatorTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAdminUser]
    parser_classes = [JSONParser, FormParser]

    def handle_exception(self, exc):
        if isinstance(exc, operator_actions.ObjectNotFound):
            exc = exceptions.NotFound({exc.field: [exc.message]})
        elif isinstance(exc, RejectedByState):
            exc = Conflict(exc.errors)
        elif isinstance(exc, operator_actions.Rejected):
            exc = exceptions.ValidationError(exc.errors)
        return super().handle_exception(exc)


# --- PUT /api/v4/admin/zoekt/projects/:project_id/index ------------------------------------------


class ProjectIndexView(OperatorAPIView):
    @extend_schema(
        operation_id="zoekt_admin_index_project",
        summary="Queue indexing of a project",
        description=(
            "GitLab's `PUT /admin/zoekt/projects/:project_id/index`: queues an `index_repo` "
            "job for the project (sent after commit) and returns its job id. The job finds "
            "the project's target index in every replica of its root namespace (the Router) "
            "and creates the tasks. Needs `zoekt_indexing_enabled`."
        ),
        tags=TAG_ADMIN,
        request=None,
        responses={
            200: s.ProjectIndexSuccessSerializer,
            **GATED_ERRORS,
            404: _error("No such project"),
        },
        examples=[
            OpenApiExample(
                "Job queued",
                value={"job_id": "0b5ab36a-4c4f-44bd-8a1f-7d2f0b1c3e9a"},
                response_only=True,
                status_codes=["200"],
            )
        ],
    )
    def put(self, request, project_id: int):
        ensure_zoekt_indexing_enabled()
        job_id = operator_actions.do_enqueue_project_index(project_id, actor=api_actor(request))
        log.info(
            "operator_index_project",
            user=request.user.username,
            project_id=project_id,
            job_id=job_id,
        )
        return Response({"job_id": job_id})


# --- PATCH /api/v4/admin/zoekt/namespaces/:id ----------------------------------------------------


class NamespaceReplicasView(OperatorAPIView):
    @extend_schema(
        operation_id="zoekt_admin_update_namespace",
        summary="Set or clear a namespace's number of replicas override",
        description=(
            "GitLab's `PATCH /admin/zoekt/namespaces/:id`. `:id` is a namespace id or its "
            "URL-encoded full path; the override is set on the enabled namespace of its root. "
            "`number_of_replicas_override` must be ≥ 1, or null to clear it "
            "(`number_of_replicas` is accepted as another name). 404 when the root is not "
            "enabled. Needs `zoekt_indexing_enabled`."
        ),
        tags=TAG_ADMIN,
        parameters=[
            OpenApiParameter(
                "namespace_ref",
                OpenApiTypes.STR,
                OpenApiParameter.PATH,
                description="The namespace's id or URL-encoded full path (GitLab's `:id`).",
            )
        ],
        request=s.NumberOfReplicasOverrideSerializer,
        responses={
            200: s.IndexedNamespaceSerializer,
            **GATED_ERRORS,
            404: _error("No such namespace, or its root is not enabled"),
        },
        examples=[
            OpenApiExample(
                "Three replicas",
                value={"number_of_replicas_override": 3},
                request_only=True,
            ),
            OpenApiExample(
                "Back to the default",
                value={"number_of_replicas_override": None},
                request_only=True,
            ),
            OpenApiExample(
                "Updated",
                value={
                    "id": 12,
                    "zoekt_shard_id": None,
                    "zoekt_node_id": None,
                    "namespace_id": 9970,
                    "search": True,
                    "number_of_replicas_override": 3,
                },
                response_only=True,
                status_codes=["200"],
            ),
        ],
    )
    def patch(self, request, namespace_ref: str):
        ensure_zoekt_indexing_enabled()
        serializer = s.NumberOfReplicasOverrideSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        enabled = operator_actions.do_update_number_of_replicas_override(
            namespace_ref, serializer.validated_data, actor=api_actor(request)
        )
        log.info(
            "operator_update_namespace",
            user=request.user.username,
            enabled_namespace_id=enabled.id,
            number_of_replicas_override=enabled.number_of_replicas_override,
        )
        return Response(s.IndexedNamespaceSerializer.entity(enabled, None))


# --- GET /api/v4/admin/zoekt/shards --------------------------------------------------------------


class NodeListView(OperatorAPIView):
    @extend_schema(
        operation_id="zoekt_admin_list_nodes",
        summary="List the Zoekt nodes",
        description="GitLab's `GET /admin/zoekt/shards`: every node, by id.",
        tags=TAG_ADMIN,
        responses={200: s.ZoektNodeSerializer(many=True), **COMMON_ERRORS},
        examples=[
            OpenApiExample(
                "Two nodes",
                value=[
                    {
                        "id": 1,
                        "index_base_url": "http://zoekt-0.zoekt:6065",
                        "search_base_url": "http://zoekt-0.zoekt:6070",
                    },
                    {
                        "id": 2,
                        "index_base_url": "http://zoekt-1.zoekt:6065",
                        "search_base_url": "http://zoekt-1.zoekt:6070",
                    },
                ],
                response_only=True,
                status_codes=["200"],
            )
        ],
    )
    def get(self, request):
        nodes = Node.objects.order_by("id").values("id", "index_base_url", "search_base_url")
        return Response(s.ZoektNodeSerializer(nodes, many=True).data)


# --- /api/v4/admin/zoekt/shards/:node_id/indexed_namespaces --------------------------------------


INDEXED_NAMESPACE_EXAMPLE = {
    "id": 12,
    "zoekt_shard_id": 1,
    "zoekt_node_id": 1,
    "namespace_id": 9970,
    "search": True,
    "number_of_replicas_override": None,
}


class IndexedNamespaceListView(OperatorAPIView):
    @extend_schema(
        operation_id="zoekt_admin_list_indexed_namespaces",
        summary="The most recent enabled namespaces with an index on a node",
        description=(
            "GitLab's `GET /admin/zoekt/shards/:node_id/indexed_namespaces`: the "
            f"{MAX_INDEXED_NAMESPACES} most recently enabled namespaces that have an index on "
            "the node, newest first."
        ),
        tags=TAG_ADMIN,
        responses={
            200: s.IndexedNamespaceSerializer(many=True),
            **COMMON_ERRORS,
            404: _error("No such node"),
        },
        examples=[
            OpenApiExample(
                "One namespace",
                value=[INDEXED_NAMESPACE_EXAMPLE],
                response_only=True,
                status_codes=["200"],
            )
        ],
    )
    def get(self, request, node_id: int):
        node = operator_actions.find_node(node_id)
        on_node = Index.objects.filter(zoekt_enabled_namespace=OuterRef("pk"), zoekt_node=node)
        recent = EnabledNamespace.objects.filter(Exists(on_node)).order_by("-id")[
            :MAX_INDEXED_NAMESPACES
        ]
        return Response([s.IndexedNamespaceSerializer.entity(en, node.id) for en in recent])


class IndexedNamespaceView(OperatorAPIView):
    @extend_schema(
        operation_id="zoekt_admin_enable_namespace",
        summary="Enable a root namespace, optionally with a ready index on a node",
        description=(
            "GitLab's `PUT /admin/zoekt/shards/:node_id/indexed_namespaces/:namespace_id`: "
            "finds or creates the enabled namespace of a root namespace and sets `search` when "
            "given (query string or body). With `node_id` > 0 it also finds or creates that "
            "node's index of the namespace, directly in state `ready` and attached to the "
            "namespace's first replica (created when missing). That index **bypasses the "
            "planner**: no capacity check and no repositories until projects are indexed. "
            "`node_id` 0 only enables the namespace. A namespace that is not a root is a 400. "
            "Needs `zoekt_indexing_enabled`."
        ),
        tags=TAG_ADMIN,
        parameters=[
            OpenApiParameter(
                "search",
                OpenApiTypes.BOOL,
                OpenApiParameter.QUERY,
                required=False,
                description="Whether the namespace is used for searching (GitLab's `search`).",
            )
        ],
        request=s.EnableNamespaceSerializer,
        responses={
            200: s.IndexedNamespaceSerializer,
            **GATED_ERRORS,
            404: _error("No such node (node_id > 0) or namespace"),
        },
        examples=[
            OpenApiExample("Search disabled", value={"search": False}, request_only=True),
            OpenApiExample("Enabled", value=INDEXED_NAMESPACE_EXAMPLE, response_only=True),
        ],
    )
    def put(self, request, node_id: int, namespace_id: int):
        ensure_zoekt_indexing_enabled()
        query = s.SearchQuerySerializer(data=request.query_params.dict(), context={"textual": True})
        query.is_valid(raise_exception=True)
        data = dict(query.validated_data)
        if hasattr(request.data, "items"):
            data.update(request.data.items())
        serializer = s.EnableNamespaceSerializer(
            data=data, context={"textual": hasattr(request.data, "getlist")}
        )
        serializer.is_valid(raise_exception=True)
        result = operator_actions.do_enable_namespace(
            node_id, namespace_id, serializer.validated_data["search"], actor=api_actor(request)
        )
        log.info(
            "operator_enable_namespace",
            user=request.user.username,
            node_id=result.zoekt_node_id,
            namespace_id=namespace_id,
            enabled_namespace_id=result.enabled_namespace.id,
            enabled_namespace_created=result.enabled_namespace_created,
            index_id=result.index_id,
            index_created=result.index_created,
        )
        return Response(
            s.IndexedNamespaceSerializer.entity(result.enabled_namespace, result.zoekt_node_id)
        )

    @extend_schema(
        operation_id="zoekt_admin_disable_namespace",
        summary="Remove a namespace's indices and disable it",
        description=(
            "GitLab's `DELETE /admin/zoekt/shards/:node_id/indexed_namespaces/:namespace_id`: "
            "removes the namespace's indices on that node (every node when `node_id` is 0), then "
            "destroys the enabled namespace and its replicas. An index without repository rows "
            "is deleted at once; one with repository rows is detached and marked "
            "`pending_deletion`, so the deletion pipeline removes its data from the node first "
            "(repository rows cannot be dropped while a node holds their data). A namespace "
            "that is not enabled is a no-op. No `zoekt_indexing_enabled` check, as in GitLab."
        ),
        tags=TAG_ADMIN,
        request=None,
        responses={
            204: OpenApiResponse(description="Done (or nothing to do)"),
            **COMMON_ERRORS,
            404: _error("No such node (node_id > 0) or namespace"),
        },
    )
    def delete(self, request, node_id: int, namespace_id: int):
        result = operator_actions.do_disable_namespace(
            node_id, namespace_id, actor=api_actor(request)
        )
        log.info(
            "operator_disable_namespace", user=request.user.username, node_id=node_id, **result
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- POST /api/v1/catalog/bulk_upsert ------------------------------------------------------------


CATALOG_EXAMPLE = {
    "namespaces": [
        {
            "id": 9970,
            "name": "GitLab.org",
            "path": "gitlab-org",
            "type": "Group",
            "parent_id": None,
            "visibility_level": 20,
            "archived": False,
        },
        {
            "id": 13083,
            "name": "GitLab",
            "path": "gitlab",
            "type": "Project",
            "parent_id": 9970,
            "visibility_level": 20,
            "archived": False,
        },
    ],
    "projects": [
        {
            "id": 278964,
            "name": "GitLab",
            "path": "gitlab",
            "namespace_id": 9970,
            "project_namespace_id": 13083,
            "visibility_level": 20,
            "archived": False,
            "repository_storage": "default",
            "repository_access_level": 20,
            "forked_from_project_id": None,
        }
    ],
    "project_statistics": [
        {"project_id": 278964, "repository_size": 3221225472, "storage_size": 5368709120}
    ],
}


class CatalogBulkUpsertView(OperatorAPIView):
    parser_classes = [JSONParser]

    def initial(self, request, *args, **kwargs):
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > MAX_CATALOG_BODY_BYTES:
            raise PayloadTooLarge(f"Request body exceeds {MAX_CATALOG_BODY_BYTES} bytes.")
        super().initial(request, *args, **kwargs)

    @extend_schema(
        operation_id="catalog_bulk_upsert",
        summary="Upsert namespaces, projects and project statistics from the source of truth",
        description=(
            "Complete rows in GitLab's column names, up to "
            f"{s.MAX_CATALOG_ROWS:,} per table. Every row is checked: JSON types and ranges, "
            "duplicates, references to rows in the batch or the database, parent cycles, and "
            "that a project's `project_namespace_id` is a `Project` namespace whose parent is "
            "the project's `namespace_id`. Any bad row rejects the whole batch, naming each "
            "row and field (`projects[3].namespace_id`), and nothing is written: a 400 when a "
            "row breaks this schema or the batch repeats an id, a 409 when well-formed rows do "
            "not fit the stored catalog (a reference neither in the batch nor in the "
            "database, a cycle, a group too deep, a project namespace that cannot change; "
            "sending the missing rows first makes it succeed). "
            "Otherwise everything is written in one transaction with bulk statements: "
            "`traversal_ids` are computed from the parents (root first, ending with the "
            "namespace's own id; database descendants of a moved namespace follow it), "
            "`repository_access_level` goes to `project_features`, `forked_from_project_id` to "
            "`fork_network_members`, and `namespace_root_storage_statistics` is recomputed for "
            "every root the batch touches. The reply counts rows created and updated per table."
        ),
        tags=TAG_CATALOG,
        request=s.CatalogBulkUpsertSerializer,
        responses={
            200: s.CatalogBulkUpsertResultSerializer,
            400: _error("A row that breaks this schema: the whole batch is refused"),
            **COMMON_ERRORS,
            409: _error("Rows that do not fit the stored catalog: the whole batch is refused"),
            413: _error("Body too large"),
        },
        examples=[
            OpenApiExample("A group with one project", value=CATALOG_EXAMPLE, request_only=True),
            OpenApiExample(
                "Statistics only",
                value={
                    "project_statistics": [
                        {
                            "project_id": 278964,
                            "repository_size": 3355443200,
                            "storage_size": 5502926848,
                        }
                    ]
                },
                request_only=True,
            ),
            OpenApiExample(
                "Written",
                value={
                    "namespaces": {"created": 2, "updated": 0, "descendants_updated": 0},
                    "projects": {"created": 1, "updated": 0},
                    "project_statistics": {"created": 1, "updated": 0},
                    "namespace_root_storage_statistics": {"refreshed": 1},
                },
                response_only=True,
                status_codes=["200"],
            ),
            OpenApiExample(
                "Rejected",
                value={
                    "error": "projects[0].namespace_id: Namespace 4242 is neither in this batch "
                    "nor in the database.",
                    "errors": {
                        "projects[0].namespace_id": [
                            "Namespace 4242 is neither in this batch nor in the database."
                        ]
                    },
                },
                response_only=True,
                status_codes=["409"],
            ),
        ],
    )
    def post(self, request):
        serializer = s.CatalogBulkUpsertSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        result = catalog.do_bulk_upsert_catalog(
            data["namespaces"], data["projects"], data["project_statistics"]
        )
        log.info("catalog_bulk_upsert", user=request.user.username, **result)
        return Response(result)


# --- PUT/GET/DELETE /api/v1/nodes/:node_id/shutdown ----------------------------------------------


SHUTDOWN_EXAMPLE = {
    "id": 7,
    "node_id": 3,
    "node_name": "gitlab-zoekt-2",
    "type": "restart",
    "reason": "Zoekt 1.18 upgrade (StatefulSet rolling update)",
    "requested_by": "ops-alice",
    "requested_at": "2026-12-04T10:00:00Z",
    "allowed_delay_seconds": 1800,
    "delay_expires_at": "2026-12-04T10:30:00Z",
    "delay_seconds_left": 1500,
    "target_node_id": None,
    "target_node_name": None,
    "status": "in_progress",
    "status_reason": None,
    "node_exists": True,
    "node_online": False,
    "node_out_of_service": True,
    "node_left_at": "2026-12-04T10:01:10Z",
    "node_returned_at": None,
    "completed_at": None,
    "cancelled_at": None,
    "cancelled_by": None,
    "returned_to_service_at": None,
    "returned_to_service_by": None,
    "drain": None,
    "details": {},
}
DRAIN_EXAMPLE = {
    **SHUTDOWN_EXAMPLE,
    "type": "replace",
    "reason": "move to a 2 TiB volume",
    "allowed_delay_seconds": None,
    "delay_expires_at": None,
    "delay_seconds_left": None,
    "target_node_id": 9,
    "target_node_name": "gitlab-zoekt-5",
    "node_online": True,
    "node_left_at": None,
    "drain": {
        "indices_left": 41,
        "indices_to_move": 38,
        "bytes_left": 412316860416,
        "moves_in_flight": 3,
        "moves_done": 17,
        "moves_parked": 0,
        "bytes_moved": 231928233984,
        "first_move_started_at": "2026-12-04T10:01:00Z",
        "observed_rate_bytes_per_second": 16106127.36,
        "eta_seconds": 25600,
        "moves_done_on_target": 15,
    },
}
NODE_ID_PARAMETER = OpenApiParameter(
    "node_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="The node's id."
)


class NodeShutdownView(OperatorAPIView):
    """Elasticsearch's node shutdown API for a Zoekt node (docs/operations.md)."""

    def handle_exception(self, exc):
        if isinstance(exc, shutdowns.Conflict):
            exc = Conflict({exc.field: [exc.message]})
        return super().handle_exception(exc)

    @extend_schema(
        operation_id="node_shutdown_request",
        summary="Request a node's restart, removal or replacement (Elasticsearch's shape)",
        description=(
            "Records a shutdown request for the node and answers the record. `restart`: for "
            "`allowed_delay` seconds (default the setting `zoekt_node_restart_delay_seconds`, "
            "1800) the node keeps every index: it is not handled as lost, not re-indexed, "
            "gets no new placement and no eviction or move, and search prefers other copies "
            "of each range. The record completes by itself when the node heartbeats again "
            "after being away with its indexed bytes agreeing with its ready indices "
            "(`node_returned`), or when the delay passes (`restart_delay_expired`: today's "
            "lost-node handling applies again; `node_never_left`). `remove`: the node is "
            "drained: every index is moved off it (trigger `drain`, biggest first, within the "
            "move throttles, each swapped only once its replacement serves); it takes nothing "
            "new; the record is `stalled` while an index has nowhere to go and completes "
            "(`node_drained`) when the node holds no index. `replace`: the same, each move "
            "placed on `target_node_id` where it fits, elsewhere (recorded) where it does not. "
            "`allowed_delay` goes with a restart only, `target_node_id` with a replace only "
            "(required there; a 400 naming it when missing, the node itself, not a "
            "search node, or a node with a live record of its own or drained; a 404 naming it "
            "when no such node exists). One live record "
            "per node: a second request is a 409 naming `node_id` until the first completes or "
            "is cancelled (also while the node receives a live replace's data)."
        ),
        tags=TAG_ADMIN,
        parameters=[NODE_ID_PARAMETER],
        request=s.NodeShutdownRequestSerializer,
        responses={
            201: s.NodeShutdownSerializer,
            400: _error(
                "Bad input, naming the field (`type`, `reason`, `allowed_delay`, `target_node_id`)"
            ),
            **COMMON_ERRORS,
            404: _error("No such node (`node_id`), or no such target node (`target_node_id`)"),
            409: _error("The node already has a live shutdown record"),
        },
        examples=[
            OpenApiExample(
                "Restart for an upgrade",
                value={"type": "restart", "reason": "Zoekt 1.18 upgrade", "allowed_delay": 1800},
                request_only=True,
            ),
            OpenApiExample(
                "Replace onto a bigger node",
                value={"type": "replace", "reason": "bigger volume", "target_node_id": 9},
                request_only=True,
            ),
            OpenApiExample(
                "Recorded", value=SHUTDOWN_EXAMPLE, response_only=True, status_codes=["201"]
            ),
        ],
    )
    def put(self, request, node_id: int):
        serializer = s.NodeShutdownRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        record = shutdowns.do_request_node_shutdown(
            node_id,
            type=data["type"],
            reason=data["reason"],
            requested_by=request.user.username,
            allowed_delay=data.get("allowed_delay"),
            target_node_id=data.get("target_node_id"),
            actor=api_actor(request),
        )
        return Response(shutdowns.describe(record), status=status.HTTP_201_CREATED)

    @extend_schema(
        operation_id="node_shutdown_status",
        summary="A node's shutdown record: the live one, else the latest",
        description=(
            "The record with its computed fields: `delay_seconds_left` of a live restart, "
            "`node_online` (a heartbeat in the last 30 s), `node_out_of_service`, and for a "
            "remove or a replace its `drain` progress: indices and bytes left, moves in "
            "flight and done, bytes moved, the observed rate and the ETA. 404 when the node "
            "has none."
        ),
        tags=TAG_ADMIN,
        parameters=[NODE_ID_PARAMETER],
        responses={
            200: s.NodeShutdownSerializer,
            **COMMON_ERRORS,
            404: _error("No shutdown record for this node"),
        },
        examples=[
            OpenApiExample(
                "Restarting", value=SHUTDOWN_EXAMPLE, response_only=True, status_codes=["200"]
            ),
            OpenApiExample(
                "Replacing", value=DRAIN_EXAMPLE, response_only=True, status_codes=["200"]
            ),
        ],
    )
    def get(self, request, node_id: int):
        record = shutdowns.current_record(node_id)
        if record is None:
            raise exceptions.NotFound({"node_id": [f"node {node_id} has no shutdown record."]})
        return Response(shutdowns.describe(record))

    @extend_schema(
        operation_id="node_shutdown_cancel",
        summary="Cancel a node's live shutdown record, or return a drained node to service",
        description=(
            "The live record becomes `cancelled`, with the operator's name and the time; the "
            "node is under the usual rules again at once. A drain cancelled in the middle "
            "winds its moves down in the same transaction (`details.cancel`): moves past "
            "building finish, planned ones are cancelled and building ones parked "
            "(`drain_cancelled`: the replacement retired, the old copy still serves). With no "
            "live record, a node whose drain is complete is returned to service (it takes "
            "placements again; `returned_to_service_at` and `_by`). 404 when there is neither."
        ),
        tags=TAG_ADMIN,
        parameters=[NODE_ID_PARAMETER],
        responses={
            200: s.NodeShutdownSerializer,
            **COMMON_ERRORS,
            404: _error("No such node, or no live record and no complete drain to undo"),
        },
    )
    def delete(self, request, node_id: int):
        record = shutdowns.do_cancel_node_shutdown(
            node_id, cancelled_by=request.user.username, actor=api_actor(request)
        )
        return Response(shutdowns.describe(record))


# --- PATCH /api/v1/nodes/:node_id: the node's zone ------------------------------------------------


class NodeView(OperatorAPIView):
    """The operator's settings of one node: its zone (docs/planner.md, "Zones")."""

    @extend_schema(
        operation_id="node_update",
        summary="Set or clear a node's zone (its failure domain)",
        description=(
            "The zone is the operator's: GitLab's nodes report none. With zones set, the "
            "replicas of a namespace go to distinct zones where the zones allow it (a "
            "`zone_shared` warning in the plan where they do not), moves prefer a zone no "
            "other replica of the namespace occupies, and the desired balance never breaks "
            "the rule. null or an empty string clears it. A 400 names `zone` for a label "
            "that is not one (1 to 63 letters, digits, `.`, `_` or `-`, starting with a "
            "letter or digit). Recorded in the audit trail."
        ),
        tags=TAG_ADMIN,
        parameters=[NODE_ID_PARAMETER],
        request=s.NodeZoneSerializer,
        responses={
            200: s.NodeZoneReplySerializer,
            400: _error("Bad input, naming the field (`zone`)"),
            **COMMON_ERRORS,
            404: _error("No such node"),
        },
        examples=[
            OpenApiExample("Set", value={"zone": "eu-west-1a"}, request_only=True),
            OpenApiExample("Clear", value={"zone": None}, request_only=True),
        ],
    )
    def patch(self, request, node_id: int):
        serializer = s.NodeZoneSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if "zone" not in serializer.validated_data:
            # A PATCH that names no field changes nothing: the node as it is.
            node = operator_actions.find_node(node_id)
            return Response({"id": node.id, "name": node.name, "zone": node.zone})
        node = operator_actions.do_set_node_zone(
            node_id, serializer.validated_data["zone"], actor=api_actor(request)
        )
        return Response({"id": node.id, "name": node.name, "zone": node.zone})


# --- /api/v1/zones/:zone/shutdown: every node of a zone ---------------------------------------


ZONE_PARAMETER = OpenApiParameter(
    "zone",
    {"type": "string", "pattern": ZONE_PATTERN, "maxLength": 63},
    OpenApiParameter.PATH,
    description="The zone's label.",
)


class ZoneShutdownView(NodeShutdownView):
    """The node shutdown API for every node of a zone: one record per node."""

    @extend_schema(
        operation_id="zone_shutdown_request",
        summary="Restart or drain every node of a zone",
        description=(
            "One shutdown record per node of the zone, each the node's own request (the "
            "same rules as `PUT /api/v1/nodes/:id/shutdown`), written together or not at "
            "all. `remove` drains every node of the zone: its indices move to nodes outside "
            "it, each swapped in only once its replacement serves, so no namespace loses "
            "its ready copy; it is refused (400 naming `zone`) when no search node outside "
            "the zone is in service to receive them. A `replace` is one node's (400 naming "
            "`type`). 404 when no node is in the zone; 409 naming `zone` when one of its "
            "nodes has a live record already."
        ),
        tags=TAG_ADMIN,
        parameters=[ZONE_PARAMETER],
        request=s.ZoneShutdownRequestSerializer,
        responses={
            201: s.NodeShutdownSerializer(many=True),
            400: _error("Bad input, naming the field (`type`, `reason`, `allowed_delay`, `zone`)"),
            **COMMON_ERRORS,
            404: _error("No node in the zone"),
            409: _error("A node of the zone already has a live shutdown record"),
        },
        examples=[
            OpenApiExample(
                "Drain a zone",
                value={"type": "remove", "reason": "zone eu-west-1a retired"},
                request_only=True,
            ),
        ],
    )
    def put(self, request, zone: str):
        serializer = s.ZoneShutdownRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        records = shutdowns.do_request_zone_shutdown(
            zone,
            type=data["type"],
            reason=data["reason"],
            requested_by=request.user.username,
            allowed_delay=data.get("allowed_delay"),
            actor=api_actor(request),
        )
        return Response(
            [shutdowns.describe(record) for record in records], status=status.HTTP_201_CREATED
        )

    @extend_schema(
        operation_id="zone_shutdown_status",
        summary="The shutdown records of a zone's nodes: each node's live one, else its latest",
        tags=TAG_ADMIN,
        parameters=[ZONE_PARAMETER],
        responses={
            200: s.NodeShutdownSerializer(many=True),
            **COMMON_ERRORS,
            404: _error("No node of the zone has a shutdown record"),
        },
    )
    def get(self, request, zone: str):
        records = shutdowns.zone_records(zone)
        if not records:
            raise exceptions.NotFound({"zone": [f"no node of zone {zone} has a shutdown record."]})
        return Response([shutdowns.describe(record) for record in records])

    @extend_schema(
        operation_id="zone_shutdown_cancel",
        summary="Cancel the live records of a zone's nodes, or return its drained nodes",
        tags=TAG_ADMIN,
        parameters=[ZONE_PARAMETER],
        responses={
            200: s.NodeShutdownSerializer(many=True),
            **COMMON_ERRORS,
            404: _error("No node in the zone, or none with anything to cancel"),
        },
    )
    def delete(self, request, zone: str):
        records = shutdowns.do_cancel_zone_shutdown(
            zone, cancelled_by=request.user.username, actor=api_actor(request)
        )
        return Response([shutdowns.describe(record) for record in records])
