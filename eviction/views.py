"""The move API: ``POST /api/v1/indices/<id>/move`` moves one index by hand,
``GET /api/v1/balance`` reports the fleet's convergence to its desired balance, and
``GET /api/v1/indices/<id>/balance`` explains one index in it.

An operator endpoint beside those of ``api/``, built on the same base
(``api.operator_views.OperatorAPIView``: staff only, by DRF token or session,
the same error shape), served from here because the move machinery is this
package's and ``api`` imports only ``zoekt``. The view
authenticates, validates, makes one ``eviction.manual.do_move_index`` call
and replies: ``ObjectNotFound`` is a 404, ``Rejected`` a 400, and a
``MoveRefused`` a 400 when it can never clear as asked (the index's own node,
a node that is not a search node) or a 409 when it may (docs/operations.md).
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
)
from rest_framework import exceptions, status
from rest_framework.response import Response

from api.errors import Conflict
from api.operator_views import OperatorAPIView, api_actor
from eviction import manual, rebalance
from eviction import serializers as s

#: The OpenAPI tag of the operator endpoints.
TAG_ADMIN = ["zoekt admin"]


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(
        response=OpenApiTypes.OBJECT,
        description=f"{description}. Body: {{error: str, errors: {{field: [str]}}}}.",
    )


MOVE_EXAMPLE = {
    "move_id": 31,
    "state": "building",
    "reason": None,
    "trigger": "manual",
    "index_id": 412,
    "namespace_id": 9970,
    "source_node_id": 2,
    "target_node_id": 5,
    "target_node_name": "gitlab-zoekt-4",
    "replacement_index_id": 977,
    "bytes": 10737418240,
    "deadline_at": "2026-12-04T13:51:00Z",
    "requested_by": "ops-alice",
    "requested_reason": "rebalance before the volume resize",
    "message": "Move 31 started: the replacement builds on node 5 (gitlab-zoekt-4) while "
    "index 412 serves; it is swapped in once ready.",
}


class IndexMoveView(OperatorAPIView):
    def handle_exception(self, exc):
        if isinstance(exc, manual.MoveRefused):
            detail = {exc.field: [exc.message]}
            exc = exceptions.ValidationError(detail) if exc.never else Conflict(detail)
        return super().handle_exception(exc)

    @extend_schema(
        operation_id="index_move",
        summary="Move one index to a named node (Elasticsearch's reroute of one shard)",
        description=(
            "An ordinary move (trigger `manual`): the replacement is built on `to_node_id` "
            "while the index serves, with the move throttles, lease, deadline and retries of "
            "every move, and swapped in once ready on a searchable node; only then is the old "
            "index evicted. `201` with the move: `building`, or `planned` (`move_throttled`) "
            "when the throttles are full (it starts when a slot frees, the node asked again). "
            "Refusals carry a stable code before the sentence and write nothing: `400` naming "
            "`to_node_id` for the index's own node (`move_target_is_source`) or a node that "
            "is not a search node (`move_target_not_search_node`); `409` naming `index_id` "
            "when the index is not ready (`move_index_not_ready`) or its namespace has a live "
            "move (`move_already_moving`), and naming `to_node_id` when the node is offline, "
            "restarting, shutting down, cooling down after an eviction, holds an index of the "
            "namespace, or lacks disk or memory room (`move_target_*`); `404` for an unknown "
            "index or node."
        ),
        tags=TAG_ADMIN,
        parameters=[
            OpenApiParameter(
                "index_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="The index's id."
            )
        ],
        request=s.IndexMoveRequestSerializer,
        responses={
            201: s.IndexMoveSerializer,
            400: _error(
                "Bad input naming the field (`to_node_id`, `reason`, an unknown key), or a "
                "target that can never take the index"
            ),
            401: _error("No credentials (session or `Authorization: Token <key>`)"),
            403: _error("Authenticated, but not a staff user"),
            404: _error("No such index (`index_id`) or node (`to_node_id`)"),
            409: _error("The index or the node cannot take part now, naming the field"),
        },
        examples=[
            OpenApiExample(
                "To a named node",
                value={"to_node_id": 5, "reason": "rebalance before the volume resize"},
                request_only=True,
            ),
            OpenApiExample("Started", value=MOVE_EXAMPLE, response_only=True, status_codes=["201"]),
            OpenApiExample(
                "Refused",
                value={
                    "error": "to_node_id: move_target_cooling_down: node 5 (gitlab-zoekt-4) is "
                    "cooling down after an eviction until 2026-12-04T22:00:00+00:00; it takes "
                    "nothing.",
                    "errors": {
                        "to_node_id": [
                            "move_target_cooling_down: node 5 (gitlab-zoekt-4) is cooling "
                            "down after an eviction until 2026-12-04T22:00:00+00:00; it takes "
                            "nothing."
                        ]
                    },
                },
                response_only=True,
                status_codes=["409"],
            ),
        ],
    )
    def post(self, request, index_id: int):
        serializer = s.IndexMoveRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        done = manual.do_move_index(
            index_id,
            data["to_node_id"],
            requested_by=request.user.username,
            reason=data["reason"],
            actor=api_actor(request),
        )
        return Response(done.as_dict(), status=status.HTTP_201_CREATED)


class BalanceView(OperatorAPIView):
    @extend_schema(
        operation_id="balance",
        summary="The fleet's desired balance and the reconciler's progress towards it",
        description=(
            "Elasticsearch's `_internal/desired_balance`: per node, the figures now and in the "
            "desired layout (used bytes, memory estimate, index count, disk, memory and "
            "dominant share); the moves that get there, each with its reason and the dominant "
            "shares before and after; the indices not where they should be; the bytes left to "
            "move; the busiest node over the lower bound now and when converged (1.0 is the "
            "best any layout does); whether the fleet has converged; the rebalance "
            "reconciler's state (on, standing aside and why, its moves in flight); and its "
            "moves of the last 24 hours, with the redundant ones (an index moved twice). "
            "Read-only (docs/balance.md)."
        ),
        tags=TAG_ADMIN,
        responses={
            200: s.BalanceReportSerializer,
            401: _error("No credentials (session or `Authorization: Token <key>`)"),
            403: _error("Authenticated, but not a staff user"),
        },
    )
    def get(self, request):
        _fleet, _balance, report = rebalance.balance_report()
        return Response(report)


class IndexBalanceView(OperatorAPIView):
    @extend_schema(
        operation_id="index_balance",
        summary="One index in the desired balance (Elasticsearch's allocation explain)",
        description=(
            "Where the index is, where the desired balance wants it and why (its planned "
            "move, with the reason and the dominant shares of the busiest node, the source "
            "and the target before and after, and its place in the plan; or why it stays), "
            "and for every other node `yes` or `no` for a move there now, with every code "
            "that refuses it: the index's own (not ready, its namespace moving, moved by the "
            "reconciler in the last 24 hours, its node offline, in maintenance or settling, "
            "its node at the lower bound), the node's (offline, cooling down, shutting down, "
            "over its high memory watermark...), the index there (the namespace already has "
            "an index there, memory or disk room) and the margin. The same rules the "
            "desired balance and the reconciler apply. Read-only (docs/balance.md)."
        ),
        tags=TAG_ADMIN,
        parameters=[
            OpenApiParameter(
                "index_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="The index's id."
            )
        ],
        responses={
            200: s.IndexBalanceSerializer,
            401: _error("No credentials (session or `Authorization: Token <key>`)"),
            403: _error("Authenticated, but not a staff user"),
            404: _error("No such index (`index_id`)"),
        },
    )
    def get(self, request, index_id: int):
        _fleet, _explain, report = rebalance.index_balance_report(index_id)
        return Response(report)
