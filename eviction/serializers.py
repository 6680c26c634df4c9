"""Validation of the move API's requests (``eviction.views``), and its reply's shape."""

from __future__ import annotations

from rest_framework import serializers

from api.serializers import StrictSerializer
from eviction import manual

#: The largest id PostgreSQL's bigint holds.
MAX_ID = 2**63 - 1


class IndexMoveRequestSerializer(StrictSerializer):
    """``POST /api/v1/indices/:id/move``: the request's shape; keys it does not declare are
    refused (``eviction.manual`` checks the rest)."""

    to_node_id = serializers.IntegerField(
        min_value=1, max_value=MAX_ID, help_text="The node the index moves to."
    )
    reason = serializers.CharField(
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
