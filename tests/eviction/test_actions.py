"""Eviction with its safeguards against the real database: the sustain clock from heartbeats,
one decision per node recorded, only the replica on the overfull node deleted, the cooldown
(no second eviction, no placement) and how it ends."""

from __future__ import annotations

from datetime import timedelta

import pytest

from eviction import actions as eviction
from eviction import policy
from eviction.models import EvictionDecision
from planner.selection import SelectionService
from tests.eviction.conftest import beat, ready_namespace
from tests.factories import (
    GIB,
    IndexFactory,
    NodeFactory,
)
from zoekt import app_settings, clock
from zoekt.models import Index, Node, Replica
from zoekt.reasons import Reason
from zoekt.search_targets import search_targets

pytestmark = pytest.mark.django_db

set_setting = app_settings.update
I = Index.State  # noqa: E741
HOUR = 3600


# --- the sustain clock ------------------------------------------------------------------------


def test_the_heartbeat_starts_the_clock_on_a_crossing_and_keeps_it_through_a_dip(now):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB)
    node = beat(node, 74 * GIB)
    assert node.high_watermark_exceeded_at is None
    node = beat(node, 76 * GIB)
    started = node.high_watermark_exceeded_at
    assert started == clock.now()
    # Hovering: a dip to 74 % (inside the 5-point band) keeps the clock.
    for used in (74, 76, 72, 78):
        node = beat(node, used * GIB, seconds=600)
    assert node.high_watermark_exceeded_at == started
    # Under 70 % it resets; the next crossing starts a new clock.
    node = beat(node, 69 * GIB)
    assert node.high_watermark_exceeded_at is None
    node = beat(node, 80 * GIB)
    assert node.high_watermark_exceeded_at == clock.now()


@pytest.mark.parametrize(
    ("hours", "applied"),
    [pytest.param(7.9, False, id="7.9 h over: none"), pytest.param(8.1, True, id="8.1 h: one")],
)
def test_a_node_is_evicted_from_after_8_hours_over_high(now, hours, applied):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB)
    ready_namespace(node, 10 * GIB)
    ready_namespace(node, 20 * GIB)
    node = beat(node, 78 * GIB)
    node = beat(node, 78 * GIB, seconds=hours * HOUR)

    result = eviction.run_node_level()

    assert result["decisions_applied"] == int(applied)
    (decision,) = EvictionDecision.objects.all()
    assert bool(decision.applied_at) is applied
    expected = (
        Reason.EVICTION_SUSTAINED_OVER_HIGH_WATERMARK
        if applied
        else Reason.EVICTION_SUSTAIN_NOT_REACHED
    )
    assert decision.reason == expected
    assert Replica.objects.count() == (
        2 if not applied else 0 if decision.namespaces_affected == 2 else 1
    )


def test_over_critical_the_smallest_ready_index_goes_at_once(now):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=86 * GIB)
    small = ready_namespace(node, 30 * GIB)
    large = ready_namespace(node, 50 * GIB)

    eviction.run_node_level()

    (decision,) = EvictionDecision.objects.all()
    assert decision.reason == Reason.EVICTION_CRITICAL_WATERMARK
    assert decision.namespace_ids == [small.root_namespace_id]
    assert decision.projected_used_bytes == 56 * GIB
    assert not Replica.objects.filter(zoekt_enabled_namespace=small).exists()
    assert Replica.objects.filter(zoekt_enabled_namespace=large).exists()


# --- only the replica on that node ------------------------------------------------------------


def test_only_the_replica_on_the_overfull_node_goes_and_search_keeps_the_other(now):
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=90 * GIB)
    calm = NodeFactory(total_bytes=100 * GIB, used_bytes=10 * GIB)
    both = ready_namespace(hot, 40 * GIB, also_on=calm)
    on_hot, on_calm = (
        Replica.objects.filter(zoekt_enabled_namespace=both)
        .order_by("id")
        .values_list("id", flat=True)
    )

    eviction.run_node_level()

    assert list(
        Replica.objects.filter(zoekt_enabled_namespace=both).values_list("id", flat=True)
    ) == [on_calm]
    targets = search_targets(both.root_namespace_id)
    assert [t.node_id for t in targets.targets] == [calm.id]
    (decision,) = EvictionDecision.objects.all()
    assert decision.details["replicas_deleted"] == 1
    assert decision.details["namespaces_left_without_ready_replica"] == 0
    assert not Replica.objects.filter(id=on_hot).exists()


def test_a_namespace_with_no_other_copy_is_counted_as_left_dark(now):
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=90 * GIB)
    ready_namespace(hot, 40 * GIB)

    eviction.run_node_level()

    assert EvictionDecision.objects.get().details["namespaces_left_without_ready_replica"] == 1


# --- cooldown -----------------------------------------------------------------------------------


def _evicted_once(now) -> tuple[Node, EvictionDecision]:
    # Its indices are what it holds: usable 100 GiB, 75 reserved, room for more.
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=90 * GIB, indexed_bytes=90 * GIB)
    for size in (10, 25, 40):
        ready_namespace(hot, size * GIB)
    eviction.run_node_level()
    hot.refresh_from_db()
    return hot, EvictionDecision.objects.get(applied_at__isnull=False)


def test_after_an_eviction_the_node_cools_down_no_second_eviction_and_no_placement(now):
    hot, first = _evicted_once(now)
    assert hot.eviction_cooldown_until == now + timedelta(hours=12)
    other = NodeFactory(total_bytes=100 * GIB, used_bytes=0)

    # Still full (deletions are slow): the next runs evict nothing, as one folded row.
    for _ in range(3):
        clock.advance(300)
        Node.objects.update(last_seen_at=clock.now())  # still heartbeating, still full
        eviction.run_node_level()
    skipped = EvictionDecision.objects.exclude(id=first.id).get()
    assert (skipped.reason, skipped.repeats, skipped.applied_at) == (
        Reason.EVICTION_NODE_COOLING_DOWN,
        3,
        None,
    )
    assert first.namespaces_affected == 2  # 10 and 25 GiB: 90 % → 55 %
    assert Replica.objects.count() == 1

    Node.objects.update(last_seen_at=clock.now())  # both online
    pool = SelectionService().execute()
    assert hot.id not in [n.id for n in pool.nodes]
    assert other.id in [n.id for n in pool.nodes]
    assert [node_id for node_id, _ in pool.cooling_excluded] == [hot.id]


def test_the_cooldown_ends_once_the_evicted_indices_are_gone(now):
    hot, first = _evicted_once(now)
    clock.advance(600)
    assert eviction.end_cooldowns()["cooldowns_ended"] == 0
    Index.objects.filter(id__in=first.index_ids).delete()  # repositories gone, rows destroyed

    assert eviction.end_cooldowns() == {"cooldowns_ended": 1, "cooldowns_expired": 0}
    Node.objects.update(last_seen_at=clock.now())

    hot.refresh_from_db()
    first.refresh_from_db()
    assert hot.eviction_cooldown_until is None
    assert first.cooldown_end_reason == Reason.COOLDOWN_EVICTED_INDICES_GONE
    assert hot.id in [n.id for n in SelectionService().execute().nodes]


def test_the_cooldown_ends_after_12_hours_at_most(now):
    hot, first = _evicted_once(now)
    clock.advance(12 * HOUR + 1)
    Node.objects.update(last_seen_at=clock.now())
    assert hot.id not in [node_id for node_id, _ in SelectionService().execute().cooling_excluded]
    assert Node.objects.not_in_eviction_cooldown().filter(id=hot.id).exists()
    assert eviction.end_cooldowns()["cooldowns_expired"] == 1
    first.refresh_from_db()
    assert first.cooldown_end_reason == Reason.COOLDOWN_EXPIRED


# --- the decision is re-checked in its transaction ---------------------------------------------


def test_an_index_that_changed_since_the_decision_is_not_taken(now):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=90 * GIB)
    enabled = ready_namespace(node, 40 * GIB)
    rules = eviction.policy_from_settings()
    rows = eviction.index_rows(Index.objects.all())
    (planned,) = policy.node_level(eviction.node_states([node]), rows, rules, clock.now())
    Index.objects.update(state=I.INITIALIZING)  # a reindex started meanwhile

    row = eviction.do_apply_decision(planned)

    assert row.applied_at is None and row.reason == Reason.EVICTION_NOTHING_ELIGIBLE
    assert row.details["changed_since_decided"] == 1
    assert Replica.objects.filter(zoekt_enabled_namespace=enabled).exists()


# --- the last used bytes are not overwritten with 0 ---------------------------------------------


def test_repeated_runs_keep_an_evicted_namespaces_last_used_storage_bytes(now):
    set_setting(zoekt_node_eviction_safeguards=False)
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=90 * GIB)
    enabled = ready_namespace(node, 40 * GIB)
    eviction.run_node_level()
    enabled.refresh_from_db()
    assert enabled.metadata["last_used_storage_bytes"] == 40 * GIB
    clock.advance(300)
    eviction.run_node_level()  # legacy re-selects it: its index still sits on the node
    enabled.refresh_from_db()
    assert enabled.metadata["last_used_storage_bytes"] == 40 * GIB


# --- the overview the dashboard, /metrics and zoekt_info read -----------------------------------


def test_the_overview_counts_decisions_and_lists_nodes_over_high_and_cooling(now):
    from eviction.queries import eviction_overview

    hot, _ = _evicted_once(now)
    waiting = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB)
    waiting = beat(waiting, 80 * GIB)
    clock.advance(600)
    Node.objects.update(last_seen_at=clock.now())
    eviction.run_node_level()  # hot: cooling (skipped); waiting: sustain not reached

    overview = eviction_overview()

    assert overview.applied == {("node_level", "safeguards"): 1}
    assert overview.namespaces_affected == {("node_level", "safeguards"): 2}
    assert overview.skipped == {
        ("node_level", Reason.EVICTION_NODE_COOLING_DOWN): 1,
        ("node_level", Reason.EVICTION_SUSTAIN_NOT_REACHED): 1,
    }
    assert [n.node_id for n in overview.cooling] == [hot.id]
    states = {n.node_id: n for n in overview.over_high}
    assert states[waiting.id].over_high_seconds == 600
    assert len(overview.recent) == 3


# --- (b) and (c) with the safeguards ----------------------------------------------------------


def test_index_watermark_marks_only_ready_indices_and_the_tail_deletes_only_that_replica(now):
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB)
    calm = NodeFactory(total_bytes=100 * GIB, used_bytes=10 * GIB)
    both = ready_namespace(hot, 10 * GIB, also_on=calm)
    Index.objects.filter(zoekt_node=hot).update(
        watermark_level=Index.WatermarkLevel.CRITICAL_WATERMARK_EXCEEDED
    )
    pending = IndexFactory(
        zoekt_node=hot,
        state=I.PENDING,
        watermark_level=Index.WatermarkLevel.CRITICAL_WATERMARK_EXCEEDED,
    )

    eviction.run_index_watermark()
    eviction.evict_indices()

    assert Index.objects.get(id=pending.id).state == I.PENDING
    survivors = Replica.objects.filter(zoekt_enabled_namespace=both)
    assert [r.indices.get().zoekt_node_id for r in survivors] == [calm.id]
    decision = EvictionDecision.objects.get(trigger="index_watermark")
    assert decision.reason == Reason.EVICTION_INDEX_CRITICAL_WATERMARK
    assert len(decision.index_ids) == 1


def test_negative_unclaimed_storage_under_high_is_recorded_and_changes_nothing(now):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=59 * GIB, indexed_bytes=0)
    ready_namespace(node, 60 * GIB)  # reserves 60 GiB of 41 usable
    before = list(Index.objects.values_list("id", "state"))

    result = eviction.run_negative_unclaimed([node.id])

    assert result["decisions_skipped"] == 1
    assert EvictionDecision.objects.get().reason == Reason.EVICTION_UNDER_HIGH_WATERMARK
    assert list(Index.objects.values_list("id", "state")) == before


def test_the_beat_ends_a_spent_cooldown_with_node_level_eviction_off(now):
    # Index-watermark and negative-unclaimed decisions start cooldowns too, and node-level
    # eviction (which ends spent ones first) is off by default: its own beat entry ends it.
    from celery import current_app

    from eviction import tasks  # noqa: F401  (registers the tasks)
    from eviction.beat import EVICTION_BEAT

    hot, first = _evicted_once(now)
    set_setting(zoekt_node_level_eviction_enabled=False)
    Index.objects.filter(id__in=first.index_ids).delete()  # repositories gone, rows destroyed
    clock.advance(300)

    for entry in EVICTION_BEAT.values():
        current_app.tasks[entry["task"]]()

    hot.refresh_from_db()
    first.refresh_from_db()
    assert hot.eviction_cooldown_until is None
    assert first.cooldown_end_reason == Reason.COOLDOWN_EVICTED_INDICES_GONE
