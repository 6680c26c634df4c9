"""The eviction policy, rule by rule, in the incident's shape (pure: no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from eviction import policy as p
from zoekt.reasons import Reason

NOW = datetime(2026, 10, 21, 0, 0, tzinfo=UTC)
GIB = 1024**3
TOTAL = 3023 * GIB  # gitlab-zoekt-26
HOUR = 3600
SAFE = p.Policy()
LEGACY = p.Policy(safeguards=False)


def node(
    percent: float, *, over_since: float | None = None, cooling_for: float | None = None, **kw
):
    return p.NodeState(
        id=kw.pop("id", 1),
        name=kw.pop("name", "zoekt-26"),
        total_bytes=TOTAL,
        used_bytes=int(TOTAL * percent),
        high_watermark_exceeded_at=None
        if over_since is None
        else NOW - timedelta(hours=over_since),
        cooldown_until=None if cooling_for is None else NOW + timedelta(hours=cooling_for),
        **kw,
    )


def index(i: int, used_gib: float, *, state: str = "ready", namespace: int | None = None, **kw):
    return p.IndexRow(
        id=i,
        node_id=kw.pop("node_id", 1),
        namespace_id=namespace if namespace is not None else 100 + i,
        replica_id=kw.pop("replica_id", 1000 + i),
        state=state,
        used_storage_bytes=int(used_gib * GIB),
        reserved_storage_bytes=kw.pop("reserved", int(used_gib * GIB / 0.6)),
    )


def fleet(n: int = 40, size_gib: float = 60) -> list[p.IndexRow]:
    return [index(i, size_gib) for i in range(1, n + 1)]


# --- sustain and critical ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("hours_over", "applied", "reason"),
    [
        pytest.param(7.99, False, Reason.EVICTION_SUSTAIN_NOT_REACHED, id="just under 8 h: none"),
        pytest.param(8.01, True, Reason.EVICTION_SUSTAINED_OVER_HIGH_WATERMARK, id="just over: 1"),
    ],
)
def test_a_node_over_high_is_evicted_from_only_after_the_sustain_period(
    hours_over, applied, reason
):
    (decision,) = p.node_level([node(0.76, over_since=hours_over)], fleet(), SAFE, NOW)
    assert (decision.apply, decision.reason) == (applied, reason)
    assert bool(decision.chosen) is applied


def test_over_critical_it_is_evicted_from_at_once():
    (decision,) = p.node_level([node(0.86, over_since=0)], fleet(), SAFE, NOW)
    assert decision.apply and decision.reason == Reason.EVICTION_CRITICAL_WATERMARK


def test_without_a_running_sustain_clock_nothing_is_evicted_under_critical():
    (decision,) = p.node_level([node(0.80)], fleet(), SAFE, NOW)
    assert not decision.apply and decision.reason == Reason.EVICTION_SUSTAIN_NOT_REACHED


def test_nodes_under_high_need_no_decision():
    assert p.node_level([node(0.74, over_since=20)], fleet(), SAFE, NOW) == []


# --- cooldown ---------------------------------------------------------------------------


def test_a_cooling_node_is_not_evicted_from_even_over_critical():
    (decision,) = p.node_level([node(0.90, over_since=20, cooling_for=3)], fleet(), SAFE, NOW)
    assert not decision.apply and decision.reason == Reason.EVICTION_NODE_COOLING_DOWN


def test_a_cooldown_in_the_past_does_not_hold():
    (decision,) = p.node_level([node(0.90, cooling_for=-1)], fleet(), SAFE, NOW)
    assert decision.apply


# --- what, and how much ------------------------------------------------------------------


def test_only_ready_measured_indices_smallest_used_first_until_under_low():
    rows = [
        index(1, 700),
        index(2, 5, state="pending"),
        index(3, 1024 / GIB),  # the 1 KiB placeholder
        index(4, 40),
        index(5, 100),
        index(6, 200),
        index(7, 20, state="initializing"),
    ]
    n = node(0.86)
    (decision,) = p.node_level([n], rows, SAFE, NOW)
    ids = [c.index_id for c in decision.chosen]
    assert ids == [4, 5, 6, 1]
    assert decision.projected_used_bytes == n.used_bytes - sum(
        c.used_storage_bytes for c in decision.chosen
    )
    # It stops at the first index that brings the projection under the low watermark.
    assert decision.projected_used_bytes < 0.60 * TOTAL
    without_last = decision.projected_used_bytes + decision.chosen[-1].used_storage_bytes
    assert without_last >= 0.60 * TOTAL
    assert decision.details["not_ready"] == 2 and decision.details["placeholder_size"] == 1


def test_nothing_eligible_is_a_recorded_skip():
    rows = [index(1, 100, state="pending"), index(2, 1024 / GIB)]
    (decision,) = p.node_level([node(0.90)], rows, SAFE, NOW)
    assert not decision.apply and decision.reason == Reason.EVICTION_NOTHING_ELIGIBLE


def test_largest_that_fits_elsewhere_affects_fewer_namespaces():
    rows = [index(i, 10) for i in range(1, 60)] + [index(100, 400), index(101, 900)]
    n = node(0.86)
    roomy = [p.Target(2, 2000 * GIB), p.Target(3, 1300 * GIB), p.Target(1, 10**15)]
    smallest = p.node_level([n], rows, SAFE, NOW)[0]
    largest = p.node_level(
        [n], rows, p.Policy(order=p.LARGEST_THAT_FITS, buffer_factor=2.5), NOW, targets=roomy
    )[0]
    assert largest.apply and smallest.apply
    assert len(largest.namespaces) < len(smallest.namespaces)
    # 900 GiB × 2.5 fits nowhere: it is passed over; 400 GiB × 2.5 fits node 2.
    assert [c.index_id for c in largest.chosen][:1] == [100]
    assert largest.details["no_room_elsewhere"] >= 1
    # The overfull node itself is never a target.
    assert all(c.index_id != 101 for c in largest.chosen)


def test_largest_that_fits_counts_each_index_on_the_least_allocated_target():
    """The balanced placement's score: the share of its disk a target has left, not
    its bytes; a small empty node goes before a big, nearly full one."""
    rows = [index(1, 200), index(2, 100)]
    targets = [
        p.Target(2, 1300 * GIB, total_bytes=13_000 * GIB),  # more bytes, 10 % left
        p.Target(3, 700 * GIB, total_bytes=700 * GIB),  # empty
    ]
    rules = p.Policy(order=p.LARGEST_THAT_FITS, buffer_factor=3)
    (decision,) = p.node_level([node(0.86)], rows, rules, NOW, targets=targets)
    # 600 GiB goes to node 3 (all of it left, against 10 %); then node 3 has 100 GiB,
    # too little for the next 300 GiB, which node 2 takes.
    assert [(c.index_id, c.target_node_id) for c in decision.chosen] == [(1, 3), (2, 2)]
    # Without disk sizes every target counts as empty: the tie goes to the smaller id.
    plain = [p.Target(2, 1300 * GIB), p.Target(3, 700 * GIB)]
    (decision,) = p.node_level([node(0.86)], rows, rules, NOW, targets=plain)
    assert decision.chosen[0].target_node_id == 2


def test_only_the_replica_on_the_overfull_node_is_chosen():
    # Namespace 7 has a replica on node 1 (index 1) and one on node 2 (index 2).
    rows = [
        index(1, 500, namespace=7, replica_id=70),
        index(2, 500, namespace=7, replica_id=71, node_id=2),
    ]
    (decision,) = p.node_level([node(0.86), node(0.50, id=2, name="zoekt-2")], rows, SAFE, NOW)
    assert [(c.index_id, c.replica_id) for c in decision.chosen] == [(1, 70)]


# --- legacy: GitLab's rule, exactly -------------------------------------------------------


def test_legacy_evicts_at_once_smallest_whole_namespaces_until_under_low_even_when_cooling():
    rows = [index(1, 100, namespace=10), index(2, 100, namespace=20), index(3, 100, namespace=30)]
    sizes = {10: 300 * GIB, 20: 100 * GIB, 30: None}
    n = node(0.76, cooling_for=5)
    (decision,) = p.node_level([n], rows, LEGACY, NOW, namespace_sizes=sizes)
    assert decision.apply and decision.mode == p.LEGACY
    # 30 (no statistics, 0) then 20 (100 GiB) then 10: 0.76 → ... under 0.60 after 10.
    assert decision.namespace_ids == (30, 20, 10)
    assert decision.projected_used_bytes == n.used_bytes - 400 * GIB


# --- (b) index watermark -------------------------------------------------------------------


def test_index_watermark_takes_only_ready_indices_and_spares_cooling_nodes():
    critical = [
        index(1, 10, state="ready"),
        index(2, 10, state="pending"),
        index(3, 10, state="evicted"),
        index(4, 10, node_id=2),
    ]
    nodes = [node(0.5), node(0.5, id=2, name="b", cooling_for=2)]
    decisions = {d.node_id: d for d in p.index_watermark(nodes, critical, SAFE, NOW)}
    assert [c.index_id for c in decisions[1].chosen] == [1]
    assert not decisions[2].apply and decisions[2].reason == Reason.EVICTION_NODE_COOLING_DOWN
    legacy = {d.node_id: d for d in p.index_watermark(nodes, critical, LEGACY, NOW)}
    assert [c.index_id for c in legacy[1].chosen] == [1, 2]
    assert [c.index_id for c in legacy[2].chosen] == [4]


# --- (c) negative unclaimed storage --------------------------------------------------------


def _overcommitted(percent: float, shortfall_gib: float, **kw) -> p.NodeState:
    return node(percent, unclaimed_storage_bytes=-int(shortfall_gib * GIB), **kw)


def test_negative_unclaimed_under_high_is_skipped_with_safeguards():
    rows = [index(1, 22, reserved=int(36.6 * GIB))]
    (decision,) = p.negative_unclaimed([_overcommitted(0.59, 1.67)], rows, SAFE, NOW)
    assert not decision.apply and decision.reason == Reason.EVICTION_UNDER_HIGH_WATERMARK
    (legacy,) = p.negative_unclaimed([_overcommitted(0.59, 1.67)], rows, LEGACY, NOW)
    assert legacy.apply and [c.index_id for c in legacy.chosen] == [1]


def test_negative_unclaimed_takes_the_smallest_covering_index_not_the_lowest_id():
    rows = [
        index(1, 22, reserved=int(36.6 * GIB)),  # GitLab's legacy pick: the lowest id
        index(2, 1, reserved=int(1.5 * GIB)),  # too small to cover
        index(3, 1, reserved=int(1.8 * GIB)),  # the smallest that covers 1.67 GiB
        index(4, 2, reserved=int(3 * GIB)),
        index(5, 1, reserved=int(1.7 * GIB), state="pending"),  # not ready
    ]
    (decision,) = p.negative_unclaimed([_overcommitted(0.80, 1.67, over_since=9)], rows, SAFE, NOW)
    assert [c.index_id for c in decision.chosen] == [3]
    (legacy,) = p.negative_unclaimed([_overcommitted(0.80, 1.67)], rows, LEGACY, NOW)
    assert [c.index_id for c in legacy.chosen] == [1]


def test_negative_unclaimed_without_a_covering_index_takes_the_largest_first():
    rows = [index(i, 1, reserved=r * GIB) for i, r in [(1, 1), (2, 3), (3, 2)]]
    (decision,) = p.negative_unclaimed([_overcommitted(0.86, 4.5)], rows, SAFE, NOW)
    assert decision.details["pressure"] == Reason.EVICTION_CRITICAL_WATERMARK
    assert [c.index_id for c in decision.chosen] == [2, 3]


def test_negative_unclaimed_over_high_waits_for_the_sustain_period_like_node_level():
    # A transient spike shrinks usable storage under unchanged reservations: the
    # shortfall is real only once the node stayed over the high watermark.
    rows = [index(1, 2, reserved=3 * GIB)]
    for over_since, applied in ((None, False), (7.9, False), (8.1, True)):
        (decision,) = p.negative_unclaimed(
            [_overcommitted(0.80, 1, over_since=over_since)], rows, SAFE, NOW
        )
        assert decision.apply is applied
        if applied:
            assert decision.reason == Reason.EVICTION_NEGATIVE_UNCLAIMED_STORAGE
            assert decision.details["pressure"] == Reason.EVICTION_SUSTAINED_OVER_HIGH_WATERMARK
        else:
            assert decision.reason == Reason.EVICTION_SUSTAIN_NOT_REACHED
    (legacy,) = p.negative_unclaimed([_overcommitted(0.80, 1)], rows, LEGACY, NOW)
    assert legacy.apply


def test_negative_unclaimed_spares_a_cooling_node():
    rows = [index(1, 1, reserved=10 * GIB)]
    (decision,) = p.negative_unclaimed([_overcommitted(0.9, 1, cooling_for=1)], rows, SAFE, NOW)
    assert decision.reason == Reason.EVICTION_NODE_COOLING_DOWN
