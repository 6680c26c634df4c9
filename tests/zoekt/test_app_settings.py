"""GitLab's Zoekt application settings: defaults, parsing, caching and validation (reference 8)."""

from __future__ import annotations

import dataclasses

import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.forms import modelform_factory

from zoekt import app_settings
from zoekt.app_settings import parse_duration, parse_size
from zoekt.models import ApplicationSetting

pytestmark = pytest.mark.django_db

MIB = 1024**2

# GitLab's table (reference section 8), in parsed form.
GITLAB_DEFAULTS = {
    "indexing_enabled": False,
    "search_enabled": False,
    "indexing_paused": False,
    "auto_index_root_namespace": False,
    "cache_response": True,
    "cpu_to_tasks_ratio": 1.0,
    "force_reindexing_percentage": 0.25,
    "indexing_parallelism": 1,
    "rollout_batch_size": 32,
    "lost_node_threshold_seconds": 12 * 60 * 60,
    "indexing_timeout_seconds": 30 * 60,
    "maximum_files": 500_000,
    "indexed_file_size_limit_bytes": 1_048_576,
    "trigram_max": 20_000,
    "rollout_retry_interval_seconds": 24 * 60 * 60,
    "default_number_of_replicas": 1,
    # GitLab's newer setting (GitLab.com runs the default): pending indices per node per run.
    "initial_indexing_limit": 1,
    # GitLab's newer search-health setting (its default is this project's choice).
    "max_restarts_15m": 1,
    # GitLab's SaaS-only node-level eviction, behind a setting here (off).
    "node_level_eviction_enabled": False,
    # The eviction safeguards (docs/eviction.md): on, with GitLab's MR 264628 figures.
    "node_eviction_safeguards": True,
    "eviction_sustain_seconds": 8 * 3600,
    "eviction_cooldown_seconds": 12 * 3600,
    "eviction_order": "smallest_used_first",
    "eviction_moves": True,
    "move_max_per_source": 2,
    "move_max_per_target": 2,
    "move_max_in_cluster": 10,
    "memory_pressure_moves": False,
    # Not GitLab's (GitLab never moves a placed namespace): the reconciler, on, moving two at
    # once at most (docs/balance.md).
    "rebalance_enabled": True,
    "rebalance_margin": 0.05,
    "rebalance_max_moves": 2,
    # Not GitLab's: the product spreads by default; "first_fit" is GitLab's choice.
    "placement_strategy": "balanced",
    # Memory-aware planning (docs/memory.md): off until the budget is set.
    "memory_ratio": 0.5,
    "node_memory_budget_bytes": None,
    "memory_auto_calibration": False,
    # Not GitLab's: a restarting node is left alone for 30 minutes (docs/operations.md).
    "node_restart_delay_seconds": 1800,
    # Not GitLab's: indexing work is admitted by slots and disk headroom; "gitlab" is
    # GitLab's hand-out and one pending index per node a minute (docs/scheduling.md).
    "indexing_admission": "admission",
    "indexing_temporary_space_factor": 1.0,
}


def row_values() -> dict:
    return ApplicationSetting.objects.filter(pk=1).values().get()


set_setting = app_settings.update


# --- defaults ------------------------------------------------------------------------------------


def test_the_settings_of_a_fresh_installation_are_gitlabs_defaults():
    assert not ApplicationSetting.objects.exists()
    assert dataclasses.asdict(app_settings.current()) == GITLAB_DEFAULTS
    assert ApplicationSetting.objects.count() == 1  # created with the defaults on first read


def test_the_built_in_defaults_are_gitlabs():
    assert dataclasses.asdict(app_settings.DEFAULTS) == GITLAB_DEFAULTS


def test_the_stored_text_settings_default_to_gitlabs_spelling():
    row = app_settings.load_row()
    assert (
        row.zoekt_lost_node_threshold,
        row.zoekt_indexing_timeout,
        row.zoekt_indexed_file_size_limit,
        row.zoekt_rollout_retry_interval,
    ) == ("12h", "30m", "1MB", "1d")


def test_the_indexing_timeout_goes_on_the_wire_in_seconds():
    assert app_settings.current().indexing_timeout == "1800s"


# --- parsing durations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("1m", 60, id="minutes"),
        pytest.param("90m", 5_400, id="more-than-an-hour-of-minutes"),
        pytest.param("12h", 43_200, id="hours"),
        pytest.param("2d", 172_800, id="days"),
        pytest.param(" 6h ", 21_600, id="surrounding-spaces-are-ignored"),
        pytest.param("12x", 7_200, id="an-unknown-unit-falls-back-to-the-default"),
        pytest.param("h", 7_200, id="a-missing-number-falls-back"),
        pytest.param("12", 7_200, id="a-missing-unit-falls-back"),
        pytest.param("-1h", 7_200, id="a-negative-number-falls-back"),
        pytest.param("1.5h", 7_200, id="a-fraction-falls-back"),
        pytest.param("0h", 7_200, id="zero-with-a-unit-falls-back"),
        pytest.param("12 h", 7_200, id="a-space-inside-falls-back"),
        pytest.param("1w", 7_200, id="weeks-are-not-a-unit"),
    ],
)
def test_a_duration_is_a_positive_number_of_minutes_hours_or_days(text, expected):
    assert parse_duration(text, default="2h", zero_disables=True) == expected


@pytest.mark.parametrize(
    ("text", "zero_disables", "expected"),
    [
        pytest.param("", True, None, id="blank-disables"),
        pytest.param("   ", True, None, id="spaces-only-disable"),
        pytest.param(None, True, None, id="missing-disables"),
        pytest.param("0", True, None, id="0-disables-where-allowed"),
        pytest.param("0", False, 7_200, id="0-falls-back-where-not-allowed"),
        pytest.param("", False, None, id="blank-disables-even-where-0-does-not"),
    ],
)
def test_a_blank_duration_or_0_disables_the_setting(text, zero_disables, expected):
    assert parse_duration(text, default="2h", zero_disables=zero_disables) == expected


@pytest.mark.parametrize(
    ("field", "text", "attribute", "expected"),
    [
        pytest.param(
            "zoekt_lost_node_threshold",
            "0",
            "lost_node_threshold_seconds",
            None,
            id="lost-node-threshold-0-disables",
        ),
        pytest.param(
            "zoekt_lost_node_threshold",
            "",
            "lost_node_threshold_seconds",
            None,
            id="lost-node-threshold-blank-disables",
        ),
        pytest.param(
            "zoekt_lost_node_threshold",
            "45m",
            "lost_node_threshold_seconds",
            2_700,
            id="lost-node-threshold-in-minutes",
        ),
        pytest.param(
            "zoekt_lost_node_threshold",
            "soon",
            "lost_node_threshold_seconds",
            43_200,
            id="lost-node-threshold-invalid-is-12h",
        ),
        pytest.param(
            "zoekt_rollout_retry_interval",
            "0",
            "rollout_retry_interval_seconds",
            None,
            id="retry-interval-0-never-retries",
        ),
        pytest.param(
            "zoekt_rollout_retry_interval",
            "3h",
            "rollout_retry_interval_seconds",
            10_800,
            id="retry-interval-in-hours",
        ),
        pytest.param(
            "zoekt_rollout_retry_interval",
            "1 day",
            "rollout_retry_interval_seconds",
            86_400,
            id="retry-interval-invalid-is-1d",
        ),
        pytest.param(
            "zoekt_indexing_timeout",
            "0",
            "indexing_timeout_seconds",
            1_800,
            id="indexing-timeout-0-is-not-allowed-so-30m",
        ),
        pytest.param(
            "zoekt_indexing_timeout",
            "2h",
            "indexing_timeout_seconds",
            7_200,
            id="indexing-timeout-in-hours",
        ),
        pytest.param(
            "zoekt_indexing_timeout",
            "forever",
            "indexing_timeout_seconds",
            1_800,
            id="indexing-timeout-invalid-is-30m",
        ),
    ],
)
def test_stored_durations_are_parsed_with_their_own_default(field, text, attribute, expected):
    ApplicationSetting.objects.update_or_create(pk=1, defaults={field: text})
    assert getattr(app_settings.current(), attribute) == expected


# --- parsing sizes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("100B", 100, id="bytes"),
        pytest.param("100b", 100, id="bytes-lower-case"),
        pytest.param("512KB", 512 * 1024, id="kilobytes-are-binary"),
        pytest.param("512kb", 512 * 1024, id="kilobytes-lower-case"),
        pytest.param("1MB", MIB, id="one-megabyte-is-1048576-bytes"),
        pytest.param("1mb", MIB, id="megabytes-lower-case"),
        pytest.param("3Mb", 3 * MIB, id="megabytes-mixed-case"),
        pytest.param("2GB", 2 * 1024**3, id="gigabytes-are-binary"),
        pytest.param("2gB", 2 * 1024**3, id="gigabytes-mixed-case"),
        pytest.param(" 4MB ", 4 * MIB, id="surrounding-spaces-are-ignored"),
        pytest.param("1TB", MIB, id="terabytes-fall-back-to-the-default"),
        pytest.param("MB", MIB, id="a-missing-number-falls-back"),
        pytest.param("1.5MB", MIB, id="a-fraction-falls-back"),
        pytest.param("10", MIB, id="a-missing-unit-falls-back"),
        pytest.param("1 MB", MIB, id="a-space-inside-falls-back"),
        pytest.param("", None, id="blank-disables"),
        pytest.param(None, None, id="missing-disables"),
    ],
)
def test_a_size_is_a_number_with_a_binary_unit_in_either_case(text, expected):
    assert parse_size(text, default="1MB") == expected


def test_the_stored_file_size_limit_is_parsed():
    set_setting(zoekt_indexed_file_size_limit="256kb")
    assert app_settings.current().indexed_file_size_limit_bytes == 256 * 1024


# --- the cached accessor -------------------------------------------------------------------------


def test_the_accessor_caches_the_parsed_settings_in_redis():
    current = app_settings.current()
    assert cache.get(app_settings.CACHE_KEY) == dataclasses.asdict(current)
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    ttl = client.ttl(cache.make_key(app_settings.CACHE_KEY))
    assert 0 < ttl <= settings.ZOEKT_SETTINGS_CACHE_SECONDS


def test_the_cached_settings_are_served_until_the_row_is_saved():
    assert app_settings.current().rollout_batch_size == 32
    # A write that bypasses the model (no save signal) is not seen while cached...
    ApplicationSetting.objects.filter(pk=1).update(zoekt_rollout_batch_size=64)
    assert app_settings.current().rollout_batch_size == 32
    # ...and a save through the model drops the cache.
    row = ApplicationSetting.objects.get(pk=1)
    row.zoekt_trigram_max = 30_000
    row.save()
    assert cache.get(app_settings.CACHE_KEY) is None
    current = app_settings.current()
    assert (current.rollout_batch_size, current.trigram_max) == (64, 30_000)


def test_deleting_the_row_drops_the_cache_and_brings_back_the_defaults():
    set_setting(zoekt_indexing_enabled=True)
    assert app_settings.current().indexing_enabled is True
    ApplicationSetting.objects.get(pk=1).delete()
    assert cache.get(app_settings.CACHE_KEY) is None
    assert dataclasses.asdict(app_settings.current()) == GITLAB_DEFAULTS


def test_a_cache_entry_written_by_another_version_is_reloaded_from_the_row():
    set_setting(zoekt_rollout_batch_size=7)
    cache.set(app_settings.CACHE_KEY, {"a_field_this_version_lacks": 1})
    assert app_settings.current().rollout_batch_size == 7
    assert cache.get(app_settings.CACHE_KEY)["rollout_batch_size"] == 7


# --- validation (what the admin form shows) ------------------------------------------------------

INVALID_VALUES = [
    pytest.param("zoekt_lost_node_threshold", "12x", id="lost-node-threshold-unknown-unit"),
    pytest.param("zoekt_lost_node_threshold", "0h", id="lost-node-threshold-zero-with-unit"),
    pytest.param("zoekt_rollout_retry_interval", "1w", id="retry-interval-in-weeks"),
    pytest.param("zoekt_rollout_retry_interval", "-1d", id="retry-interval-negative"),
    pytest.param("zoekt_indexing_timeout", "0", id="indexing-timeout-0"),
    pytest.param("zoekt_indexing_timeout", "", id="indexing-timeout-blank"),
    pytest.param("zoekt_indexing_timeout", "30", id="indexing-timeout-without-unit"),
    pytest.param("zoekt_eviction_sustain_period", "0", id="sustain-period-0"),
    pytest.param("zoekt_eviction_sustain_period", "8 hours", id="sustain-period-words"),
    pytest.param("zoekt_eviction_cooldown", "", id="cooldown-blank"),
    pytest.param("zoekt_eviction_order", "random", id="eviction-order-unknown"),
    pytest.param("zoekt_indexed_file_size_limit", "1TB", id="file-size-in-terabytes"),
    pytest.param("zoekt_indexed_file_size_limit", "", id="file-size-blank"),
    pytest.param("zoekt_indexed_file_size_limit", "1.5MB", id="file-size-fraction"),
    pytest.param("zoekt_cpu_to_tasks_ratio", 0.0, id="cpu-to-tasks-ratio-0"),
    pytest.param("zoekt_cpu_to_tasks_ratio", -1.0, id="cpu-to-tasks-ratio-negative"),
    pytest.param("zoekt_force_reindexing_percentage", -0.1, id="force-reindexing-below-0"),
    pytest.param("zoekt_force_reindexing_percentage", 100.1, id="force-reindexing-above-100"),
    pytest.param("zoekt_indexing_parallelism", 0, id="indexing-parallelism-0"),
    pytest.param("zoekt_rollout_batch_size", 0, id="rollout-batch-size-0"),
    pytest.param("zoekt_maximum_files", 0, id="maximum-files-0"),
    pytest.param("zoekt_trigram_max", -5, id="trigram-max-negative"),
    pytest.param("zoekt_default_number_of_replicas", 0, id="default-replicas-0"),
    pytest.param("zoekt_initial_indexing_limit", 0, id="initial-indexing-limit-0"),
    pytest.param("zoekt_initial_indexing_limit", -1, id="initial-indexing-limit-negative"),
    pytest.param("zoekt_memory_ratio", 0.0, id="memory-ratio-0"),
    pytest.param("zoekt_memory_ratio", -0.5, id="memory-ratio-negative"),
    pytest.param("zoekt_node_memory_budget_bytes", 0, id="memory-budget-0"),
    pytest.param("zoekt_node_memory_budget_bytes", -1, id="memory-budget-negative"),
    pytest.param("zoekt_node_restart_delay_seconds", 0, id="restart-delay-0"),
    pytest.param("zoekt_rebalance_margin", -0.01, id="rebalance-margin-negative"),
    pytest.param("zoekt_rebalance_margin", 1.0, id="rebalance-margin-1"),
    pytest.param("zoekt_rebalance_max_moves", 0, id="rebalance-max-moves-0"),
]

VALID_VALUES = [
    pytest.param("zoekt_lost_node_threshold", "0", id="lost-node-threshold-0"),
    pytest.param("zoekt_lost_node_threshold", "", id="lost-node-threshold-blank"),
    pytest.param("zoekt_lost_node_threshold", "90m", id="lost-node-threshold-minutes"),
    pytest.param("zoekt_rollout_retry_interval", "0", id="retry-interval-0"),
    pytest.param("zoekt_rollout_retry_interval", "2d", id="retry-interval-days"),
    pytest.param("zoekt_indexing_timeout", "1h", id="indexing-timeout-hours"),
    pytest.param("zoekt_eviction_sustain_period", "30m", id="sustain-period-minutes"),
    pytest.param("zoekt_eviction_cooldown", "1d", id="cooldown-a-day"),
    pytest.param("zoekt_eviction_order", "largest_that_fits", id="eviction-order-largest"),
    pytest.param("zoekt_indexed_file_size_limit", "2mb", id="file-size-lower-case"),
    pytest.param("zoekt_indexed_file_size_limit", "512KB", id="file-size-kilobytes"),
    pytest.param("zoekt_cpu_to_tasks_ratio", 0.5, id="cpu-to-tasks-ratio-a-half"),
    pytest.param("zoekt_force_reindexing_percentage", 0.0, id="force-reindexing-0"),
    pytest.param("zoekt_force_reindexing_percentage", 100.0, id="force-reindexing-100"),
    pytest.param("zoekt_default_number_of_replicas", 3, id="default-replicas-3"),
    pytest.param("zoekt_initial_indexing_limit", 1, id="initial-indexing-limit-1"),
    pytest.param("zoekt_initial_indexing_limit", 50, id="initial-indexing-limit-50"),
    pytest.param("zoekt_memory_ratio", 0.125, id="memory-ratio-an-eighth"),
    pytest.param("zoekt_memory_ratio", 3.0, id="memory-ratio-above-the-calibration-bounds"),
    pytest.param("zoekt_node_memory_budget_bytes", None, id="memory-budget-unset"),
    pytest.param("zoekt_node_memory_budget_bytes", 64 * 1024**3, id="memory-budget-64-gib"),
    pytest.param("zoekt_node_restart_delay_seconds", 600, id="restart-delay-10-minutes"),
    pytest.param("zoekt_rebalance_margin", 0.0, id="rebalance-margin-0"),
    pytest.param("zoekt_rebalance_margin", 0.2, id="rebalance-margin-a-fifth"),
    pytest.param("zoekt_rebalance_max_moves", 5, id="rebalance-max-moves-5"),
]


@pytest.mark.parametrize(("field", "value"), INVALID_VALUES)
def test_full_clean_names_the_field_holding_an_invalid_value(field, value):
    row = app_settings.load_row()
    before = row_values()
    setattr(row, field, value)
    with pytest.raises(ValidationError) as excinfo:
        row.full_clean()
    assert field in excinfo.value.message_dict
    assert row_values() == before


@pytest.mark.parametrize(("field", "value"), VALID_VALUES)
def test_full_clean_accepts_a_valid_value(field, value):
    row = app_settings.load_row()
    setattr(row, field, value)
    row.full_clean()
    row.save()
    assert row_values()[field] == value


SettingsForm = modelform_factory(ApplicationSetting, exclude=[])


def form_data(**changes) -> dict:
    data = {k: v for k, v in row_values().items() if k not in {"id", "updated_at"}}
    data = {k: v for k, v in data.items() if v is not False}  # unchecked boxes are absent
    return {**data, **changes}


@pytest.mark.parametrize(("field", "value"), INVALID_VALUES)
def test_the_settings_form_shows_the_error_next_to_the_field(field, value):
    row = app_settings.load_row()
    before = row_values()
    form = SettingsForm(data=form_data(**{field: value}), instance=row)
    assert not form.is_valid()
    assert field in form.errors, form.errors
    assert row_values() == before


def test_the_settings_form_saves_valid_values():
    row = app_settings.load_row()
    form = SettingsForm(
        data=form_data(zoekt_lost_node_threshold="0", zoekt_indexed_file_size_limit="2GB"),
        instance=row,
    )
    assert form.is_valid(), form.errors
    form.save()
    current = app_settings.current()
    assert current.lost_node_threshold_seconds is None
    assert current.indexed_file_size_limit_bytes == 2 * 1024**3


# --- database check constraints ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("zoekt_cpu_to_tasks_ratio", 0, id="cpu-to-tasks-ratio-0"),
        pytest.param("zoekt_cpu_to_tasks_ratio", -0.5, id="cpu-to-tasks-ratio-negative"),
        pytest.param("zoekt_force_reindexing_percentage", -0.01, id="force-reindexing-below-0"),
        pytest.param("zoekt_force_reindexing_percentage", 100.01, id="force-reindexing-above-100"),
        pytest.param("zoekt_indexing_parallelism", 0, id="indexing-parallelism-0"),
        pytest.param("zoekt_rollout_batch_size", 0, id="rollout-batch-size-0"),
        pytest.param("zoekt_maximum_files", -1, id="maximum-files-negative"),
        pytest.param("zoekt_trigram_max", 0, id="trigram-max-0"),
        pytest.param("zoekt_default_number_of_replicas", 0, id="default-replicas-0"),
        pytest.param("zoekt_initial_indexing_limit", 0, id="initial-indexing-limit-0"),
        pytest.param("zoekt_memory_ratio", 0, id="memory-ratio-0"),
        pytest.param("zoekt_node_memory_budget_bytes", 0, id="memory-budget-0"),
        pytest.param("zoekt_node_memory_budget_bytes", -5, id="memory-budget-negative"),
        pytest.param("zoekt_node_restart_delay_seconds", 0, id="restart-delay-0"),
        pytest.param("zoekt_rebalance_margin", -0.01, id="rebalance-margin-negative"),
        pytest.param("zoekt_rebalance_margin", 1, id="rebalance-margin-1"),
        pytest.param("zoekt_rebalance_max_moves", 0, id="rebalance-max-moves-0"),
    ],
)
def test_the_database_refuses_an_out_of_range_setting(field, value):
    app_settings.load_row()
    before = row_values()
    with pytest.raises(IntegrityError), transaction.atomic():
        ApplicationSetting.objects.filter(pk=1).update(**{field: value})
    assert row_values() == before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("zoekt_force_reindexing_percentage", 0, id="force-reindexing-0"),
        pytest.param("zoekt_force_reindexing_percentage", 100, id="force-reindexing-100"),
        pytest.param("zoekt_cpu_to_tasks_ratio", 0.01, id="cpu-to-tasks-ratio-small"),
        pytest.param("zoekt_initial_indexing_limit", 1, id="initial-indexing-limit-1"),
        pytest.param("zoekt_rebalance_margin", 0, id="rebalance-margin-0"),
        pytest.param("zoekt_rebalance_margin", 0.99, id="rebalance-margin-just-below-1"),
        pytest.param("zoekt_rebalance_max_moves", 1, id="rebalance-max-moves-1"),
    ],
)
def test_the_database_accepts_the_edges_of_each_range(field, value):
    app_settings.load_row()
    ApplicationSetting.objects.filter(pk=1).update(**{field: value})
    assert row_values()[field] == value


def test_there_is_only_ever_one_settings_row():
    app_settings.load_row()
    with pytest.raises(IntegrityError), transaction.atomic():
        ApplicationSetting.objects.create(id=2)
    assert list(ApplicationSetting.objects.values_list("pk", flat=True)) == [1]


def test_update_saves_and_drops_the_cached_copy():
    assert app_settings.current().memory_ratio == 0.5
    app_settings.update(zoekt_memory_ratio=0.75)
    assert app_settings.current().memory_ratio == 0.75


def test_update_with_validation_refuses_a_bad_value_and_saves_nothing():
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as raised:
        app_settings.update(validate=True, zoekt_memory_ratio=0)
    assert "zoekt_memory_ratio" in raised.value.message_dict
    assert app_settings.load_row().zoekt_memory_ratio == 0.5


# --- zoekt_initial_indexing_limit in the admin -------------------------------------------------


def admin_form(**changes):
    from zoekt.admin import SETTINGS_FIELDS, ApplicationSettingForm

    row = app_settings.load_row()
    data = {name: getattr(row, name) for name in SETTINGS_FIELDS if getattr(row, name) is not False}
    return ApplicationSettingForm(data={**data, **changes}, instance=row)


def test_the_initial_indexing_limit_is_on_the_admin_form_and_defaults_to_1():
    from zoekt.admin import SETTINGS_FIELDS

    assert "zoekt_initial_indexing_limit" in SETTINGS_FIELDS
    assert app_settings.load_row().zoekt_initial_indexing_limit == 1


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("0", id="0"),
        pytest.param("-3", id="negative"),
        pytest.param("1.5", id="not-a-whole-number"),
        pytest.param("many", id="not-a-number"),
    ],
)
def test_the_admin_refuses_an_initial_indexing_limit_below_1_naming_the_field(value):
    form = admin_form(zoekt_initial_indexing_limit=value)
    before = row_values()
    assert not form.is_valid()
    assert list(form.errors) == ["zoekt_initial_indexing_limit"]
    assert row_values() == before


def test_the_admin_saves_a_raised_initial_indexing_limit():
    form = admin_form(zoekt_initial_indexing_limit="20")
    assert form.is_valid(), form.errors
    form.save()
    assert app_settings.current().initial_indexing_limit == 20
