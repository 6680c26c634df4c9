"""JSON schemas for the ``metadata`` columns, validated with ``jsonschema``.

Node metadata mirrors GitLab's ``zoekt_node_metadata`` schema (name,
task_count, concurrency, version; ``concurrency_override`` read when present)
and extends it with the ``process_health`` block a node reports about its two
processes (GitLab's ``process_metrics`` keys, plus the webserver's
``shards_loaded`` and this project's ``memory_limit_bytes``). Every key is
optional and additional keys are allowed, as in GitLab.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from jsonschema import Draft202012Validator

_NON_NEGATIVE_INT = {"type": "integer", "minimum": 0}

_PROCESS = {
    "type": "object",
    "properties": {
        "mmap_current": _NON_NEGATIVE_INT,
        "mmap_max": _NON_NEGATIVE_INT,
        "restarts_1m": _NON_NEGATIVE_INT,
        "restarts_5m": _NON_NEGATIVE_INT,
        "restarts_15m": _NON_NEGATIVE_INT,
        "rss_bytes": _NON_NEGATIVE_INT,
        "uptime_seconds": _NON_NEGATIVE_INT,
    },
}

_WEBSERVER = {
    "type": "object",
    "properties": {
        **_PROCESS["properties"],
        "shards_loaded": _NON_NEGATIVE_INT,
        # The memory limit the webserver runs under (its cgroup limit), when the node reports it.
        "memory_limit_bytes": _NON_NEGATIVE_INT,
    },
}

NODE_METADATA_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "zoekt_node_metadata",
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "task_count": {"type": "integer"},
        "concurrency": {"type": "integer"},
        "version": {"type": ["string", "null"]},
        "concurrency_override": {"type": ["integer", "null"]},
        "process_health": {
            "type": ["object", "null"],
            "properties": {"indexer": _PROCESS, "webserver": _WEBSERVER},
        },
    },
}

INDEX_METADATA_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "zoekt_indices_metadata",
    "type": "object",
    "properties": {
        "project_namespace_id_from": {"type": ["integer", "null"]},
        "project_namespace_id_to": {"type": ["integer", "null"]},
        "project_id_from": {"type": ["integer", "null"]},
        "project_id_to": {"type": ["integer", "null"]},
    },
}

ENABLED_NAMESPACE_METADATA_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "zoekt_enabled_namespaces_metadata",
    "type": "object",
    "properties": {
        "last_used_storage_bytes": {"type": "integer"},
        "rollout_required_storage_bytes": {"type": "integer"},
        "last_rollout_failed_at": {"type": "string", "format": "date-time"},
    },
}
ENABLED_NAMESPACE_METADATA_MAX_BYTES = 64 * 1024

_VALIDATORS = {
    id(schema): Draft202012Validator(schema)
    for schema in (NODE_METADATA_SCHEMA, INDEX_METADATA_SCHEMA, ENABLED_NAMESPACE_METADATA_SCHEMA)
}


def schema_errors(schema: dict[str, Any], value: Any) -> list[str]:
    """Every violation as ``path: message``, in a stable order."""
    validator = _VALIDATORS[id(schema)]
    errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in errors
    ]


def _django_validator(name: str, schema: dict[str, Any], max_bytes: int | None = None):
    def validate(value: Any) -> None:
        problems = schema_errors(schema, value)
        if max_bytes is not None and len(json.dumps(value)) > max_bytes:
            problems.append(f"(root): larger than {max_bytes} bytes")
        if problems:
            raise ValidationError(problems)

    # Migrations refer to validators by module path, so the name must be importable.
    validate.__name__ = validate.__qualname__ = name
    return validate


validate_node_metadata = _django_validator("validate_node_metadata", NODE_METADATA_SCHEMA)
validate_index_metadata = _django_validator("validate_index_metadata", INDEX_METADATA_SCHEMA)
validate_enabled_namespace_metadata = _django_validator(
    "validate_enabled_namespace_metadata",
    ENABLED_NAMESPACE_METADATA_SCHEMA,
    ENABLED_NAMESPACE_METADATA_MAX_BYTES,
)
