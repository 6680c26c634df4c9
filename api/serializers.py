"""Request validation for the node protocol. Serializers validate; they never write.

GitLab's node API takes literally dotted keys (``node.url``, ``disk.all``),
in JSON or form-encoded bodies, so the heartbeat serializer declares its
fields under those names. Unknown keys are refused, naming the key, so a typo
in a node's request is an error rather than a silently ignored value.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from rest_framework import serializers

from zoekt.models import Node

MAX_BIGINT = 2**63 - 1
MAX_SMALLINT = 2**15 - 1
MAX_URL_LENGTH = 1024
MAX_BODY_BYTES = 64 * 1024


class NodeURLField(serializers.CharField):
    """An http(s) URL with a host; single-label hosts (``http://zoekt-0:6065``) are fine."""

    default_error_messages = {"invalid": "Enter an http or https URL with a host."}

    def __init__(self, **kwargs):
        super().__init__(max_length=MAX_URL_LENGTH, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            self.fail("invalid")
        if (
            parts.scheme not in {"http", "https"}
            or not parts.hostname
            or any(c.isspace() for c in value)
        ):
            self.fail("invalid")
        return value


def _bytes(**kwargs) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=0, max_value=MAX_BIGINT, **kwargs)


class StrictSerializer(serializers.Serializer):
    """Refuses keys it does not declare."""

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            unknown = sorted(set(data.keys()) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
        return super().to_internal_value(data)


class JSONObjectField(serializers.Field):
    """An object: a JSON object in JSON bodies, a JSON-encoded string in form bodies."""

    default_error_messages = {"invalid": "Must be a JSON object."}

    def __init__(self, serializer_class: type[serializers.Serializer], **kwargs):
        self.serializer_class = serializer_class
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except (ValueError, RecursionError):
                self.fail("invalid")
        if not isinstance(data, dict):
            self.fail("invalid")
        inner = self.serializer_class(data=data)
        if not inner.is_valid():
            raise serializers.ValidationError(inner.errors)
        return inner.validated_data

    def to_representation(self, value):
        return value


class RequiredBooleanField(serializers.BooleanField):
    """A boolean that must be sent, in form bodies too (DRF reads absent as false there)."""

    default_empty_html = serializers.empty


# --- process_health ----------------------------------------------------------------


def _count(**kwargs) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=0, max_value=2**31 - 1, **kwargs)


class ProcessMetricsSerializer(StrictSerializer):
    """GitLab's ``process_metrics`` block, for the indexer and for the webserver."""

    mmap_current = _bytes(required=False)
    mmap_max = _bytes(required=False)
    restarts_1m = _count(required=False)
    restarts_5m = _count(required=False)
    restarts_15m = _count(required=False)
    rss_bytes = _bytes(required=False)
    uptime_seconds = _bytes(required=False)


class WebserverMetricsSerializer(ProcessMetricsSerializer):
    shards_loaded = _count(required=False)
    # This project's addition: the memory limit (cgroup) the webserver runs under.
    memory_limit_bytes = _bytes(required=False)


class ProcessHealthSerializer(StrictSerializer):
    indexer = ProcessMetricsSerializer(required=False)
    webserver = WebserverMetricsSerializer(required=False)


# --- heartbeat ------------------------------------------------------------------------


class HeartbeatSerializer(StrictSerializer):
    """``POST /api/v4/internal/search/zoekt/<uuid>/heartbeat`` (reference 3.2)."""

    def get_fields(self):
        return {
            "node.url": NodeURLField(),
            "node.search_url": NodeURLField(required=False),
            "node.name": serializers.CharField(max_length=255),
            "node.services": serializers.ListField(
                child=serializers.CharField(max_length=64), max_length=16, required=False
            ),
            "node.schema_version": serializers.IntegerField(
                min_value=0, max_value=MAX_SMALLINT, required=False
            ),
            "node.knowledge_graph_schema_version": serializers.IntegerField(
                min_value=0, max_value=MAX_SMALLINT, required=False
            ),
            "node.task_count": serializers.IntegerField(
                min_value=0, max_value=2**31 - 1, required=False
            ),
            "node.concurrency": serializers.IntegerField(
                min_value=0, max_value=100_000, required=False
            ),
            "node.version": serializers.CharField(max_length=255, required=False, allow_blank=True),
            "disk.all": _bytes(),
            "disk.used": _bytes(),
            "disk.indexed": _bytes(required=False),
            # Required by GitLab's older task endpoint, so older indexers still send it;
            # accepted and ignored (free space is disk.all - disk.used).
            "disk.free": _bytes(required=False),
            "process_health": JSONObjectField(ProcessHealthSerializer, required=False),
        }

    def validate(self, attrs):
        # DRF nests a dotted field name under its parts ({"disk": {"used": ...}});
        # hand the action the flat names the node sent.
        attrs = _flatten_dotted(attrs)
        if attrs["disk.used"] > attrs["disk.all"]:
            raise serializers.ValidationError({"disk.used": ["Must not exceed disk.all."]})
        # Unknown names are dropped, but a node must offer at least one service
        # (GitLab's validation; an empty list would fail the node's save).
        if "node.services" in attrs and not any(
            name in SERVICE_NAMES for name in attrs["node.services"]
        ):
            raise serializers.ValidationError(
                {"node.services": ["Must name at least one known service (zoekt)."]}
            )
        return attrs


# GitLab's SERVICES map, matched exactly ("zoekt", not "ZOEKT").
SERVICE_NAMES = {label: value for value, label in Node.Service.choices}


def _flatten_dotted(attrs: dict) -> dict:
    flat: dict = {}
    for key, value in attrs.items():
        if key in {"node", "disk"} and isinstance(value, dict):
            for sub, sub_value in value.items():
                flat[f"{key}.{sub}"] = sub_value
        else:
            flat[key] = value
    return flat


# --- callback -------------------------------------------------------------------------------


class CallbackPayloadSerializer(StrictSerializer):
    task_id = serializers.IntegerField(min_value=1, max_value=MAX_BIGINT)
    schema_version = serializers.IntegerField(min_value=0, max_value=MAX_SMALLINT, required=False)
    service_type = serializers.CharField(max_length=64, required=False)


class RepoStatsSerializer(StrictSerializer):
    size_in_bytes = _bytes(required=False)
    index_file_count = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False)


class AdditionalPayloadSerializer(StrictSerializer):
    repo_stats = RepoStatsSerializer(required=False)


class CallbackSerializer(StrictSerializer):
    """``POST /api/v4/internal/search/zoekt/<uuid>/callback`` (reference 3.3)."""

    name = serializers.ChoiceField(choices=["index", "delete"])
    success = RequiredBooleanField()
    error = serializers.CharField(max_length=10_000, required=False, allow_blank=True)
    payload = JSONObjectField(CallbackPayloadSerializer)
    additional_payload = JSONObjectField(AdditionalPayloadSerializer, required=False)
