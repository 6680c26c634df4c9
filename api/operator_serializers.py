"""Request validation and reply shapes of the operator API. Serializers validate; they never write.

GitLab's admin endpoints take GitLab's parameter names. The catalog bulk
upsert takes complete rows in GitLab's column names: the body's shape (an
object of at most three tables, each a list of at most ``MAX_CATALOG_ROWS``
objects) is checked here, and the rows by ``zoekt.catalog``'s row checks, the
GitLab sync's too: strict JSON types (an id is a JSON integer, a flag a JSON
boolean), ranges, unknown keys refused, the batch against itself. A row's
references to other rows are checked by the upsert, against the batch and the
database together, under its lock.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.errors import flatten_errors
from api.serializers import StrictSerializer, StringField
from zoekt import catalog, shutdowns
from zoekt.models import ZONE_PATTERN, Namespace, ProjectFeature

ZONE_MESSAGE = (
    "A zone is 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit."
)

MAX_INT = 2**31 - 1
# Rows per table in one catalog batch.
MAX_CATALOG_ROWS = 10_000
# GitLab's Gitlab::VisibilityLevel.
VISIBILITY_LEVELS = [(0, "private"), (10, "internal"), (20, "public")]


# --- the catalog's columns, as the schema shows them --------------------------------------------
#
# The catalog's rows are checked by ``zoekt.catalog`` (the GitLab sync writes through the
# same checks); these fields only describe the columns for the OpenAPI schema.


# The three fields below describe their choices without an ``enum``: drf-spectacular
# lifts every enum into a component named after its field, and the two level sets
# (both 0, 10, 20) would collide under different names.
@extend_schema_field(
    {
        "type": "integer",
        "minimum": 0,
        "maximum": 20,
        "multipleOf": 10,
        "description": "0 private, 10 internal, 20 public (GitLab's visibility levels).",
    }
)
class VisibilityLevelField(serializers.ChoiceField):
    """GitLab's visibility level: 0 private, 10 internal, 20 public."""

    def __init__(self, **kwargs):
        super().__init__(choices=VISIBILITY_LEVELS, **kwargs)


@extend_schema_field(
    {
        "type": "integer",
        "minimum": 0,
        "maximum": 20,
        "multipleOf": 10,
        "description": "0 disabled, 10 private, 20 enabled (GitLab's feature access levels).",
    }
)
class RepositoryAccessLevelField(serializers.ChoiceField):
    """GitLab's feature access level: 0 disabled, 10 private, 20 enabled."""

    def __init__(self, **kwargs):
        super().__init__(choices=ProjectFeature.AccessLevel.choices, **kwargs)


@extend_schema_field(
    {
        "type": "string",
        "pattern": "^(Group|Project|User)$",
        "description": "Group, Project or User.",
    }
)
class NamespaceTypeField(serializers.ChoiceField):
    """`Group`, `Project` or `User`."""

    def __init__(self, **kwargs):
        super().__init__(choices=Namespace.Type.values, **kwargs)


def _id(**kwargs) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=1, max_value=catalog.MAX_ID, **kwargs)


@extend_schema_field({"type": "string", "pattern": r"\S"})
class CatalogNameField(serializers.CharField):
    """A name or a path: something besides spaces (``zoekt.catalog`` refuses a blank one)."""


def _name() -> serializers.CharField:
    return CatalogNameField(max_length=catalog.MAX_NAME_LENGTH)


# --- GitLab's admin endpoints -----------------------------------------------------------------


class NumberOfReplicasOverrideSerializer(StrictSerializer):
    """`PATCH /admin/zoekt/namespaces/:id`: an override ≥ 1, or null to clear it.

    `number_of_replicas_override` is GitLab's name; `number_of_replicas`
    is accepted as another name for it. Sending neither changes nothing.
    """

    number_of_replicas_override = serializers.IntegerField(
        min_value=1, max_value=MAX_INT, allow_null=True, required=False
    )
    number_of_replicas = serializers.IntegerField(
        min_value=1, max_value=MAX_INT, allow_null=True, required=False
    )

    def validate(self, attrs):
        if "number_of_replicas" in attrs:
            value = attrs.pop("number_of_replicas")
            if (
                "number_of_replicas_override" in attrs
                and attrs["number_of_replicas_override"] != value
            ):
                raise serializers.ValidationError(
                    {
                        "number_of_replicas": [
                            "Send number_of_replicas_override or number_of_replicas, not both."
                        ]
                    }
                )
            attrs["number_of_replicas_override"] = value
        return attrs


class StrictBooleanField(serializers.BooleanField):
    """A boolean as the schema types it: ``true``/``false`` in JSON (or null), the strings
    ``true``/``false`` in a form or a query string; not DRF's wider ``yes``, ``on``, ``1``."""

    default_error_messages = {"invalid": "Must be a valid boolean: true or false."}

    def to_internal_value(self, data):
        if isinstance(data, bool):
            return data
        if self.context.get("textual") and data in ("true", "false"):
            return data == "true"
        self.fail("invalid")


class EnableNamespaceSerializer(StrictSerializer):
    """`PUT /admin/zoekt/shards/:node_id/indexed_namespaces/:namespace_id` (query or body).

    The view passes ``textual`` in the context for a form body; the query string's
    ``search`` is checked on its own (``SearchQuerySerializer``)."""

    search = StrictBooleanField(required=False, allow_null=True, default=None)


class SearchQuerySerializer(serializers.Serializer):
    """The query string's ``search`` of the same endpoint: ``true`` or ``false``."""

    search = StrictBooleanField(required=False)


class ProjectIndexSuccessSerializer(serializers.Serializer):
    job_id = serializers.CharField(help_text="The id of the queued indexing job.")


class ZoektNodeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    index_base_url = serializers.CharField()
    search_base_url = serializers.CharField()


class IndexedNamespaceSerializer(serializers.Serializer):
    """GitLab's IndexedNamespace entity, plus `search` and `number_of_replicas_override`."""

    id = serializers.IntegerField(help_text="The enabled namespace's id.")
    zoekt_shard_id = serializers.IntegerField(
        allow_null=True, help_text="Deprecated name of zoekt_node_id (GitLab keeps both)."
    )
    zoekt_node_id = serializers.IntegerField(allow_null=True)
    namespace_id = serializers.IntegerField(help_text="The root namespace's id.")
    search = serializers.BooleanField()
    number_of_replicas_override = serializers.IntegerField(allow_null=True)

    @staticmethod
    def entity(enabled_namespace, zoekt_node_id: int | None) -> dict:
        return {
            "id": enabled_namespace.id,
            "zoekt_shard_id": zoekt_node_id,
            "zoekt_node_id": zoekt_node_id,
            "namespace_id": enabled_namespace.root_namespace_id,
            "search": enabled_namespace.search,
            "number_of_replicas_override": enabled_namespace.number_of_replicas_override,
        }


# --- the catalog bulk upsert -------------------------------------------------------------------


class _CatalogRowSerializer(serializers.Serializer):
    """A row of ``table``: a JSON object here, then ``zoekt.catalog.check_row``."""

    table: str

    def to_internal_value(self, data):
        if not isinstance(data, Mapping):
            return super().to_internal_value(data)  # DRF's "Expected a dictionary".
        row, errors = catalog.check_row(self.table, data)
        if errors:
            raise serializers.ValidationError(errors)
        return row


class CatalogNamespaceSerializer(_CatalogRowSerializer):
    """A row of GitLab's `namespaces` table."""

    table = "namespaces"

    id = _id()
    name = _name()
    path = _name()
    type = NamespaceTypeField()
    parent_id = _id(allow_null=True)
    visibility_level = VisibilityLevelField()
    archived = serializers.BooleanField()


class CatalogProjectSerializer(_CatalogRowSerializer):
    """A row of GitLab's `projects` table with its feature and fork columns."""

    table = "projects"

    id = _id()
    name = _name()
    path = _name()
    namespace_id = _id()
    project_namespace_id = _id()
    visibility_level = VisibilityLevelField()
    archived = serializers.BooleanField()
    # The storages this deployment knows (ZOEKT_GITALY_STORAGES), so the schema lists them.
    repository_storage = serializers.ChoiceField(choices=catalog.known_repository_storages())
    repository_access_level = RepositoryAccessLevelField()
    forked_from_project_id = _id(allow_null=True)


class CatalogProjectStatisticsSerializer(_CatalogRowSerializer):
    """A row of GitLab's `project_statistics` table."""

    table = "project_statistics"

    project_id = _id()
    repository_size = serializers.IntegerField(min_value=0, max_value=catalog.MAX_BYTES)
    storage_size = serializers.IntegerField(min_value=0, max_value=catalog.MAX_BYTES)


class CatalogBulkUpsertSerializer(StrictSerializer):
    """`POST /api/v1/catalog/bulk_upsert`: rows checked one by one and within the batch."""

    namespaces = CatalogNamespaceSerializer(many=True, required=False, max_length=MAX_CATALOG_ROWS)
    projects = CatalogProjectSerializer(many=True, required=False, max_length=MAX_CATALOG_ROWS)
    project_statistics = CatalogProjectStatisticsSerializer(
        many=True, required=False, max_length=MAX_CATALOG_ROWS
    )

    def to_internal_value(self, data):
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError as exc:
            raise serializers.ValidationError(flatten_errors(exc.detail)) from exc

    def validate(self, attrs):
        for table in ("namespaces", "projects", "project_statistics"):
            attrs.setdefault(table, [])
        errors = catalog.batch_errors(
            attrs["namespaces"], attrs["projects"], attrs["project_statistics"]
        )
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class CatalogTableCountsSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    updated = serializers.IntegerField()


class CatalogNamespaceCountsSerializer(CatalogTableCountsSerializer):
    descendants_updated = serializers.IntegerField(
        help_text="Database namespaces below a moved namespace whose traversal_ids changed."
    )


class CatalogRootStatisticsCountsSerializer(serializers.Serializer):
    refreshed = serializers.IntegerField(
        help_text="Root namespaces whose storage totals were recomputed."
    )


class CatalogBulkUpsertResultSerializer(serializers.Serializer):
    namespaces = CatalogNamespaceCountsSerializer()
    projects = CatalogTableCountsSerializer()
    project_statistics = CatalogTableCountsSerializer()
    namespace_root_storage_statistics = CatalogRootStatisticsCountsSerializer()


# --- node shutdown records (docs/operations.md) --------------------------------------------------


def _shutdown_reason() -> StringField:
    """A shutdown request's ``reason``, a node's or a zone's: something besides spaces (the
    schema's pattern), as ``zoekt.shutdowns`` requires, and no NUL character."""
    return StringField(
        max_length=2000,
        pattern=r"\A[^\x00]*[^\s\x00][^\x00]*\Z",
        pattern_message="must be a non-empty string saying why, without NUL characters",
        help_text="Why, for the record (an upgrade, a host reboot).",
    )


class NodeShutdownRequestSerializer(StrictSerializer):
    """``PUT /api/v1/nodes/:id/shutdown``: the request's shape (``zoekt.shutdowns`` checks
    the rest: which fields go with which type, and the target node)."""

    type = serializers.ChoiceField(
        choices=["restart", "remove", "replace"],
        help_text="`restart` (the node comes back with its data), `remove` (drain: every "
        "index is moved off the node), `replace` (drain onto `target_node_id`).",
    )
    reason = _shutdown_reason()
    allowed_delay = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=shutdowns.MAX_ALLOWED_DELAY_SECONDS,
        help_text="A restart only: seconds the node is left alone while it restarts; "
        "default the setting `zoekt_node_restart_delay_seconds` (1800).",
    )
    target_node_id = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="A replace only (and required there): the node that receives the data; "
        "another search node without a live shutdown record of its own.",
    )


class ZoneShutdownRequestSerializer(StrictSerializer):
    """``PUT /api/v1/zones/:zone/shutdown``: a restart or a removal of every node in the
    zone (one record per node)."""

    type = serializers.ChoiceField(
        choices=["restart", "remove", "replace"],
        help_text="`restart` (each node comes back with its data) or `remove` (drain every "
        "node of the zone: every index is moved to a node outside it). `replace` is one "
        "node's and is refused here (400 naming `type`).",
    )
    reason = _shutdown_reason()
    allowed_delay = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=shutdowns.MAX_ALLOWED_DELAY_SECONDS,
        help_text="A restart only: seconds each node is left alone while it restarts; "
        "default the setting `zoekt_node_restart_delay_seconds` (1800).",
    )


#: What ``PATCH /api/v1/nodes/:id`` takes as a zone besides null and the empty string,
#: published as the schema's ``pattern``: a label (``ZONE_PATTERN``, which bounds its
#: length) within spaces, which are dropped, or spaces only (no zone, as the empty string).
#: It leaves the empty string out: the schema's other branch (``maxLength: 0``) has it.
ZONE_INPUT_PATTERN = rf"^(?:\s*{ZONE_PATTERN.removeprefix('^').removesuffix('$')}\s*|\s+)$"


@extend_schema_field({"type": "string", "pattern": ZONE_INPUT_PATTERN})
class ZoneField(serializers.CharField):
    """A zone label: a JSON string (a number is not coerced to one), or null; the spaces
    around it are dropped."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class NodeZoneSerializer(StrictSerializer):
    """``PATCH /api/v1/nodes/:id``: the node's zone (its failure domain), or null for none."""

    zone = ZoneField(
        required=False,
        allow_null=True,
        allow_blank=True,
        trim_whitespace=True,
        validators=[RegexValidator(ZONE_PATTERN, ZONE_MESSAGE)],
        help_text="1 to 63 letters, digits, `.`, `_` or `-`, starting with a letter or "
        "digit (`us-east-1a`, `rack-3`); null, empty or spaces: no zone. Spaces around a "
        "label are dropped.",
    )

    def validate_zone(self, value):
        return value or None


class NodeZoneReplySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    zone = serializers.CharField(allow_null=True)


class DrainProgressSerializer(serializers.Serializer):
    """A drain's progress (``zoekt.drains.drain_progress``)."""

    indices_left = serializers.IntegerField(
        help_text="Index rows still on the node, in any state; the drain completes at 0."
    )
    indices_to_move = serializers.IntegerField(
        help_text="Of them, those not already on their way out (evicted, pending deletion)."
    )
    bytes_left = serializers.IntegerField(help_text="Their `used_storage_bytes`.")
    moves_in_flight = serializers.IntegerField(help_text="This drain's live moves.")
    moves_done = serializers.IntegerField()
    moves_parked = serializers.IntegerField()
    bytes_moved = serializers.IntegerField(help_text="The bytes of this drain's done moves.")
    first_move_started_at = serializers.DateTimeField(allow_null=True)
    observed_rate_bytes_per_second = serializers.FloatField(
        allow_null=True,
        help_text="`bytes_moved` over the time since the first move started building.",
    )
    eta_seconds = serializers.IntegerField(
        allow_null=True, help_text="`bytes_left` at the observed rate; null until a move is done."
    )
    moves_done_on_target = serializers.IntegerField(
        allow_null=True, help_text="A replace: the done moves that went to the named node."
    )


class NodeShutdownSerializer(serializers.Serializer):
    """A node shutdown record, with its computed fields."""

    id = serializers.IntegerField()
    node_id = serializers.IntegerField()
    node_name = serializers.CharField()
    type = serializers.ChoiceField(choices=["restart", "remove", "replace"])
    reason = serializers.CharField()
    requested_by = serializers.CharField()
    requested_at = serializers.DateTimeField()
    allowed_delay_seconds = serializers.IntegerField(allow_null=True)
    delay_expires_at = serializers.DateTimeField(allow_null=True)
    delay_seconds_left = serializers.IntegerField(
        allow_null=True, help_text="Seconds left of a live restart's allowed delay."
    )
    target_node_id = serializers.IntegerField(allow_null=True)
    target_node_name = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(choices=["in_progress", "stalled", "complete", "cancelled"])
    status_reason = serializers.CharField(
        allow_null=True,
        help_text="How it completed (`node_returned`, `restart_delay_expired`, "
        "`node_never_left`, `node_drained`, `shutdown_node_deleted`, `forced_delete`) or why "
        "it is stalled (`drain_no_target`, `drain_move_parked`).",
    )
    node_exists = serializers.BooleanField(help_text="False once the node row is deleted.")
    node_online = serializers.BooleanField(help_text="The node heartbeated in the last 30 s.")
    node_out_of_service = serializers.BooleanField(
        help_text="The record keeps the node from taking anything new: a restart within its "
        "delay, a live drain, or a complete drain not yet returned to service."
    )
    node_left_at = serializers.DateTimeField(
        allow_null=True, help_text="The node's last heartbeat before it was seen away."
    )
    node_returned_at = serializers.DateTimeField(
        allow_null=True, help_text="Its first heartbeat after that."
    )
    completed_at = serializers.DateTimeField(allow_null=True)
    cancelled_at = serializers.DateTimeField(allow_null=True)
    cancelled_by = serializers.CharField(allow_null=True)
    returned_to_service_at = serializers.DateTimeField(
        allow_null=True, help_text="A complete drain: when its node was returned to service."
    )
    returned_to_service_by = serializers.CharField(allow_null=True)
    drain = DrainProgressSerializer(
        allow_null=True, help_text="A remove's or a replace's progress; null for a restart."
    )
    details = serializers.JSONField()
