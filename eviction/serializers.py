"""Validation of the move API's requests (``eviction.views``), and its reply's shape."""

from __future__ import annotations

from rest_framework import serializers

from api.serializers import StrictSerializer, StringField
from eviction import manual

#: The largest id PostgreSQL's bigint holds.
MAX_ID = 2**63 - 1


class IndexMoveRequestSerializer(StrictSerializer):
    """``POST /api/v1/indices/:id/move``: the request's shape; keys it does not declare are
    refused (``eviction.manual`` checks the rest)."""

    to_node_id = serializers.IntegerField(
        min_value=1, max_value=MAX_ID, help_text="The node the index moves to."
    )
    reason = StringField(
        required=False,
        allow_blank=True,
        default="",
        max_length=manual.MAX_REASON_LENGTH,
        help_text="Why, for the move's record.",
    )


class IndexMoveSerializer(serializers.Serializer):
    """A move by hand as created (``eviction.manual.HandMove.as_dict``)."""

    move_id = serializers.IntegerField()
    state = serializers.ChoiceField(
        choices=["planned", "building"],
        help_text="`building` on the named node, or `planned` while the throttles are full.",
    )
    reason = serializers.CharField(
        allow_null=True, help_text="Why it waits: `move_throttled` for a planned move."
    )
    trigger = serializers.CharField(help_text="`manual`.")
    index_id = serializers.IntegerField()
    namespace_id = serializers.IntegerField()
    source_node_id = serializers.IntegerField()
    target_node_id = serializers.IntegerField()
    target_node_name = serializers.CharField()
    replacement_index_id = serializers.IntegerField(
        allow_null=True, help_text="The index built on the target (null while planned)."
    )
    bytes = serializers.IntegerField(help_text="The index's used bytes when the move began.")
    deadline_at = serializers.DateTimeField(allow_null=True)
    requested_by = serializers.CharField()
    requested_reason = serializers.CharField(allow_blank=True)
    message = serializers.CharField(help_text="What happened, in a sentence.")


# --- GET /api/v1/balance ---------------------------------------------------------------


class NodeFiguresSerializer(serializers.Serializer):
    """One node's figures in one layout (``planner.balance.NodeFigures``); a share is null
    where there is no measure (no disk size; no budget or memory planning off)."""

    used_bytes = serializers.IntegerField()
    memory_bytes = serializers.IntegerField()
    index_count = serializers.IntegerField()
    disk_share = serializers.FloatField(allow_null=True)
    memory_share = serializers.FloatField(allow_null=True)
    dominant_share = serializers.FloatField(allow_null=True)


class NodeBalanceSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    name = serializers.CharField()
    receiving = serializers.BooleanField(help_text="Whether the node may take an index now.")
    now = NodeFiguresSerializer()
    desired = NodeFiguresSerializer()


class PlannedMoveSerializer(serializers.Serializer):
    """One move of the desired balance, in the order it is applied, with the dominant
    shares at its turn."""

    index_id = serializers.IntegerField()
    enabled_namespace_id = serializers.IntegerField(allow_null=True)
    from_node_id = serializers.IntegerField()
    to_node_id = serializers.IntegerField()
    bytes = serializers.IntegerField()
    memory_bytes = serializers.IntegerField()
    reason = serializers.CharField(
        help_text="`rebalance_busiest_node`, or `rebalance_next_busiest_node` when the busier "
        "nodes have nothing that qualifies."
    )
    busiest_before = serializers.FloatField()
    busiest_after = serializers.FloatField()
    source_before = serializers.FloatField()
    source_after = serializers.FloatField()
    target_before = serializers.FloatField()
    target_after = serializers.FloatField()


class BalanceOptionsSerializer(serializers.Serializer):
    margin = serializers.FloatField()
    disk_ceiling = serializers.FloatField()
    memory = serializers.BooleanField()
    high_memory_watermark = serializers.FloatField()
    max_moves = serializers.IntegerField(allow_null=True)


class LowerBoundSerializer(serializers.Serializer):
    disk = serializers.FloatField()
    memory = serializers.FloatField(allow_null=True)
    dominant = serializers.FloatField()


class OverLowerBoundEntrySerializer(serializers.Serializer):
    busiest = serializers.FloatField(allow_null=True, help_text="The busiest dominant share.")
    lower_bound = serializers.FloatField(allow_null=True)
    ratio = serializers.FloatField(
        allow_null=True, help_text="Busiest over the lower bound; 1.0 is the best any layout does."
    )


class OverLowerBoundSerializer(serializers.Serializer):
    now = OverLowerBoundEntrySerializer()
    desired = OverLowerBoundEntrySerializer(help_text="When converged.")


class StandAsideSerializer(serializers.Serializer):
    reason = serializers.CharField()
    node_ids = serializers.ListField(child=serializers.IntegerField())
    move_ids = serializers.ListField(child=serializers.IntegerField())


class ReconcilerSerializer(serializers.Serializer):
    """The rebalance reconciler's state (``eviction.rebalance.reconciler_state``)."""

    enabled = serializers.BooleanField(help_text="`zoekt_rebalance_enabled`.")
    margin = serializers.FloatField(help_text="`zoekt_rebalance_margin`.")
    max_moves = serializers.IntegerField(help_text="`zoekt_rebalance_max_moves`.")
    standing_aside = serializers.BooleanField()
    standing_aside_reason = serializers.CharField(
        allow_null=True,
        help_text="`indexing_disabled`, `indexing_paused`, `rebalance_node_over_high_watermark`, "
        "`rebalance_node_over_high_memory_watermark`, `rebalance_node_shutting_down`, "
        "`rebalance_eviction_moving` or `rebalance_drain_moving`.",
    )
    standing_aside_for = StandAsideSerializer(
        allow_null=True, help_text="The nodes or moves behind it."
    )
    moves_in_flight = serializers.IntegerField(help_text="Rebalance moves planned or building.")
    moves_building = serializers.IntegerField()
    move_ids_in_flight = serializers.ListField(child=serializers.IntegerField())
    settling_node_ids = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Nodes a move took an index off in the last 10 minutes: they shed nothing "
        "until their reported disk no longer counts it.",
    )


class Last24HoursSerializer(serializers.Serializer):
    """The rebalance moves planned, started or done in the last 24 hours."""

    window_seconds = serializers.IntegerField()
    moves = serializers.IntegerField()
    moves_by_state = serializers.DictField(child=serializers.IntegerField())
    moves_done = serializers.IntegerField()
    bytes_moved = serializers.IntegerField()
    redundant_moves = serializers.IntegerField(
        help_text="Moves of an index (by lineage) a rebalance move of the window had moved "
        "already (0: no index moved twice)."
    )
    redundant_move_ids = serializers.ListField(child=serializers.IntegerField())
    pinned_index_ids = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Indices the reconciler moved in the window: they hold their place.",
    )


class BalanceReportSerializer(serializers.Serializer):
    """``GET /api/v1/balance`` (``eviction.rebalance.balance_report``)."""

    converged = serializers.BooleanField(help_text="No move is needed.")
    complete = serializers.BooleanField()
    options = BalanceOptionsSerializer()
    lower_bound = LowerBoundSerializer()
    busiest_over_lower_bound = OverLowerBoundSerializer()
    nodes = NodeBalanceSerializer(many=True, help_text="Per node, now and desired.")
    moves = PlannedMoveSerializer(many=True)
    misplaced_index_ids = serializers.ListField(child=serializers.IntegerField())
    misplaced_count = serializers.IntegerField(help_text="Indices not where they should be.")
    bytes_to_move = serializers.IntegerField(help_text="Bytes left to move.")
    memory_bytes_to_move = serializers.IntegerField()
    held_back_index_ids = serializers.ListField(child=serializers.IntegerField())
    layout = serializers.DictField(
        child=serializers.IntegerField(), help_text="Every index's desired node, by index id."
    )
    reconciler = ReconcilerSerializer()
    last_24_hours = Last24HoursSerializer()
