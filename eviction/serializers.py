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


# --- GET /api/v1/indices/<id>/balance ------------------------------------------------------


class NodeDecisionSerializer(serializers.Serializer):
    """Whether the index could move to one other node now (``planner.balance.NodeDecision``)."""

    node_id = serializers.IntegerField()
    name = serializers.CharField()
    decision = serializers.ChoiceField(
        choices=["yes", "no"],
        help_text="`yes`: the move is allowed and qualifies by the margin now.",
    )
    refusals = serializers.ListField(
        child=serializers.CharField(),
        help_text="Every rule refusing it, as stable codes: the index's own (as "
        "`index_refusals`), the node's (`move_target_offline`, `move_target_cooling_down`, "
        "`move_target_restarting`, `move_target_shutting_down`, "
        "`move_target_not_search_node`, `move_target_over_memory_watermark`), the index "
        "there (`move_target_holds_namespace`: the replica rule, `move_target_no_disk_room`, "
        "`move_target_no_memory_room`) and `balance_margin_not_met`.",
    )
    share_now = serializers.FloatField(allow_null=True, help_text="Its dominant share now.")
    share_with = serializers.FloatField(
        allow_null=True, help_text="Its dominant share with the index added."
    )
    desired = serializers.BooleanField(help_text="The node the desired balance puts it on.")


class IndexBalanceSerializer(serializers.Serializer):
    """``GET /api/v1/indices/<id>/balance`` (``eviction.rebalance.index_balance_report``)."""

    index_id = serializers.IntegerField()
    namespace_id = serializers.IntegerField(allow_null=True, help_text="The root namespace.")
    enabled_namespace_id = serializers.IntegerField(allow_null=True)
    replica_id = serializers.IntegerField(allow_null=True)
    bytes = serializers.IntegerField(help_text="Its used bytes: what a move carries.")
    memory_bytes = serializers.IntegerField(help_text="Its memory estimate.")
    node_id = serializers.IntegerField(help_text="The node it is on.")
    node_name = serializers.CharField()
    node_share = serializers.FloatField(allow_null=True, help_text="Its node's dominant share now.")
    node_share_without = serializers.FloatField(
        allow_null=True, help_text="Its node's dominant share once it left."
    )
    lower_bound = serializers.FloatField(
        help_text="A node at or under it sheds nothing (the fleet's lower bound)."
    )
    margin = serializers.FloatField()
    index_refusals = serializers.ListField(
        child=serializers.CharField(),
        help_text="Why it may move to no node now: `move_index_not_ready`, "
        "`move_already_moving` (its namespace has a live move), `balance_moved_recently` "
        "(the reconciler moved it in the last 24 hours), `balance_source_offline`, "
        "`balance_source_in_maintenance`, `balance_source_settling`, "
        "`balance_index_orphaned`, `balance_source_no_disk_size`, "
        "`balance_source_at_lower_bound`, `balance_source_does_not_fall`.",
    )
    desired_node_id = serializers.IntegerField(help_text="Where the desired balance puts it.")
    desired_node_name = serializers.CharField()
    stays = serializers.BooleanField(help_text="The desired balance leaves it where it is.")
    stays_reason = serializers.CharField(
        allow_null=True,
        help_text="Why it stays: the first of `index_refusals`, or "
        "`balance_no_target_qualifies`, `balance_other_moves_preferred` (other moves "
        "balance its node first), `balance_plan_capped`.",
    )
    move = PlannedMoveSerializer(
        allow_null=True, help_text="Its move in the desired balance, judged at its turn."
    )
    move_order = serializers.IntegerField(
        allow_null=True, help_text="Its move's place in the plan (1: the first)."
    )
    moves_planned = serializers.IntegerField()
    held_back = serializers.BooleanField(
        help_text="Moved by the plan and would move on from there: the next computation does."
    )
    candidate_node_ids = serializers.ListField(
        child=serializers.IntegerField(), help_text="The nodes it could move to now."
    )
    nodes = NodeDecisionSerializer(many=True, help_text="Every other node, by id.")
    reconciler = ReconcilerSerializer()
