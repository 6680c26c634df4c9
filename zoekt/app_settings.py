"""The one accessor for GitLab's Zoekt application settings.

The values live in one database row (``ApplicationSetting``, editable in the
admin). ``current()`` returns them parsed into a frozen ``ZoektSettings``,
cached in Redis for ``ZOEKT_SETTINGS_CACHE_SECONDS`` and dropped from the
cache whenever the row is saved. Parsing follows GitLab (reference 8):
durations are ``<n>m|h|d``; sizes ``<n>B|KB|MB|GB`` in binary units; a value
that does not parse falls back to its default; a blank value, or ``0`` where
that means "off", disables the setting (``None``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time

from django.apps import apps
from django.conf import settings as django_settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from zoekt.logging import get_logger
from zoekt.outages import DATABASE_ERRORS, REDIS_ERRORS
from zoekt.reasons import Reason

log = get_logger(__name__)

CACHE_KEY = "zoekt:application-settings:v1"

_DURATION = re.compile(r"^([1-9]\d*)([mhd])$")
_SIZE = re.compile(r"^(\d+)(B|KB|MB|GB)$", re.IGNORECASE)
_DURATION_UNITS = {"m": 60, "h": 3600, "d": 86400}
_SIZE_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def development_watermarks() -> bool:
    """Whether GitLab's development node watermarks (0.98 high, 0.99 critical) are in force.

    A deployment setting (``ZOEKT_DEVELOPMENT_WATERMARKS``, read in ``config/settings.py``),
    not a column of the row: GitLab switches it with its development environment."""
    return bool(getattr(django_settings, "ZOEKT_DEVELOPMENT_WATERMARKS", False))


def parse_duration(value: str | None, *, default: str, zero_disables: bool) -> int | None:
    """Seconds, or None when blank (or ``0`` where zero disables)."""
    text = (value or "").strip()
    if not text:
        return None
    if zero_disables and text == "0":
        return None
    match = _DURATION.match(text)
    if not match:
        if text == default:
            raise ValueError(f"default duration {default!r} does not parse")
        return parse_duration(default, default=default, zero_disables=zero_disables)
    return int(match.group(1)) * _DURATION_UNITS[match.group(2)]


def parse_size(value: str | None, *, default: str) -> int | None:
    """Bytes (binary multipliers), or None when blank."""
    text = (value or "").strip()
    if not text:
        return None
    match = _SIZE.match(text)
    if not match:
        return parse_size(default, default=default) if text != default else None
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]


def read_size(text: str) -> int:
    """A size as an operator types it, ``32GB``, ``512MB`` (the other size settings' syntax,
    binary units) or a plain byte count; ``ValueError`` when it is neither."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]


def write_size(value: int) -> str:
    """A byte count in the largest unit that divides it: 34359738368 → ``32GB``."""
    for unit in ("GB", "MB", "KB"):
        if value and value % _SIZE_UNITS[unit] == 0:
            return f"{value // _SIZE_UNITS[unit]}{unit}"
    return f"{value}B"


@dataclasses.dataclass(frozen=True)
class ZoektSettings:
    """Parsed settings; field names are GitLab's keys without the ``zoekt_`` prefix."""

    indexing_enabled: bool = False
    search_enabled: bool = False
    indexing_paused: bool = False
    auto_index_root_namespace: bool = False
    cache_response: bool = True
    cpu_to_tasks_ratio: float = 1.0
    force_reindexing_percentage: float = 0.25
    indexing_parallelism: int = 1
    rollout_batch_size: int = 32
    lost_node_threshold_seconds: int | None = 12 * 3600
    indexing_timeout_seconds: int | None = 30 * 60
    maximum_files: int = 500_000
    indexed_file_size_limit_bytes: int | None = 1024**2
    trigram_max: int = 20_000
    rollout_retry_interval_seconds: int | None = 86400
    default_number_of_replicas: int = 1
    max_restarts_15m: int = 1
    #: Pending indices each online node starts per scheduling run (GitLab's default, 1).
    initial_indexing_limit: int = 1
    node_level_eviction_enabled: bool = False
    # Eviction safeguards (docs/eviction.md).
    node_eviction_safeguards: bool = True
    eviction_sustain_seconds: int = 8 * 3600
    eviction_cooldown_seconds: int = 12 * 3600
    eviction_order: str = "smallest_used_first"
    eviction_moves: bool = True
    move_max_per_source: int = 2
    move_max_per_target: int = 2
    move_max_in_cluster: int = 10
    memory_pressure_moves: bool = False
    # The rebalance reconciler (docs/balance.md).
    rebalance_enabled: bool = True
    rebalance_margin: float = 0.05
    rebalance_max_moves: int = 2
    # Memory-aware planning (docs/memory.md).
    memory_ratio: float = 0.5
    #: None (the default): memory planning is off and the plan is the disk-only plan.
    node_memory_budget_bytes: int | None = None
    memory_auto_calibration: bool = False
    # Placement (docs/planner.md): balanced, the product's default, or GitLab's first fit.
    placement_strategy: str = "balanced"
    # Node maintenance (docs/operations.md): a restart's allowed delay unless it gives one.
    node_restart_delay_seconds: int = 1800
    # Admission control of indexing work (docs/scheduling.md): "admission" or GitLab's "gitlab".
    indexing_admission: str = "admission"
    indexing_temporary_space_factor: float = 1.0

    @property
    def indexing_gate(self) -> Reason | None:
        """Why indexing work may not run now (disabled, then paused), or None.

        GitLab's gate of its scheduling, rollout and eviction workers.
        """
        if not self.indexing_enabled:
            return Reason.INDEXING_DISABLED
        if self.indexing_paused:
            return Reason.INDEXING_PAUSED
        return None

    @property
    def indexing_timeout(self) -> str:
        """The wire form of the timeout: seconds with an ``s`` suffix."""
        return f"{self.indexing_timeout_seconds or 0}s"


DEFAULTS = ZoektSettings()


def from_row(row) -> ZoektSettings:
    return ZoektSettings(
        indexing_enabled=row.zoekt_indexing_enabled,
        search_enabled=row.zoekt_search_enabled,
        indexing_paused=row.zoekt_indexing_paused,
        auto_index_root_namespace=row.zoekt_auto_index_root_namespace,
        cache_response=row.zoekt_cache_response,
        cpu_to_tasks_ratio=row.zoekt_cpu_to_tasks_ratio,
        force_reindexing_percentage=row.zoekt_force_reindexing_percentage,
        indexing_parallelism=row.zoekt_indexing_parallelism,
        rollout_batch_size=row.zoekt_rollout_batch_size,
        lost_node_threshold_seconds=parse_duration(
            row.zoekt_lost_node_threshold, default="12h", zero_disables=True
        ),
        indexing_timeout_seconds=parse_duration(
            row.zoekt_indexing_timeout, default="30m", zero_disables=False
        ),
        maximum_files=row.zoekt_maximum_files,
        indexed_file_size_limit_bytes=parse_size(row.zoekt_indexed_file_size_limit, default="1MB"),
        trigram_max=row.zoekt_trigram_max,
        rollout_retry_interval_seconds=parse_duration(
            row.zoekt_rollout_retry_interval, default="1d", zero_disables=True
        ),
        default_number_of_replicas=row.zoekt_default_number_of_replicas,
        max_restarts_15m=row.zoekt_max_restarts_15m,
        initial_indexing_limit=row.zoekt_initial_indexing_limit,
        node_level_eviction_enabled=row.zoekt_node_level_eviction_enabled,
        node_eviction_safeguards=row.zoekt_node_eviction_safeguards,
        eviction_sustain_seconds=parse_duration(
            row.zoekt_eviction_sustain_period, default="8h", zero_disables=False
        )
        or 8 * 3600,
        eviction_cooldown_seconds=parse_duration(
            row.zoekt_eviction_cooldown, default="12h", zero_disables=False
        )
        or 12 * 3600,
        eviction_order=row.zoekt_eviction_order,
        eviction_moves=row.zoekt_eviction_moves,
        move_max_per_source=row.zoekt_move_max_per_source,
        move_max_per_target=row.zoekt_move_max_per_target,
        move_max_in_cluster=row.zoekt_move_max_in_cluster,
        memory_pressure_moves=row.zoekt_memory_pressure_moves,
        rebalance_enabled=row.zoekt_rebalance_enabled,
        rebalance_margin=row.zoekt_rebalance_margin,
        rebalance_max_moves=row.zoekt_rebalance_max_moves,
        memory_ratio=row.zoekt_memory_ratio,
        node_memory_budget_bytes=row.zoekt_node_memory_budget_bytes,
        memory_auto_calibration=row.zoekt_memory_auto_calibration,
        placement_strategy=row.zoekt_placement_strategy,
        indexing_admission=row.zoekt_indexing_admission,
        indexing_temporary_space_factor=row.zoekt_indexing_temporary_space_factor,
        node_restart_delay_seconds=row.zoekt_node_restart_delay_seconds,
    )


def load_row():
    """The settings row, created with GitLab's defaults the first time it is read.

    The model comes from the app registry, not an import: ``zoekt.models``
    validates the row with this module (``ApplicationSetting.clean``) and its
    querysets read the settings through it, so this module never imports the
    models back.
    """
    row, _ = apps.get_model("zoekt", "ApplicationSetting").objects.get_or_create(id=1)
    return row


def update(validate: bool = False, **values) -> None:
    """Set columns of the settings row and save it (the save drops every cached copy).

    ``validate`` runs the model's validation first, as the admin form does.
    """
    row = load_row()
    for name, value in values.items():
        setattr(row, name, value)
    if validate:
        row.full_clean()
    row.save()


# A one-second memo in each process on top of Redis: the heartbeat reads the
# settings on every request, and a change still reaches every process within
# a second of the row being saved (the save drops the Redis entry at once).
_MEMO_SECONDS = 1.0
_memo: dict[str, tuple[float, ZoektSettings]] = {}


def current() -> ZoektSettings:
    """The settings in force: from this process's memo, Redis, or the row.

    Redis is a cache here, never a dependency: when it does not answer, the row
    is read; when the database does not answer either, the last value this
    process held serves (the node API stays up through a Redis outage, and
    through a database outage for as long as it needs only the settings)."""
    memo = _memo.get(CACHE_KEY)
    if memo is not None and memo[0] > time.monotonic():
        return memo[1]
    try:
        value = _current_from_cache()
    except DATABASE_ERRORS:
        if memo is None:
            raise
        log.warning("settings_from_process_memory", reason="database unavailable")
        value = memo[1]
    _memo[CACHE_KEY] = (time.monotonic() + _MEMO_SECONDS, value)
    return value


def _current_from_cache() -> ZoektSettings:
    try:
        cached = cache.get(CACHE_KEY)
    except REDIS_ERRORS:
        cached = None
        log.warning("settings_cache_unavailable", action="reading the row")
    if isinstance(cached, dict):
        try:
            return ZoektSettings(**cached)
        except TypeError:
            pass  # written by another version of this class: reload
    value = from_row(load_row())
    with contextlib.suppress(*REDIS_ERRORS):  # a cache: filled again next time
        cache.set(
            CACHE_KEY, dataclasses.asdict(value), django_settings.ZOEKT_SETTINGS_CACHE_SECONDS
        )
    return value


def invalidate() -> None:
    _memo.clear()
    try:
        cache.delete(CACHE_KEY)
    except REDIS_ERRORS:
        log.warning("settings_cache_unavailable", action="not invalidated")


_POSITIVE_NUMBERS = (
    "zoekt_cpu_to_tasks_ratio",
    "zoekt_indexing_parallelism",
    "zoekt_rollout_batch_size",
    "zoekt_maximum_files",
    "zoekt_trigram_max",
    "zoekt_default_number_of_replicas",
    "zoekt_node_restart_delay_seconds",
    "zoekt_rebalance_max_moves",
)


def validate_setting_values(row) -> None:
    """Field errors for text settings that would not parse (the admin shows them)."""
    errors: dict[str, str] = {}
    for field, zero_ok in (
        ("zoekt_lost_node_threshold", True),
        ("zoekt_rollout_retry_interval", True),
        ("zoekt_indexing_timeout", False),
        ("zoekt_eviction_sustain_period", False),
        ("zoekt_eviction_cooldown", False),
    ):
        text = (getattr(row, field) or "").strip()
        if zero_ok and text in {"", "0"}:
            continue
        if not _DURATION.match(text):
            hint = "0 or " if zero_ok else ""
            errors[field] = (
                f"must be {hint}a positive whole number followed by m, h or d (e.g. 12h)"
            )
    if not _SIZE.match((row.zoekt_indexed_file_size_limit or "").strip()):
        errors["zoekt_indexed_file_size_limit"] = (
            "must be a whole number followed by B, KB, MB or GB (e.g. 1MB)"
        )
    # The database's check constraints, repeated here so the error names its field.
    for field in _POSITIVE_NUMBERS:
        value = getattr(row, field)
        if isinstance(value, int | float) and not value > 0:
            errors[field] = "must be greater than 0"
    ratio = row.zoekt_memory_ratio
    if isinstance(ratio, int | float) and not (math.isfinite(ratio) and ratio > 0):
        errors["zoekt_memory_ratio"] = "must be a finite number greater than 0"
    budget = row.zoekt_node_memory_budget_bytes
    if isinstance(budget, int) and budget <= 0:
        errors["zoekt_node_memory_budget_bytes"] = (
            "must be greater than 0 (leave it blank to plan by disk alone)"
        )
    margin = row.zoekt_rebalance_margin
    if isinstance(margin, int | float) and not (math.isfinite(margin) and 0 <= margin < 1):
        errors["zoekt_rebalance_margin"] = "must be at least 0 and below 1"
    factor = row.zoekt_indexing_temporary_space_factor
    if isinstance(factor, int | float) and not (math.isfinite(factor) and factor >= 0):
        errors["zoekt_indexing_temporary_space_factor"] = "must be a finite number of at least 0"
    percentage = row.zoekt_force_reindexing_percentage
    if isinstance(percentage, int | float) and not 0 <= percentage <= 100:
        errors["zoekt_force_reindexing_percentage"] = "must be between 0 and 100"
    if errors:
        raise ValidationError(errors)


@receiver(post_save, sender="zoekt.ApplicationSetting")
@receiver(post_delete, sender="zoekt.ApplicationSetting")
def _drop_cached_settings(**_kwargs) -> None:
    invalidate()
