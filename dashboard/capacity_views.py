"""``GET /api/v1/capacity``: the provisioning status now and in 30 and 90 days, and a
what-if (docs/capacity.md, "Provisioning and what-if"). Read-only.

Served from here because the node history is the dashboard's; built on the operator
API's base (``api.operator_views.OperatorAPIView``: staff only, by DRF token or
session, the same error shape: a bad query parameter is a 400 naming it).
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from api.operator_views import OperatorAPIView
from dashboard.capacity import capacity_report
from planner.balance import BalanceError
from planner.provisioning import WhatIf
from zoekt.capacity import GIB

#: The largest size a what-if node may have: 1 PiB (a bigger number is a typing slip).
MAX_GIB = 1024.0**2


class CapacityQuerySerializer(serializers.Serializer):
    add_nodes = serializers.IntegerField(
        min_value=0, max_value=1000, default=0, help_text="nodes to add (what-if)"
    )
    disk_gib = serializers.FloatField(
        min_value=0.001,
        max_value=MAX_GIB,
        required=False,
        help_text="disk of an added node, GiB (default: median)",
    )
    memory_budget_gib = serializers.FloatField(
        min_value=0.001,
        max_value=MAX_GIB,
        required=False,
        help_text="memory budget of an added node, GiB",
    )
    remove = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        default=list,
        help_text="node id to remove (repeatable)",
    )
    replicas = serializers.IntegerField(
        min_value=1, max_value=100, required=False, help_text="replicas of every namespace"
    )
    window_days = serializers.FloatField(
        min_value=0.01, max_value=21, default=7.0, help_text="history the growth is fitted on"
    )

    def change(self) -> WhatIf | None:
        data = self.validated_data
        if not (data["add_nodes"] or data["remove"] or data.get("replicas")):
            return None
        disk, budget = data.get("disk_gib"), data.get("memory_budget_gib")
        return WhatIf(
            add_nodes=data["add_nodes"],
            disk_bytes=None if disk is None else int(disk * GIB),
            memory_budget_bytes=None if budget is None else int(budget * GIB),
            remove_node_ids=tuple(data["remove"]),
            replicas=data.get("replicas"),
        )


class CapacityView(OperatorAPIView):
    @extend_schema(
        operation_id="capacity",
        summary="The provisioning status now, in 30 and 90 days, and what a change would do",
        description=(
            "Cruise Control's provisioning status (`RIGHT_SIZED`, `UNDER_PROVISIONED`, "
            "`OVER_PROVISIONED`, `UNDECIDED`) with a recommendation, now and in 30 and 90 "
            "days from the least-squares growth of the node history (disk and the memory "
            "estimate); the nodes of the median size needed to stay under the low "
            "watermark with the configured replicas; when the fleet reaches the low "
            "watermark. With `add_nodes`, `remove` or `replicas`, a what-if: the real "
            "planner and desired balance run on a copy, with per-node figures before and "
            "after and the moves it would take. Read-only (docs/capacity.md)."
        ),
        tags=["zoekt admin"],
        parameters=[CapacityQuerySerializer],
        responses={
            200: OpenApiTypes.OBJECT,
            400: OpenApiResponse(
                OpenApiTypes.OBJECT, description="A bad parameter: {error, errors: {field}}."
            ),
            401: OpenApiResponse(OpenApiTypes.OBJECT, description="No credentials"),
            404: OpenApiResponse(
                OpenApiTypes.OBJECT, description="A node to remove that does not exist: {remove}."
            ),
            403: OpenApiResponse(OpenApiTypes.OBJECT, description="Not a staff user"),
        },
    )
    def get(self, request):
        data = {key: request.query_params.get(key) for key in request.query_params}
        data["remove"] = request.query_params.getlist("remove")
        query = CapacityQuerySerializer(data=data)
        query.is_valid(raise_exception=True)
        try:
            report = capacity_report(
                query.change(), window_days=query.validated_data["window_days"]
            )
        except BalanceError as error:
            raise NotFound({"remove": [error.message]}) from error
        return Response(report)
