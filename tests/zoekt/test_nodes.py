"""Nodes: disk watermarks, usable/reserved/unclaimed storage, liveness and concurrency.

Every rule is checked on the model and, where GitLab has a scope for it, on
the queryset too (reference 1.1, 2.6, 4.1).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.factories import IndexFactory, NodeFactory, ReplicalessIndexFactory
from zoekt import app_settings, clock
from zoekt.clock import EPOCH
from zoekt.models import ApplicationSetting, Index, Node

pytestmark = pytest.mark.django_db

GIB = 1024**3


def node_with_usable_storage(gib: int, **kwargs) -> Node:
    """A node whose usable storage is ``gib`` GiB (all of it free, nothing indexed)."""
    return NodeFactory(total_bytes=gib * GIB, used_bytes=0, indexed_bytes=0, **kwargs)


set_setting = app_settings.update


def pks(queryset) -> list[int]:
    return list(queryset.values_list("pk", flat=True))


# --- disk use and watermarks ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "total", "expected"),
    [
        pytest.param(25, 100, 0.25, id="used-over-total"),
        pytest.param(60 * GIB, 100 * GIB, 0.60, id="gib-sized-disks"),
        pytest.param(50, 0, 0.0, id="total-0-gives-0"),
    ],
)
def test_storage_percent_used_is_used_over_total(used, total, expected):
    node = NodeFactory(used_bytes=used, total_bytes=total)
    assert node.storage_percent_used == pytest.approx(expected)


def test_free_bytes_are_total_minus_used():
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=35 * GIB)
    assert node.free_bytes == 65 * GIB


PRODUCTION_WATERMARK_CASES = [
    pytest.param("low", 5_999, False, id="low-not-exceeded-at-0.5999"),
    pytest.param("low", 6_000, True, id="low-exceeded-at-exactly-0.60"),
    pytest.param("low", 6_001, True, id="low-exceeded-at-0.6001"),
    pytest.param("high", 7_499, False, id="high-not-exceeded-at-0.7499"),
    pytest.param("high", 7_500, True, id="high-exceeded-at-exactly-0.75"),
    pytest.param("high", 7_501, True, id="high-exceeded-at-0.7501"),
    pytest.param("critical", 8_499, False, id="critical-not-exceeded-at-0.8499"),
    pytest.param("critical", 8_500, True, id="critical-exceeded-at-exactly-0.85"),
    pytest.param("critical", 10_000, True, id="critical-exceeded-when-full"),
    pytest.param("low", 0, False, id="low-not-exceeded-when-empty"),
]

DEVELOPMENT_WATERMARK_CASES = [
    pytest.param("low", 5_999, False, id="low-still-not-exceeded-at-0.5999"),
    pytest.param("low", 6_000, True, id="low-still-exceeded-at-0.60"),
    pytest.param("high", 7_500, False, id="high-not-exceeded-at-0.75"),
    pytest.param("high", 9_799, False, id="high-not-exceeded-at-0.9799"),
    pytest.param("high", 9_800, True, id="high-exceeded-at-exactly-0.98"),
    pytest.param("critical", 8_500, False, id="critical-not-exceeded-at-0.85"),
    pytest.param("critical", 9_899, False, id="critical-not-exceeded-at-0.9899"),
    pytest.param("critical", 9_900, True, id="critical-exceeded-at-exactly-0.99"),
]


def watermark_exceeded(node: Node, level: str) -> tuple[bool, bool]:
    """(model says so, queryset says so) for one node and one level."""
    on_model = getattr(node, f"{level}_watermark_exceeded")()
    in_queryset = getattr(Node.objects, f"{level}_watermark_exceeded")().filter(pk=node.pk).exists()
    return on_model, in_queryset


@pytest.mark.parametrize(("level", "used", "expected"), PRODUCTION_WATERMARK_CASES)
def test_a_node_exceeds_a_watermark_once_its_disk_use_reaches_the_limit(level, used, expected):
    node = NodeFactory(used_bytes=used, total_bytes=10_000)
    assert watermark_exceeded(node, level) == (expected, expected)


@pytest.mark.parametrize(("level", "used", "expected"), DEVELOPMENT_WATERMARK_CASES)
def test_development_watermarks_raise_high_to_0_98_and_critical_to_0_99(
    settings, level, used, expected
):
    settings.ZOEKT_DEVELOPMENT_WATERMARKS = True
    node = NodeFactory(used_bytes=used, total_bytes=10_000)
    assert watermark_exceeded(node, level) == (expected, expected)


@pytest.mark.parametrize("level", ["low", "high", "critical"])
def test_a_node_reporting_no_disk_exceeds_no_watermark(level):
    node = NodeFactory(used_bytes=5_000, total_bytes=0)
    assert watermark_exceeded(node, level) == (False, False)


@pytest.mark.parametrize("development", [False, True], ids=["production", "development"])
def test_model_and_queryset_agree_on_every_watermark_near_every_limit(settings, development):
    settings.ZOEKT_DEVELOPMENT_WATERMARKS = development
    limits = (0.60, 0.75, 0.85, 0.98, 0.99)
    nodes = []
    for total in (7, 10, 99, 1_000, 3 * GIB + 1, 100 * GIB):
        for limit in limits:
            boundary = int(total * limit)
            for used in range(max(boundary - 1, 0), boundary + 2):
                nodes.append(NodeFactory(used_bytes=used, total_bytes=total))
    for level in ("low", "high", "critical"):
        by_model = {n.pk for n in nodes if getattr(n, f"{level}_watermark_exceeded")()}
        by_queryset = set(pks(getattr(Node.objects, f"{level}_watermark_exceeded")()))
        assert by_model == by_queryset, level
        assert by_model, f"no node exceeds {level}: the cases do not reach the limit"


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        pytest.param(5_999, "normal", id="0.5999-is-normal"),
        pytest.param(6_000, "low", id="0.60-is-low"),
        pytest.param(7_500, "high", id="0.75-is-high"),
        pytest.param(8_500, "critical", id="0.85-is-critical"),
    ],
)
def test_a_node_reports_the_highest_watermark_it_reaches(used, expected):
    assert NodeFactory(used_bytes=used, total_bytes=10_000).watermark == expected


# --- usable storage ------------------------------------------------------------------------------


def test_usable_storage_is_free_plus_indexed_bytes_when_created():
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=40 * GIB, indexed_bytes=30 * GIB)
    node.refresh_from_db()
    assert node.usable_storage_bytes == 90 * GIB


def test_usable_storage_is_recomputed_on_every_save(now):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=40 * GIB, indexed_bytes=0)
    node.used_bytes = 70 * GIB
    node.indexed_bytes = 20 * GIB
    node.save()
    node.refresh_from_db()
    assert node.usable_storage_bytes == 50 * GIB


def test_a_save_of_some_fields_still_stores_the_recomputed_usable_storage(now):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=40 * GIB, indexed_bytes=0)
    node.used_bytes = 90 * GIB
    node.save(update_fields=["used_bytes"])
    node.refresh_from_db()
    assert node.usable_storage_bytes == 10 * GIB


def test_a_lock_in_the_future_keeps_usable_storage_as_it_is(now):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=40 * GIB)
    locked_until = now + timedelta(hours=1)
    Node.objects.filter(pk=node.pk).update(
        usable_storage_bytes=123, usable_storage_bytes_locked_until=locked_until
    )
    node.refresh_from_db()
    node.used_bytes = 80 * GIB
    node.save()
    node.refresh_from_db()
    assert node.used_bytes == 80 * GIB
    assert node.usable_storage_bytes == 123
    assert node.usable_storage_bytes_locked_until == locked_until


def test_usable_storage_is_recomputed_and_the_lock_cleared_once_the_lock_has_passed(now):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=40 * GIB)
    Node.objects.filter(pk=node.pk).update(
        usable_storage_bytes=123, usable_storage_bytes_locked_until=now + timedelta(hours=1)
    )
    node.refresh_from_db()
    clock.advance(3601)
    node.save()
    node.refresh_from_db()
    assert node.usable_storage_bytes == 60 * GIB
    assert node.usable_storage_bytes_locked_until is None


@pytest.mark.parametrize(
    "lock_offset",
    [
        pytest.param(timedelta(0), id="a-lock-ending-right-now"),
        pytest.param(-timedelta(seconds=1), id="a-lock-in-the-past"),
    ],
)
def test_a_lock_that_is_not_in_the_future_does_not_hold(now, lock_offset):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=40 * GIB)
    Node.objects.filter(pk=node.pk).update(
        usable_storage_bytes=123, usable_storage_bytes_locked_until=now + lock_offset
    )
    node.refresh_from_db()
    node.save()
    node.refresh_from_db()
    assert node.usable_storage_bytes == 60 * GIB
    assert node.usable_storage_bytes_locked_until is None


# --- reserved and unclaimed storage --------------------------------------------------------------


def unclaimed_in_sql(node: Node) -> tuple[int, int]:
    annotated = Node.objects.with_unclaimed_storage_bytes().get(pk=node.pk)
    return annotated.annotated_reserved_storage_bytes, annotated.annotated_unclaimed_storage_bytes


def test_a_node_without_indices_has_nothing_reserved_and_all_its_usable_storage_unclaimed():
    node = node_with_usable_storage(50)
    assert (node.reserved_storage_bytes, node.unclaimed_storage_bytes) == (0, 50 * GIB)
    assert unclaimed_in_sql(node) == (0, 50 * GIB)


def test_indices_in_every_state_count_against_their_node():
    node = node_with_usable_storage(50)
    for state in Index.State:
        IndexFactory(zoekt_node=node, state=state, reserved_storage_bytes=GIB)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=None)  # counts as nothing
    IndexFactory(reserved_storage_bytes=7 * GIB)  # another node's index does not count
    states = len(Index.State)
    assert states == 9
    expected = (states * GIB, (50 - states) * GIB)
    assert (node.reserved_storage_bytes, node.unclaimed_storage_bytes) == expected
    assert unclaimed_in_sql(node) == expected


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(Index.State.EVICTED, id="evicted"),
        pytest.param(Index.State.ORPHANED, id="orphaned"),
        pytest.param(Index.State.PENDING_EVICTION, id="pending-eviction"),
        pytest.param(Index.State.PENDING_DELETION, id="pending-deletion"),
    ],
)
def test_indices_on_their_way_out_still_hold_their_reservation(state):
    node = node_with_usable_storage(10)
    ReplicalessIndexFactory(zoekt_node=node, state=state, reserved_storage_bytes=4 * GIB)
    assert node.unclaimed_storage_bytes == 6 * GIB
    assert unclaimed_in_sql(node) == (4 * GIB, 6 * GIB)


def test_unclaimed_storage_goes_negative_when_a_node_is_over_committed():
    node = node_with_usable_storage(5)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=3 * GIB)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=4 * GIB)
    assert node.unclaimed_storage_bytes == -2 * GIB
    assert unclaimed_in_sql(node) == (7 * GIB, -2 * GIB)


def test_a_negative_reservation_gives_storage_back_to_its_node():
    node = node_with_usable_storage(10)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=12 * GIB)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=-4 * GIB)
    assert node.unclaimed_storage_bytes == 2 * GIB
    assert unclaimed_in_sql(node) == (8 * GIB, 2 * GIB)


def test_the_model_reads_the_annotated_value_when_the_queryset_provides_it():
    node = node_with_usable_storage(10)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=4 * GIB)
    annotated = Node.objects.with_unclaimed_storage_bytes().get(pk=node.pk)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=1 * GIB)  # after the query ran
    assert annotated.unclaimed_storage_bytes == 6 * GIB
    assert Node.objects.get(pk=node.pk).unclaimed_storage_bytes == 5 * GIB


@pytest.fixture
def nodes_by_unclaimed():
    """Nodes named by their unclaimed GiB: 10, 50, 30, 0 and -2."""
    nodes = {}
    for name, usable, reserved in (
        ("10", 10, 0),
        ("50", 60, 10),
        ("30", 40, 10),
        ("0", 20, 20),
        ("-2", 8, 10),
    ):
        node = node_with_usable_storage(usable)
        if reserved:
            IndexFactory(zoekt_node=node, reserved_storage_bytes=reserved * GIB)
        nodes[name] = node
    return nodes


def test_only_nodes_with_positive_unclaimed_storage_are_offered_with_that_value(
    nodes_by_unclaimed,
):
    found = {
        n.pk: n.annotated_unclaimed_storage_bytes
        for n in Node.objects.with_positive_unclaimed_storage_bytes()
    }
    assert found == {
        nodes_by_unclaimed["10"].pk: 10 * GIB,
        nodes_by_unclaimed["50"].pk: 50 * GIB,
        nodes_by_unclaimed["30"].pk: 30 * GIB,
    }


def test_only_nodes_below_zero_unclaimed_storage_are_negative(nodes_by_unclaimed):
    assert pks(Node.objects.negative_unclaimed_storage_bytes()) == [nodes_by_unclaimed["-2"].pk]


def test_nodes_are_ordered_by_unclaimed_storage_largest_first_and_only_when_positive(
    nodes_by_unclaimed,
):
    ordered = pks(Node.objects.order_by_unclaimed_space_desc())
    assert ordered == [nodes_by_unclaimed[name].pk for name in ("50", "30", "10")]


def test_nodes_with_equal_unclaimed_storage_are_ordered_by_id():
    first, second = node_with_usable_storage(10), node_with_usable_storage(10)
    assert pks(Node.objects.order_by_unclaimed_space_desc()) == [first.pk, second.pk]


def test_the_planner_pool_is_online_search_nodes_with_room_largest_first(now):
    small = node_with_usable_storage(10)
    large = node_with_usable_storage(40)
    node_with_usable_storage(90, last_seen_at=now - timedelta(seconds=31))  # offline
    node_with_usable_storage(90, services=[])  # offers no search service
    full = node_with_usable_storage(20)
    IndexFactory(zoekt_node=full, reserved_storage_bytes=20 * GIB)
    over = node_with_usable_storage(20)
    IndexFactory(zoekt_node=over, reserved_storage_bytes=25 * GIB)
    assert pks(Node.objects.available_for_search_indexing()) == [large.pk, small.pk]


# --- liveness ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds_ago", "online"),
    [
        pytest.param(0, True, id="seen-just-now-is-online"),
        pytest.param(29.999, True, id="seen-29.999s-ago-is-online"),
        pytest.param(30, False, id="seen-exactly-30s-ago-is-offline"),
        pytest.param(31, False, id="seen-31s-ago-is-offline"),
    ],
)
def test_a_node_is_online_while_seen_within_the_last_30_seconds(now, seconds_ago, online):
    node = NodeFactory(last_seen_at=now - timedelta(seconds=seconds_ago))
    assert node.is_online() is online
    assert Node.objects.online().filter(pk=node.pk).exists() is online
    assert Node.objects.offline().filter(pk=node.pk).exists() is not online


def test_a_node_never_seen_is_offline(now):
    node = NodeFactory(last_seen_at=EPOCH)
    assert not node.is_online()
    assert pks(Node.objects.offline()) == [node.pk]
    assert pks(Node.objects.online()) == []


def test_online_follows_the_clock(now):
    node = NodeFactory(last_seen_at=now)
    clock.advance(30)
    assert not node.is_online()
    assert pks(Node.objects.online()) == []


def test_the_lost_node_threshold_defaults_to_twelve_hours():
    assert app_settings.current().lost_node_threshold_seconds == 12 * 3600


@pytest.mark.parametrize(
    ("unseen_for", "in_scope", "by_method"),
    [
        pytest.param(timedelta(hours=12) - timedelta(seconds=1), False, False, id="just-under"),
        pytest.param(timedelta(hours=12), False, True, id="exactly-12h-only-the-method"),
        pytest.param(timedelta(hours=12, microseconds=1), True, True, id="just-over"),
        pytest.param(timedelta(days=3), True, True, id="long-gone"),
    ],
)
def test_a_node_unseen_for_the_threshold_is_lost(now, unseen_for, in_scope, by_method):
    threshold = app_settings.current().lost_node_threshold_seconds
    node = NodeFactory(last_seen_at=now - unseen_for)
    assert Node.objects.lost(threshold).filter(pk=node.pk).exists() is in_scope
    assert node.is_lost(threshold) is by_method


def test_the_lost_node_threshold_setting_is_honoured(now):
    set_setting(zoekt_lost_node_threshold="30m")
    threshold = app_settings.current().lost_node_threshold_seconds
    gone = NodeFactory(last_seen_at=now - timedelta(minutes=31))
    recent = NodeFactory(last_seen_at=now - timedelta(minutes=29))
    assert pks(Node.objects.lost(threshold)) == [gone.pk]
    assert gone.is_lost(threshold)
    assert not recent.is_lost(threshold)


def test_a_threshold_of_0_disables_lost_nodes(now):
    set_setting(zoekt_lost_node_threshold="0")
    threshold = app_settings.current().lost_node_threshold_seconds
    node = NodeFactory(last_seen_at=EPOCH)
    assert threshold is None
    assert pks(Node.objects.lost(threshold)) == []
    assert not node.is_lost(threshold)
    # The same node is lost as soon as a threshold is set again.
    set_setting(zoekt_lost_node_threshold="12h")
    assert node.is_lost(app_settings.current().lost_node_threshold_seconds)


def test_a_row_saved_with_threshold_0_is_stored_as_text():
    set_setting(zoekt_lost_node_threshold="0")
    assert ApplicationSetting.objects.get().zoekt_lost_node_threshold == "0"


# --- concurrency limit ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "ratio", "expected"),
    [
        pytest.param({"concurrency": 8}, 1.0, 8, id="cpus-times-the-default-ratio"),
        pytest.param({"concurrency": 5}, 0.5, 3, id="2.5-rounds-to-3-like-ruby"),
        pytest.param({"concurrency": 3}, 0.5, 2, id="1.5-rounds-to-2"),
        pytest.param({"concurrency": 0}, 1.0, 20, id="0-gives-the-default-20"),
        pytest.param({}, 1.0, 20, id="no-reported-concurrency-gives-20"),
        pytest.param({"concurrency": 1}, 0.25, 20, id="rounding-down-to-0-gives-20"),
        pytest.param({"concurrency": 64}, 4.0, 200, id="capped-at-200"),
        pytest.param({"concurrency": 8, "concurrency_override": 3}, 1.0, 3, id="override-wins"),
        pytest.param(
            {"concurrency": 8, "concurrency_override": 500}, 1.0, 500, id="override-is-not-capped"
        ),
        pytest.param(
            {"concurrency": 8, "concurrency_override": 0}, 1.0, 8, id="override-0-is-ignored"
        ),
        pytest.param(
            {"concurrency": 8, "concurrency_override": None}, 1.0, 8, id="override-null-ignored"
        ),
    ],
)
def test_a_nodes_concurrency_limit(metadata, ratio, expected):
    node = NodeFactory(metadata=metadata)
    assert node.concurrency_limit(ratio) == expected


def test_the_concurrency_limit_uses_the_cpu_to_tasks_ratio_setting():
    set_setting(zoekt_cpu_to_tasks_ratio=1.5)
    node = NodeFactory(metadata={"concurrency": 5})
    assert node.concurrency_limit(app_settings.current().cpu_to_tasks_ratio) == 8
