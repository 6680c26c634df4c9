"""Step 2: estimated vs observed memory per node, the metrics log, and auto-calibration."""

from __future__ import annotations

from datetime import timedelta

import pytest

from config.celery import BEAT_SCHEDULE
from tests.locking import advisory_lock_held_elsewhere
from tests.memory.helpers import GIB, capture, node, placed, records, set_setting
from zoekt import app_settings, memory
from zoekt.locks import LockKey
from zoekt.models import ApplicationSetting, Index
from zoekt.tasks import calibrate_memory_ratio_task, log_node_memory_task

pytestmark = pytest.mark.django_db

DISK = 100 * GIB


def report_of(target) -> memory.NodeMemory:
    (entry,) = [e for e in memory.node_memory_report() if e.node_id == target.id]
    return entry


# --- the per-node comparison ----------------------------------------------------------


def test_a_node_shows_observed_rss_and_shards_next_to_the_estimate_of_its_indices(now):
    target = node(DISK, "zoekt-0", rss=3 * GIB, shards=42)
    placed(target, 3 * GIB, 1 * GIB, used=6 * GIB)  # ready: 4 GiB of repository
    placed(target, 2 * GIB, state=Index.State.INITIALIZING)  # pre-ready: counted in the estimate
    placed(target, 50 * GIB, state=Index.State.PENDING_DELETION)  # on its way out: not counted

    entry = report_of(target)

    assert (entry.rss_bytes, entry.shards_loaded) == (3 * GIB, 42)
    assert entry.ready_repository_bytes == 4 * GIB
    assert entry.repository_bytes == 6 * GIB
    assert entry.estimated_memory_bytes == 3 * GIB  # 6 GiB × memory_ratio 0.5
    assert entry.ready_used_storage_bytes == 6 * GIB
    # Two observed ratios, neither of them memory_ratio:
    assert entry.observed_memory_ratio == 0.5  # RSS / used storage of ready indices
    assert entry.rss_per_repository_byte == 0.75  # RSS / repository of ready indices
    assert entry.observed_to_estimated == 1.0
    assert entry.memory_ratio == 0.5


def test_a_node_that_reports_no_rss_has_an_estimate_and_no_observation(now):
    target = node(DISK, "quiet")
    placed(target, 2 * GIB, used=GIB)
    entry = report_of(target)
    assert entry.estimated_memory_bytes == GIB
    assert entry.rss_bytes is None
    assert entry.observed_memory_ratio is None
    assert entry.rss_per_repository_byte is None
    assert entry.observed_to_estimated is None
    assert entry.memory_watermark is None
    assert entry.calibration_sample is None


def test_the_report_costs_three_queries_whatever_the_fleet(now, django_assert_num_queries):
    app_settings.current()
    for i in range(3):
        placed(node(DISK, f"n{i}", rss=GIB), GIB)
    with django_assert_num_queries(3):
        memory.node_memory_report()
    for i in range(7):
        placed(node(DISK, f"m{i}", rss=GIB), GIB, GIB)
    with django_assert_num_queries(3):
        assert len(memory.node_memory_report()) == 10


def test_the_metrics_log_has_one_record_per_node_with_estimate_and_observation(now, caplog):
    capture(caplog)
    set_setting(zoekt_node_memory_budget_bytes=8 * GIB)
    target = node(DISK, "zoekt-0", rss=3 * GIB, shards=7)
    placed(target, 4 * GIB, used=6 * GIB)
    quiet = node(DISK, "zoekt-1", process_health=None)

    assert log_node_memory_task() == {"nodes": 2}

    by_node = {r["node_id"]: r for r in records(caplog, "zoekt_node_memory")}
    assert set(by_node) == {target.id, quiet.id}
    line = by_node[target.id]
    assert line["rss_bytes"] == 3 * GIB
    assert line["shards_loaded"] == 7
    assert line["estimated_memory_bytes"] == 2 * GIB
    assert line["observed_memory_ratio"] == 0.5
    assert line["rss_per_repository_byte"] == 0.75
    assert line["observed_to_estimated"] == 1.5
    assert line["memory_budget_bytes"] == 8 * GIB
    assert line["memory_budget_source"] == "configured"
    assert line["memory_percent_used"] == 3 / 8
    assert line["memory_watermark"] == "normal"
    assert by_node[quiet.id]["rss_bytes"] is None
    assert by_node[quiet.id]["memory_watermark"] is None


def test_the_memory_jobs_are_scheduled_with_expiry():
    assert BEAT_SCHEDULE["calibrate-memory-ratio"] == {
        "task": "zoekt.calibrate_memory_ratio",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    }
    assert BEAT_SCHEDULE["log-node-memory"] == {
        "task": "zoekt.log_node_memory",
        "schedule": 60.0,
        "options": {"expires": 60},
    }


# --- auto-calibration -------------------------------------------------------------------


def fleet_with_ratios(*ratios: float, repository: int = 2 * GIB) -> None:
    """One online node per ratio, each with a ready index of ``repository`` bytes."""
    for i, ratio in enumerate(ratios):
        placed(node(DISK, f"n{i}", rss=int(ratio * repository)), repository, used=repository)


def ratio_in_row() -> float:
    return ApplicationSetting.objects.get().zoekt_memory_ratio


def test_auto_calibration_is_off_by_default_and_then_changes_nothing(now, caplog):
    capture(caplog)
    fleet_with_ratios(1.5)
    assert app_settings.current().memory_auto_calibration is False

    result = calibrate_memory_ratio_task()

    assert result["applied"] is False
    assert result["reason"] == "memory_auto_calibration_disabled"
    assert ratio_in_row() == 0.5
    (line,) = records(caplog, "calibrate_memory_ratio")
    assert line["reason"] == "memory_auto_calibration_disabled"


def test_auto_calibration_sets_the_ratio_to_the_90th_percentile_of_the_nodes(now):
    set_setting(zoekt_memory_auto_calibration=True)
    fleet_with_ratios(*(i / 10 for i in range(1, 11)))  # 0.1 … 1.0

    result = calibrate_memory_ratio_task()

    assert result["applied"] is True
    assert result["reason"] == "memory_ratio_calibrated"
    assert result["samples"] == 10
    assert result["observed_percentile"] == pytest.approx(0.9)
    assert ratio_in_row() == pytest.approx(0.9)
    # The settings cache was dropped: the next rollout plans with the new ratio.
    assert app_settings.current().memory_ratio == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        pytest.param(5.0, memory.MEMORY_RATIO_MAX, id="clamped-to-the-upper-bound"),
        pytest.param(0.01, memory.MEMORY_RATIO_MIN, id="clamped-to-the-lower-bound"),
        pytest.param(0.35, 0.35, id="within-the-bounds"),
    ],
)
def test_auto_calibration_stays_within_its_bounds(now, observed, expected):
    set_setting(zoekt_memory_auto_calibration=True)
    fleet_with_ratios(observed)
    calibrate_memory_ratio_task()
    assert ratio_in_row() == pytest.approx(expected)


def test_auto_calibration_does_nothing_where_no_node_reports_rss(now, caplog):
    capture(caplog)
    set_setting(zoekt_memory_auto_calibration=True, zoekt_memory_ratio=0.7)
    placed(node(DISK, "quiet", process_health=None), 4 * GIB, used=4 * GIB)
    placed(node(DISK, "no-webserver", process_health={"indexer": {"rss_bytes": GIB}}), 4 * GIB)

    result = calibrate_memory_ratio_task()

    assert result["applied"] is False
    assert result["reason"] == "no_memory_observations"
    assert result["nodes_reporting_rss"] == 0
    assert ratio_in_row() == 0.7


def test_auto_calibration_ignores_offline_nodes_and_nodes_with_little_repository(now):
    set_setting(zoekt_memory_auto_calibration=True)
    placed(node(DISK, "tiny", rss=GIB), 10 * 1024**2)  # RSS is overhead: 102 per byte
    placed(node(DISK, "offline", rss=4 * GIB, last_seen_at=now - timedelta(minutes=5)), 2 * GIB)
    placed(node(DISK, "steady", rss=GIB), 4 * GIB)  # 0.25

    result = calibrate_memory_ratio_task()

    assert result["samples"] == 1
    assert ratio_in_row() == 0.25


def test_auto_calibration_skips_while_another_run_holds_its_lock(now, caplog):
    capture(caplog)
    set_setting(zoekt_memory_auto_calibration=True)
    fleet_with_ratios(1.0)
    with advisory_lock_held_elsewhere(LockKey.CALIBRATE_MEMORY_RATIO):
        assert calibrate_memory_ratio_task() == {"skipped": "lock_held"}
    assert ratio_in_row() == 0.5
    assert calibrate_memory_ratio_task()["applied"] is True


def test_the_calibration_lock_key_is_appended_not_renumbered():
    assert int(LockKey.CALIBRATE_MEMORY_RATIO) == 35
    assert len({int(key) for key in LockKey}) == len(LockKey)


def test_the_settings_help_text_states_the_calibration_constants():
    help_text = ApplicationSetting._meta.get_field("zoekt_memory_auto_calibration").help_text
    assert f"{memory.AUTO_CALIBRATION_PERCENTILE}th percentile" in help_text
    assert f"within {memory.MEMORY_RATIO_MIN} and {memory.MEMORY_RATIO_MAX}" in help_text
