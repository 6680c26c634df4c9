"""Request validation and reply shapes of the operator API. Serializers validate; they never write.

GitLab's admin endpoints take GitLab's parameter names. The catalog bulk
upsert takes complete rows in GitLab's column names; its JSON types are
strict (an id is a JSON integer, a flag a JSON boolean), unknown keys are
refused, and a row's references to other rows are checked by the action,
against the batch and the database together, under its lock.
"""

from __future__ import annotations

from collections import Counter

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.errors import flatten_errors
from api.serializers import MAX_BIGINT, MAX_BYTES, StrictSerializer
from zoekt.models import Namespace, ProjectFeature
from zoekt.operator_actions import known_repository_storages

MAX_INT = 2**31 - 1
# Rows per table in one catalog batch.
MAX_CATALOG_ROWS = 10_000
# GitLab's Gitlab::VisibilityLevel.
VISIBILITY_LEVELS = [(0, "private"), (10, "internal"), (20, "public")]


# --- strict JSON types ---------------------------------------------------------------------


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: refuses strings, floats and booleans."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean: refuses ``"true"``, ``1`` and the like."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    """A JSON string: refuses numbers."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerChoiceField(serializers.ChoiceField):
    """One of a few JSON integers."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


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
class VisibilityLevelField(StrictIntegerChoiceField):
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
class RepositoryAccessLevelField(StrictIntegerChoiceField):
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


def _id(**kwargs) -> StrictIntegerField:
    return StrictIntegerField(min_value=1, max_value=MAX_BIGINT, **kwargs)


def _name() -> StrictCharField:
    return StrictCharField(max_length=255)


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


class EnableNamespaceSerializer(StrictSerializer):
    """`PUT /admin/zoekt/shards/:node_id/indexed_namespaces/:namespace_id` (query or body)."""

    search = serializers.BooleanField(required=False, allow_null=True, default=None)


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


class CatalogNamespaceSerializer(StrictSerializer):
    """A row of GitLab's `namespaces` table."""

    id = _id()
    name = _name()
    path = _name()
    type = NamespaceTypeField()
    parent_id = _id(allow_null=True)
    visibility_level = VisibilityLevelField()
    archived = StrictBooleanField()


class CatalogProjectSerializer(StrictSerializer):
    """A row of GitLab's `projects` table with its feature and fork columns."""

    id = _id()
    name = _name()
    path = _name()
    namespace_id = _id()
    project_namespace_id = _id()
    visibility_level = VisibilityLevelField()
    archived = StrictBooleanField()
    repository_storage = _name()
    repository_access_level = RepositoryAccessLevelField()
    forked_from_project_id = _id(allow_null=True)

    def validate_repository_storage(self, value: str) -> str:
        known = known_repository_storages()
        if value not in known:
            raise serializers.ValidationError(
                f"Unknown repository storage {value!r}; configured: {', '.join(known)} "
                f"(ZOEKT_GITALY_STORAGES)."
            )
        return value


class CatalogProjectStatisticsSerializer(StrictSerializer):
    """A row of GitLab's `project_statistics` table."""

    project_id = _id()
    repository_size = StrictIntegerField(min_value=0, max_value=MAX_BYTES)
    storage_size = StrictIntegerField(min_value=0, max_value=MAX_BYTES)


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
        errors: dict[str, list[str]] = {}

        def duplicates(table: str, field: str, noun: str) -> None:
            rows = attrs[table]
            counts = Counter(row[field] for row in rows)
            first: dict[int, int] = {}
            for i, row in enumerate(rows):
                value = row[field]
                if counts[value] < 2:
                    continue
                if value not in first:
                    first[value] = i
                    continue
                errors.setdefault(f"{table}[{i}].{field}", []).append(
                    f"Duplicate {noun} {value}: also in {table}[{first[value]}]."
                )

        duplicates("namespaces", "id", "namespace")
        duplicates("projects", "id", "project")
        duplicates("projects", "project_namespace_id", "project namespace")
        duplicates("project_statistics", "project_id", "project")
        for i, row in enumerate(attrs["namespaces"]):
            if row["parent_id"] == row["id"]:
                errors.setdefault(f"namespaces[{i}].parent_id", []).append(
                    "A namespace cannot be its own parent."
                )
        for j, row in enumerate(attrs["projects"]):
            if row["forked_from_project_id"] == row["id"]:
                errors.setdefault(f"projects[{j}].forked_from_project_id", []).append(
                    "A project cannot be forked from itself."
                )
        if errors:
            raise serializers.ValidationError(dict(sorted(errors.items(), key=_row_order)))
        return attrs


_TABLE_ORDER = {"namespaces": 0, "projects": 1, "project_statistics": 2}


def _row_order(item: tuple[str, list[str]]) -> tuple[int, int, str]:
    key = item[0]
    table, _, rest = key.partition("[")
    index, _, field = rest.partition("].")
    return (_TABLE_ORDER.get(table, 9), int(index or 0), field)


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
