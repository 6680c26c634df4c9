"""Request validation for the node protocol. Serializers validate; they never write.

GitLab's node API takes literally dotted keys (``node.url``, ``disk.all``),
in JSON or form-encoded bodies, so the heartbeat serializer declares its
fields under those names. The keys a serializer declares are validated; the
others are ignored, as GitLab's API ignores undeclared parameters, so a node
newer than the control plane keeps heartbeating. The ignored keys are
collected, as dotted paths from the top of the body, in the root
serializer's ``unknown_keys`` for the view to count and log.

Error codes tell a malformed request (400: missing, of the wrong type, out of
range) from a well-formed one describing a node GitLab's model refuses (422):
the codes in ``NODE_INVALID_CODES``.
"""

from __future__ import annotations

import copy
import json
from urllib.parse import urlsplit

from django.core.validators import RegexValidator
from rest_framework import serializers

from zoekt.capacity import MAX_BYTES
from zoekt.models import Node

MAX_BIGINT = 2**63 - 1
MAX_SMALLINT = 2**15 - 1
MAX_URL_LENGTH = 1024
MAX_BODY_BYTES = 64 * 1024


# Codes of the errors that make a well-formed heartbeat a node GitLab's model would not
# save (blank or invalid URLs, no known service) or an inconsistent one: answered 422.
NODE_INVALID_CODES = frozenset({"blank", "invalid_url", "no_known_service", "exceeds_disk_all"})


#: A port, 0 to 65535, as digits.
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
#: What a node URL may be, published as the schema's ``pattern``: http(s), a host of
#: letters, digits, dots, hyphens and underscores (``zoekt-0``, ``zoekt_0.zoekt``, an IPv4
#: address), an optional port, then a path, query or fragment of printable ASCII.
NODE_URL_PATTERN = rf"\Ahttps?://[A-Za-z0-9._-]+(?::{_PORT})?(?:[/?#][!-~]*)?\Z"


#: No NUL character (DRF's ``CharField`` refuses one), as a schema ``pattern``.
NO_NUL_PATTERN = r"\A[^\x00]*\Z"


class StringField(serializers.CharField):
    """A string as the schema types it: a number is refused, not turned into its digits
    (DRF's ``CharField`` takes ``0`` as ``"0"``). Form bodies send strings only.

    Its ``pattern`` (published in the schema, and held to here) says no NUL character
    unless another is given, which must leave NUL out itself."""

    def __init__(self, *, pattern=NO_NUL_PATTERN, pattern_message=None, pattern_code=None, **kw):
        super().__init__(**kw)
        self.validators.append(
            RegexValidator(
                pattern,
                message=pattern_message or "Null characters are not allowed.",
                code=pattern_code or "null_characters_not_allowed",
            )
        )

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class NodeURLField(StringField):
    """An http(s) URL with a host; single-label hosts (``http://zoekt-0:6065``) are fine.

    Held to ``NODE_URL_PATTERN``, which the schema publishes, so a URL the schema allows is
    one the node API takes; nothing is trimmed (GitLab's API trims nothing either).
    """

    default_error_messages = {"invalid_url": "Enter an http or https URL with a host."}

    def __init__(self, **kwargs):
        super().__init__(
            max_length=MAX_URL_LENGTH,
            trim_whitespace=False,
            pattern=NODE_URL_PATTERN,
            pattern_message=self.default_error_messages["invalid_url"],
            pattern_code="invalid_url",
            **kwargs,
        )

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            self.fail("invalid_url")
        if (
            parts.scheme not in {"http", "https"}
            or not parts.hostname
            or any(c.isspace() for c in value)
        ):
            self.fail("invalid_url")
        return value


def _bytes(**kwargs) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=0, max_value=MAX_BYTES, **kwargs)


class StrictSerializer(serializers.Serializer):
    """Refuses keys it does not declare (the operator API)."""

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            unknown = sorted(set(data.keys()) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
        return super().to_internal_value(data)


class NodeAPISerializer(serializers.Serializer):
    """Validates the keys it declares and ignores the others, as GitLab's API does.

    An ignored key is appended, as its dotted path from the top of the body, to
    the root's ``unknown_keys`` (shared through the context with the serializers
    a ``JSONObjectField`` makes). ``ignored_keys`` are accepted without being
    validated or collected: parameters GitLab declares that this project does
    not use. With ``free_keys`` the undeclared keys are neither collected nor
    dropped: they are kept in the validated data as sent (free JSON).
    """

    ignored_keys: frozenset[str] = frozenset()
    free_keys: bool = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._context.setdefault("unknown_keys", [])

    @property
    def unknown_keys(self) -> list[str]:
        return self.context["unknown_keys"]

    def get_fields(self):
        """The declared fields, each a copy for this serializer, as DRF gives them, but
        cheaper: DRF deep-copies every field by running its ``__init__`` again, and a
        heartbeat builds a dozen serializers. Binding keeps a field's per-serializer state
        (its name and parent) on the copy, so a plain field is copied shallow; a field
        that holds other fields (a nested serializer, a list or dict of a child) is copied
        deep, as DRF does, so that its children are its own."""
        return {
            name: copy.deepcopy(field) if _holds_fields(field) else copy.copy(field)
            for name, field in self._declared_fields.items()
        }

    @property
    def key_path(self) -> str:
        """This serializer's place in the body: ``""`` at the top, else ``"a.b."``."""
        if self.parent is not None:
            return f"{getattr(self.parent, 'key_path', '')}{self.field_name}."
        return self.context.get("key_prefix", "")

    def to_internal_value(self, data):
        extra = []
        if hasattr(data, "keys"):
            fields = self.fields
            extra = [k for k in data if k not in fields and k not in self.ignored_keys]
            if extra and not self.free_keys:
                prefix = self.key_path
                self.unknown_keys.extend(f"{prefix}{key}" for key in extra)
        value = super().to_internal_value(data)
        if self.free_keys and extra:
            value = {**{key: data[key] for key in extra}, **value}
        return value


def _holds_fields(field: serializers.Field) -> bool:
    return isinstance(field, serializers.BaseSerializer) or hasattr(field, "child")


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
        prefix = f"{getattr(self.parent, 'key_path', '')}{self.field_name}."
        inner = self.serializer_class(data=data, context={**self.context, "key_prefix": prefix})
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


class ProcessMetricsSerializer(NodeAPISerializer):
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


class ProcessHealthSerializer(NodeAPISerializer):
    indexer = ProcessMetricsSerializer(required=False)
    webserver = WebserverMetricsSerializer(required=False)


# --- heartbeat ------------------------------------------------------------------------


class HeartbeatSerializer(NodeAPISerializer):
    """``POST /api/v4/internal/search/zoekt/<uuid>/heartbeat`` (reference 3.2)."""

    # GitLab's route parameter, which its own request specs also send in the body; the
    # path names the node.
    ignored_keys = frozenset({"uuid"})

    def get_fields(self):
        return {
            "node.url": NodeURLField(),
            "node.search_url": NodeURLField(required=False),
            # Not blank (minLength 1 in the schema), and not trimmed, as in GitLab.
            "node.name": StringField(max_length=255, trim_whitespace=False),
            "node.services": serializers.ListField(
                child=StringField(max_length=64, trim_whitespace=False),
                max_length=16,
                required=False,
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
            "node.version": StringField(max_length=255, required=False, allow_blank=True),
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
            raise serializers.ValidationError(
                {"disk.used": ["Must not exceed disk.all."]}, code="exceeds_disk_all"
            )
        # Unknown names are dropped, but a node must offer at least one service
        # (GitLab's validation; an empty list would fail the node's save).
        if "node.services" in attrs and not any(
            name in SERVICE_NAMES for name in attrs["node.services"]
        ):
            raise serializers.ValidationError(
                {"node.services": ["Must name at least one known service (zoekt)."]},
                code="no_known_service",
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


class CallbackPayloadSerializer(NodeAPISerializer):
    """The task's ``Callback.payload`` echoed back: free JSON, as in GitLab.

    Every key is kept; those this project wrote are validated when present. Without a
    ``task_id`` the callback names no task and is ignored (GitLab's ``find_by_id(nil)``).
    """

    free_keys = True

    task_id = serializers.IntegerField(min_value=1, max_value=MAX_BIGINT, required=False)
    schema_version = serializers.IntegerField(min_value=0, max_value=MAX_SMALLINT, required=False)
    service_type = StringField(max_length=64, required=False, trim_whitespace=False)


class RepoStatsSerializer(NodeAPISerializer):
    size_in_bytes = _bytes(required=False)
    index_file_count = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False)


class AdditionalPayloadSerializer(NodeAPISerializer):
    repo_stats = RepoStatsSerializer(required=False)


class CallbackSerializer(NodeAPISerializer):
    """``POST /api/v4/internal/search/zoekt/<uuid>/callback`` (reference 3.3)."""

    ignored_keys = frozenset({"uuid"})

    name = serializers.ChoiceField(choices=["index", "delete"])
    success = RequiredBooleanField()
    error = StringField(max_length=10_000, required=False, allow_blank=True)
    payload = JSONObjectField(CallbackPayloadSerializer)
    additional_payload = JSONObjectField(AdditionalPayloadSerializer, required=False)
