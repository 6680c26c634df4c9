"""The capacity arithmetic of zoekt.capacity, with the reference numbers (1.1, 2.2, 4)."""

from __future__ import annotations

import pytest

from zoekt import capacity
from zoekt.capacity import IndexWatermark, NodeWatermark

GIB = 1024**3


# --- GitLab's constants --------------------------------------------------------------------------


def test_the_node_and_index_constants_are_gitlabs():
    assert capacity.DEFAULT_CONCURRENCY_LIMIT == 20
    assert capacity.MAX_CONCURRENCY_LIMIT == 200
    assert capacity.ONLINE_DURATION_THRESHOLD_SECONDS == 30
    assert capacity.TASK_PULL_FREQUENCY_DEFAULT == "5s"
    assert capacity.TASK_PULL_FREQUENCY_INCREASED == "500ms"
    assert capacity.DEBOUNCE_DELAY_SECONDS == 5
    assert capacity.DEFAULT_RESERVED_STORAGE_BYTES == 10_737_418_240
    assert capacity.DEFAULT_USED_STORAGE_BYTES == 1024
    assert capacity.MAX_INDICES_PER_REPLICA == 10
    assert capacity.DEFAULT_BUFFER_FACTOR == 3


def test_the_index_watermark_enum_values_are_gitlabs():
    assert {level.name: level.value for level in IndexWatermark} == {
        "HEALTHY": 0,
        "OVERPROVISIONED": 10,
        "LOW_WATERMARK_EXCEEDED": 30,
        "HIGH_WATERMARK_EXCEEDED": 60,
        "CRITICAL_WATERMARK_EXCEEDED": 90,
    }


# --- node disk -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("development", "expected"),
    [
        pytest.param(False, (0.60, 0.75, 0.85), id="production-limits-are-0.60-0.75-0.85"),
        pytest.param(True, (0.60, 0.98, 0.99), id="development-raises-high-and-critical-only"),
    ],
)
def test_node_watermark_limits(development, expected):
    assert capacity.watermark_limits(development) == expected


@pytest.mark.parametrize(
    ("used", "total", "expected"),
    [
        pytest.param(30, 100, 0.30, id="used-over-total"),
        pytest.param(100, 100, 1.0, id="a-full-disk-is-one"),
        pytest.param(0, 100, 0.0, id="an-empty-disk-is-zero"),
        pytest.param(50, 0, 0.0, id="a-node-reporting-no-disk-is-zero-not-a-division-error"),
        pytest.param(0, 0, 0.0, id="nothing-reported-is-zero"),
    ],
)
def test_storage_percent_used(used, total, expected):
    assert capacity.storage_percent_used(used, total) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("percent_used", "development", "expected"),
    [
        pytest.param(0.0, False, NodeWatermark.NORMAL, id="empty-is-normal"),
        pytest.param(0.5999, False, NodeWatermark.NORMAL, id="just-below-0.60-is-normal"),
        pytest.param(0.60, False, NodeWatermark.LOW, id="exactly-0.60-is-low"),
        pytest.param(0.7499, False, NodeWatermark.LOW, id="just-below-0.75-is-low"),
        pytest.param(0.75, False, NodeWatermark.HIGH, id="exactly-0.75-is-high"),
        pytest.param(0.8499, False, NodeWatermark.HIGH, id="just-below-0.85-is-high"),
        pytest.param(0.85, False, NodeWatermark.CRITICAL, id="exactly-0.85-is-critical"),
        pytest.param(1.0, False, NodeWatermark.CRITICAL, id="full-is-critical"),
        pytest.param(0.60, True, NodeWatermark.LOW, id="development-0.60-is-still-low"),
        pytest.param(0.97, True, NodeWatermark.LOW, id="development-0.97-is-only-low"),
        pytest.param(0.98, True, NodeWatermark.HIGH, id="development-exactly-0.98-is-high"),
        pytest.param(0.9899, True, NodeWatermark.HIGH, id="development-just-below-0.99-is-high"),
        pytest.param(0.99, True, NodeWatermark.CRITICAL, id="development-exactly-0.99-is-critical"),
    ],
)
def test_a_node_sits_in_the_highest_bucket_its_ratio_reaches(percent_used, development, expected):
    assert capacity.node_watermark(percent_used, development) == expected


@pytest.mark.parametrize(
    ("total", "used", "indexed", "expected"),
    [
        pytest.param(100 * GIB, 40 * GIB, 0, 60 * GIB, id="free-bytes-when-nothing-is-indexed"),
        pytest.param(100 * GIB, 40 * GIB, 30 * GIB, 90 * GIB, id="free-plus-indexed"),
        pytest.param(100 * GIB, 100 * GIB, 20 * GIB, 20 * GIB, id="a-full-disk-keeps-its-index"),
        pytest.param(0, 0, 0, 0, id="nothing-reported-is-zero"),
    ],
)
def test_usable_storage_is_free_plus_indexed_bytes(total, used, indexed, expected):
    assert capacity.usable_storage_bytes(total, used, indexed) == expected


# --- concurrency limit ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("concurrency", "override", "ratio", "expected"),
    [
        pytest.param(4, None, 1.0, 4, id="concurrency-times-ratio"),
        pytest.param(4, None, 2.5, 10, id="a-ratio-above-one-multiplies"),
        pytest.param(5, None, 0.5, 3, id="2.5-rounds-up-to-3-like-ruby"),
        pytest.param(7, None, 0.5, 4, id="3.5-rounds-up-to-4"),
        pytest.param(9, None, 0.5, 5, id="4.5-rounds-up-to-5-not-to-even"),
        pytest.param(1, None, 0.5, 1, id="0.5-rounds-up-to-1-not-to-the-default"),
        pytest.param(1, None, 0.49999999999999994, 20, id="just-below-one-half-rounds-to-0"),
        pytest.param(10, None, 0.44, 4, id="4.4-rounds-down-to-4"),
        pytest.param(1, None, 0.4, 20, id="rounding-to-0-gives-the-default-20"),
        pytest.param(0, None, 1.0, 20, id="no-cpus-gives-the-default-20"),
        pytest.param(None, None, 1.0, 20, id="unknown-concurrency-gives-the-default-20"),
        pytest.param(200, None, 1.0, 200, id="exactly-200-is-allowed"),
        pytest.param(201, None, 1.0, 200, id="above-200-is-capped"),
        pytest.param(128, None, 4.0, 200, id="a-large-ratio-is-capped-at-200"),
        pytest.param(4, 12, 1.0, 12, id="a-positive-override-wins"),
        pytest.param(4, 300, 1.0, 300, id="an-override-is-not-capped"),
        pytest.param(4, 0, 1.0, 4, id="a-zero-override-is-ignored"),
        pytest.param(4, -5, 1.0, 4, id="a-negative-override-is-ignored"),
        pytest.param(0, 7, 1.0, 7, id="an-override-beats-the-default"),
    ],
)
def test_concurrency_limit(concurrency, override, ratio, expected):
    assert capacity.concurrency_limit(concurrency, override, ratio) == expected


# --- index watermark level (the stored, Ruby calculation) ----------------------------------------


@pytest.mark.parametrize(
    ("used", "reserved", "expected"),
    [
        pytest.param(0, 10_000, IndexWatermark.OVERPROVISIONED, id="empty-is-overprovisioned"),
        pytest.param(5_999, 10_000, IndexWatermark.OVERPROVISIONED, id="0.5999-is-overprovisioned"),
        pytest.param(6_000, 10_000, IndexWatermark.HEALTHY, id="exactly-0.60-is-healthy"),
        pytest.param(6_999, 10_000, IndexWatermark.HEALTHY, id="0.6999-is-healthy"),
        pytest.param(
            7_000, 10_000, IndexWatermark.LOW_WATERMARK_EXCEEDED, id="exactly-0.70-is-low"
        ),
        pytest.param(7_499, 10_000, IndexWatermark.LOW_WATERMARK_EXCEEDED, id="0.7499-is-low"),
        pytest.param(
            7_500, 10_000, IndexWatermark.HIGH_WATERMARK_EXCEEDED, id="exactly-0.75-is-high"
        ),
        pytest.param(7_999, 10_000, IndexWatermark.HIGH_WATERMARK_EXCEEDED, id="0.7999-is-high"),
        pytest.param(
            8_000, 10_000, IndexWatermark.CRITICAL_WATERMARK_EXCEEDED, id="exactly-0.80-is-critical"
        ),
        pytest.param(
            15_000, 10_000, IndexWatermark.CRITICAL_WATERMARK_EXCEEDED, id="over-full-is-critical"
        ),
        pytest.param(
            1024, 0, IndexWatermark.CRITICAL_WATERMARK_EXCEEDED, id="zero-reserved-is-critical"
        ),
        pytest.param(
            0, 0, IndexWatermark.CRITICAL_WATERMARK_EXCEEDED, id="zero-over-zero-is-critical"
        ),
        pytest.param(
            1024, None, IndexWatermark.CRITICAL_WATERMARK_EXCEEDED, id="no-reservation-is-critical"
        ),
        pytest.param(
            1024,
            -10_000,
            IndexWatermark.CRITICAL_WATERMARK_EXCEEDED,
            id="negative-reserved-is-critical",
        ),
    ],
)
def test_index_watermark_level(used, reserved, expected):
    assert capacity.index_watermark_level(used, reserved) == expected


# --- reservation resize after indexing (reference 4.3, steps 2-5) --------------------------------


@pytest.mark.parametrize(
    ("used", "reserved", "node_unclaimed", "ready", "expected"),
    [
        pytest.param(600, 500, 10_000, True, 1_000, id="grows-to-the-ideal-used-over-0.6"),
        pytest.param(600, 500, 10_000, False, 1_000, id="grows-before-ready-too"),
        pytest.param(600, 500, 200, True, 700, id="grows-only-by-what-the-node-has-unclaimed"),
        pytest.param(600, 500, 500, True, 1_000, id="grows-exactly-to-ideal-when-it-just-fits"),
        pytest.param(600, 500, 0, True, 500, id="no-growth-when-the-node-has-nothing-unclaimed"),
        pytest.param(600, 500, -300, True, 500, id="no-growth-when-the-node-is-over-committed"),
        pytest.param(600, 3_000, 10_000, True, 1_000, id="a-ready-index-shrinks-to-the-ideal"),
        pytest.param(600, 3_000, -300, True, 1_000, id="shrinking-ignores-the-node"),
        pytest.param(600, 3_000, 10_000, False, 3_000, id="a-filling-index-keeps-its-buffer"),
        pytest.param(600, 1_000, 10_000, True, 1_000, id="already-ideal-stays"),
        pytest.param(600, 1_000, 10_000, False, 1_000, id="already-ideal-stays-before-ready"),
        pytest.param(1024, 0, 10_000, False, 1_706, id="empty-index-claims-1706-truncated"),
        pytest.param(1024, 0, 0, False, 0, id="empty-index-on-a-full-node-stays-at-0"),
        pytest.param(1024, None, 10_000, True, 1_706, id="no-reservation-counts-as-0"),
        pytest.param(1024, None, 0, True, 0, id="no-reservation-and-no-room-gives-0"),
        pytest.param(600, -400, 10_000, True, 1_000, id="a-negative-reservation-grows-to-ideal"),
    ],
)
def test_resized_reservation(used, reserved, node_unclaimed, ready, expected):
    assert capacity.resized_reservation(used, reserved, node_unclaimed, ready) == expected


def test_the_ideal_reservation_is_truncated_not_rounded():
    # 1000 / 0.6 = 1666.67: Ruby's to_i truncates to 1666.
    assert capacity.resized_reservation(1_000, 0, 10**9, index_is_ready=True) == 1_666


# --- observed buffer factor ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "repository_size", "expected"),
    [
        pytest.param(300, 100, 3.0, id="used-over-repository-size"),
        pytest.param(150, 100, 1.5, id="a-fraction-is-kept"),
        pytest.param(0, 100, 3.0, id="nothing-used-falls-back-to-3"),
        pytest.param(300, 0, 3.0, id="no-repository-size-falls-back-to-3"),
        pytest.param(0, 0, 3.0, id="no-observations-fall-back-to-3"),
        pytest.param(-5, 100, 3.0, id="a-negative-sum-falls-back-to-3"),
    ],
)
def test_observed_buffer_factor(used, repository_size, expected):
    assert capacity.observed_buffer_factor(used, repository_size) == pytest.approx(expected)


def test_the_buffer_factor_fallback_can_be_chosen():
    assert capacity.observed_buffer_factor(0, 0, fallback=2) == 2.0
