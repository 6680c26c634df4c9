"""zoekt.memory's pure parts: budgets and the version gate, watermarks, the estimate."""

from __future__ import annotations

import pytest

from planner.scenario import MemoryOptions
from zoekt import memory
from zoekt.capacity import NodeWatermark

A = 10_000  # the configured budget (source A)


def meta(*, rss=None, limit=None, version="v1.16.2", shards=None) -> dict:
    web = {}
    if rss is not None:
        web["rss_bytes"] = rss
    if limit is not None:
        web["memory_limit_bytes"] = limit
    if shards is not None:
        web["shards_loaded"] = shards
    out = {"process_health": {"webserver": web}}
    if version is not None:
        out["version"] = version
    return out


# --- budgets: source B when the node's version passes the gate, else A ------------------


def test_the_gate_is_documented_as_1_16_0():
    assert memory.MEMORY_LIMIT_MIN_VERSION == (1, 16, 0)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        pytest.param(meta(limit=8000, version="v1.16.0"), (8000, "reported"), id="at-the-gate"),
        pytest.param(meta(limit=8000, version="1.17.3-rc1"), (8000, "reported"), id="above"),
        pytest.param(meta(limit=8000, version="v1.15.9"), (A, "configured"), id="below-the-gate"),
        pytest.param(meta(limit=8000, version=None), (A, "configured"), id="no-version"),
        pytest.param(meta(limit=8000, version="dev"), (A, "configured"), id="unparsable-version"),
        pytest.param(meta(version="v2.0.0"), (A, "configured"), id="no-limit-reported"),
        pytest.param(meta(limit=0), (A, "configured"), id="limit-0"),
        pytest.param(meta(limit=9223372036854771712), (A, "configured"), id="cgroup-v1-unlimited"),
        pytest.param({}, (A, "configured"), id="no-process-health"),
        pytest.param({"process_health": None}, (A, "configured"), id="process-health-null"),
        pytest.param({"process_health": {"indexer": {}}}, (A, "configured"), id="no-webserver"),
        pytest.param(
            {"version": "v1.16.0", "process_health": {"webserver": {"memory_limit_bytes": "8"}}},
            (A, "configured"),
            id="not-an-integer",
        ),
    ],
)
def test_a_node_uses_its_reported_limit_when_it_passes_the_gate_else_the_setting(
    metadata, expected
):
    assert memory.memory_budget(metadata, A) == expected


def test_without_the_setting_a_reported_limit_is_shown_but_not_planned_with():
    reporting = meta(limit=8000)
    assert memory.memory_budget(reporting, None) == (8000, "reported")
    assert memory.planning_budget(reporting, None) is None
    assert memory.planning_budget(reporting, A) == 8000
    assert memory.memory_budget({}, None) == (None, None)


# --- memory watermarks: RSS / budget against 0.60 / 0.75 / 0.85, reaching a limit exceeds it ---


@pytest.mark.parametrize(
    ("rss", "level", "low", "high", "critical"),
    [
        (0, NodeWatermark.NORMAL, False, False, False),
        (5_999, NodeWatermark.NORMAL, False, False, False),
        (6_000, NodeWatermark.LOW, True, False, False),
        (7_499, NodeWatermark.LOW, True, False, False),
        (7_500, NodeWatermark.HIGH, True, True, False),
        (8_499, NodeWatermark.HIGH, True, True, False),
        (8_500, NodeWatermark.CRITICAL, True, True, True),
        (20_000, NodeWatermark.CRITICAL, True, True, True),
    ],
)
def test_memory_watermark_predicates_at_and_around_the_thresholds(rss, level, low, high, critical):
    metadata = meta(rss=rss, version=None)  # no reported limit: the budget is A = 10,000
    percent = memory.memory_percent_used(rss, A)
    assert memory.memory_watermark(percent) == level
    assert memory.low_memory_watermark_exceeded(metadata, A) is low
    assert memory.high_memory_watermark_exceeded(metadata, A) is high
    assert memory.critical_memory_watermark_exceeded(metadata, A) is critical
    assert memory.excluded_from_placement(metadata, A) is high


def test_the_memory_limits_are_the_disk_limits():
    assert memory.memory_watermark_limits() == (0.60, 0.75, 0.85)


def test_the_watermark_uses_the_nodes_own_budget_when_it_reports_one():
    big = meta(rss=7_500, limit=100_000)  # 7.5 % of its own limit
    assert memory.memory_watermark(memory.memory_percent_used(7_500, 100_000)) == (
        NodeWatermark.NORMAL
    )
    assert not memory.high_memory_watermark_exceeded(big, A)
    small = meta(rss=7_500, limit=8_000)  # 93.75 % of its own limit
    assert memory.critical_memory_watermark_exceeded(small, A)


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param({}, id="no-process-health"),
        pytest.param({"process_health": None}, id="null"),
        pytest.param({"process_health": {"indexer": {"rss_bytes": 10**9}}}, id="no-webserver"),
        pytest.param(meta(shards=3, version=None), id="no-rss"),
        pytest.param(meta(rss=-1, version=None), id="negative-rss"),
    ],
)
def test_no_rss_report_is_no_memory_signal(metadata):
    assert memory.memory_percent_used(memory.webserver_counter(metadata, "rss_bytes"), A) is None
    assert memory.memory_watermark(None) is None
    assert not memory.low_memory_watermark_exceeded(metadata, A)
    assert not memory.excluded_from_placement(metadata, A)


def test_no_budget_is_no_memory_signal_and_no_exclusion():
    heavy = meta(rss=10**12, version=None)
    assert memory.memory_percent_used(10**12, None) is None
    assert not memory.high_memory_watermark_exceeded(heavy, None)
    # Over the watermark of its own reported limit, but memory planning is off (A unset).
    over_own = meta(rss=9_000, limit=10_000)
    assert memory.high_memory_watermark_exceeded(over_own, None)
    assert not memory.excluded_from_placement(over_own, None)


# --- the estimate and the percentile --------------------------------------------------------


@pytest.mark.parametrize("ratio", [0.5, 1, 1.0, 0.1, 0.125, 0.3333, 2.5, 7])
@pytest.mark.parametrize("size", [0, 1, 3, 999, 10**12 + 7])
def test_the_estimate_is_the_planner_cores_estimate(ratio, size):
    assert memory.estimate_memory_bytes(size, ratio) == MemoryOptions(memory_ratio=ratio).estimate(
        size
    )


def test_the_estimate_is_not_multiplied_by_the_buffer_factor():
    assert memory.estimate_memory_bytes(1_000, 0.5) == 500


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], None),
        ([0.4], 0.4),
        ([0.3, 0.1, 0.2], 0.3),
        ([i / 10 for i in range(1, 11)], 0.9),
        ([i / 100 for i in range(1, 101)], 0.9),
    ],
)
def test_the_90th_percentile_is_the_nearest_rank(values, expected):
    assert memory.percentile(values, memory.AUTO_CALIBRATION_PERCENTILE) == expected


def test_the_calibration_constants_are_the_documented_ones():
    assert memory.AUTO_CALIBRATION_PERCENTILE == 90
    assert (memory.MEMORY_RATIO_MIN, memory.MEMORY_RATIO_MAX) == (0.1, 2.0)
    assert memory.MIN_CALIBRATION_REPOSITORY_BYTES == 1024**3
