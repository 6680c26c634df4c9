"""Indices: watermark levels, the post-indexing recalculation and GitLab's index scopes.

Reference sections 1.4, 2.2 and 4.3.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.factories import (
    EnabledNamespaceFactory,
    IndexFactory,
    NodeFactory,
    ReplicaFactory,
    ReplicalessIndexFactory,
    RepositoryFactory,
)
from zoekt import clock
from zoekt.clock import EPOCH
from zoekt.models import EnabledNamespace, Index, Node, Repository

pytestmark = pytest.mark.django_db

GIB = 1024**3
Level = Index.WatermarkLevel
State = Index.State


def pks(queryset) -> set[int]:
    return set(queryset.values_list("pk", flat=True))


def sql_level(index: Index) -> int:
    return Index.objects.with_sql_watermark_level().get(pk=index.pk).sql_watermark_level


# --- watermark levels ----------------------------------------------------------------------------

LEVEL_CASES = [
    pytest.param(0, 10_000, Level.OVERPROVISIONED, id="empty-is-overprovisioned"),
    pytest.param(5_999, 10_000, Level.OVERPROVISIONED, id="0.5999-is-overprovisioned"),
    pytest.param(6_000, 10_000, Level.HEALTHY, id="exactly-0.60-is-healthy"),
    pytest.param(6_999, 10_000, Level.HEALTHY, id="0.6999-is-healthy"),
    pytest.param(7_000, 10_000, Level.LOW_WATERMARK_EXCEEDED, id="exactly-0.70-is-low"),
    pytest.param(7_499, 10_000, Level.LOW_WATERMARK_EXCEEDED, id="0.7499-is-low"),
    pytest.param(7_500, 10_000, Level.HIGH_WATERMARK_EXCEEDED, id="exactly-0.75-is-high"),
    pytest.param(7_999, 10_000, Level.HIGH_WATERMARK_EXCEEDED, id="0.7999-is-high"),
    pytest.param(8_000, 10_000, Level.CRITICAL_WATERMARK_EXCEEDED, id="exactly-0.80-is-critical"),
    pytest.param(12_000, 10_000, Level.CRITICAL_WATERMARK_EXCEEDED, id="overfull-is-critical"),
    pytest.param(6 * GIB, 10 * GIB, Level.HEALTHY, id="gib-sized-0.60-is-healthy"),
    pytest.param(1024, 0, Level.CRITICAL_WATERMARK_EXCEEDED, id="reserved-0-is-critical"),
    pytest.param(1024, None, Level.CRITICAL_WATERMARK_EXCEEDED, id="reserved-null-is-critical"),
]


@pytest.mark.parametrize(("used", "reserved", "expected"), LEVEL_CASES)
def test_the_stored_and_the_sql_calculation_give_the_same_level(used, reserved, expected):
    index = IndexFactory(used_storage_bytes=used, reserved_storage_bytes=reserved)
    assert index.computed_watermark_level() == expected
    assert sql_level(index) == expected


def test_a_negative_reservation_is_critical_when_stored_but_overprovisioned_in_sql():
    index = IndexFactory(used_storage_bytes=1024, reserved_storage_bytes=-10_000)
    assert index.computed_watermark_level() == Level.CRITICAL_WATERMARK_EXCEEDED
    assert sql_level(index) == Level.OVERPROVISIONED


def test_once_levels_are_stored_only_negative_reservations_mismatch_the_sql_level():
    indices = [
        IndexFactory(used_storage_bytes=used, reserved_storage_bytes=reserved)
        for used, reserved in (
            (5_999, 10_000),
            (6_000, 10_000),
            (7_000, 10_000),
            (7_500, 10_000),
            (8_000, 10_000),
            (1024, 0),
            (1024, None),
        )
    ]
    negative = IndexFactory(used_storage_bytes=1024, reserved_storage_bytes=-1)
    for index in [*indices, negative]:
        Index.objects.filter(pk=index.pk).update(watermark_level=index.computed_watermark_level())
    assert pks(Index.objects.with_mismatched_watermark_levels()) == {negative.pk}


def test_a_stored_level_left_behind_by_a_change_in_usage_is_mismatched():
    index = IndexFactory(
        used_storage_bytes=9_000, reserved_storage_bytes=10_000, watermark_level=Level.HEALTHY
    )
    matching = IndexFactory(
        used_storage_bytes=6_500, reserved_storage_bytes=10_000, watermark_level=Level.HEALTHY
    )
    assert pks(Index.objects.with_mismatched_watermark_levels()) == {index.pk}
    assert matching.pk not in pks(Index.objects.with_mismatched_watermark_levels())


# --- update_storage_bytes_and_watermark_level (reference 4.3) ------------------------------------


def node_with_usable_storage(usable: int) -> Node:
    return NodeFactory(total_bytes=usable, used_bytes=0, indexed_bytes=0)


def index_with_repositories(*sizes: int, states=None, **kwargs) -> Index:
    index = IndexFactory(**kwargs)
    states = states or [Repository.State.READY] * len(sizes)
    for size, state in zip(sizes, states, strict=True):
        RepositoryFactory(zoekt_index=index, size_bytes=size, state=state)
    return index


def test_used_bytes_are_the_sum_of_every_repository_in_any_state(now):
    index = index_with_repositories(
        100,
        200,
        300,
        400,
        states=[
            Repository.State.READY,
            Repository.State.PENDING,
            Repository.State.FAILED,
            Repository.State.PENDING_DELETION,
        ],
        state=State.READY,
        zoekt_node=node_with_usable_storage(100 * GIB),
    )
    index.update_storage_bytes_and_watermark_level()
    index.refresh_from_db()
    assert index.used_storage_bytes == 1_000
    assert index.used_storage_bytes_updated_at == now


@pytest.mark.parametrize(
    "sizes",
    [
        pytest.param((), id="an-index-without-repositories"),
        pytest.param((0, 0), id="repositories-of-size-0"),
    ],
)
def test_used_bytes_are_1024_when_the_repositories_sum_to_nothing(now, sizes):
    index = index_with_repositories(*sizes, zoekt_node=node_with_usable_storage(100 * GIB))
    index.update_storage_bytes_and_watermark_level()
    index.refresh_from_db()
    assert index.used_storage_bytes == 1024


def test_a_growing_index_claims_its_ideal_reservation_when_the_node_has_room(now):
    index = index_with_repositories(
        600, reserved_storage_bytes=500, zoekt_node=node_with_usable_storage(100 * GIB)
    )
    index.update_storage_bytes_and_watermark_level()
    index.refresh_from_db()
    assert (index.reserved_storage_bytes, index.watermark_level) == (1_000, Level.HEALTHY)


def test_indices_refreshed_together_claim_in_id_order_as_one_by_one(now):
    def fleet() -> list[Index]:
        node = node_with_usable_storage(2_000)
        return [
            index_with_repositories(size, reserved_storage_bytes=100, zoekt_node=node)
            for size in (600, 600, 600)
        ]

    together = fleet()
    assert Index.refresh_storage_of(together[0].zoekt_node_id, [i.id for i in together]) == 3
    alone = fleet()
    for index in alone:
        index.update_storage_bytes_and_watermark_level()

    def claims(indices: list[Index]) -> list[int]:
        return [Index.objects.get(pk=i.pk).reserved_storage_bytes for i in indices]

    # 1,700 unclaimed: the first reaches its ideal 1,000 (900 claimed), the second gets the
    # 800 left (900), the third nothing more, as when each is refreshed alone.
    assert claims(together) == claims(alone) == [1_000, 900, 100]
    assert {Index.objects.get(pk=i.pk).used_storage_bytes for i in together} == {600}


def test_a_refresh_of_an_index_not_on_the_node_named_changes_nothing(now):
    index = index_with_repositories(600, reserved_storage_bytes=500)
    other = node_with_usable_storage(100 * GIB)

    assert Index.refresh_storage_of(other.id, [index.id]) == 0
    index.refresh_from_db()
    assert index.used_storage_bytes != 600


def test_a_growing_index_claims_no_more_than_the_node_has_unclaimed(now):
    node = node_with_usable_storage(1_000)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=300)  # a neighbour: 200 left unclaimed
    index = index_with_repositories(600, reserved_storage_bytes=500, zoekt_node=node)
    index.update_storage_bytes_and_watermark_level()
    index.refresh_from_db()
    # min(ideal 1000, unclaimed 200 + current 500) = 700; 600 / 700 = 0.857
    assert index.reserved_storage_bytes == 700
    assert index.watermark_level == Level.CRITICAL_WATERMARK_EXCEEDED
    assert node.unclaimed_storage_bytes == 0


@pytest.mark.parametrize(
    "neighbour_reserved",
    [
        pytest.param(500, id="node-with-exactly-nothing-unclaimed"),
        pytest.param(900, id="node-with-negative-unclaimed"),
    ],
)
def test_a_growing_index_keeps_its_reservation_when_its_node_has_nothing_unclaimed(
    now, neighbour_reserved
):
    node = node_with_usable_storage(1_000)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=neighbour_reserved)
    index = index_with_repositories(700, reserved_storage_bytes=500, zoekt_node=node)
    index.update_storage_bytes_and_watermark_level()
    index.refresh_from_db()
    assert index.reserved_storage_bytes == 500
    assert index.used_storage_bytes == 700
    assert index.watermark_level == Level.CRITICAL_WATERMARK_EXCEEDED


def test_a_ready_index_shrinks_to_its_ideal_reservation(now):
    index = index_with_repositories(
        600,
        state=State.READY,
        reserved_storage_bytes=3_000,
        zoekt_node=node_with_usable_storage(100 * GIB),
    )
    index.update_storage_bytes_and_watermark_level()
    index.refresh_from_db()
    assert (index.reserved_storage_bytes, index.watermark_level) == (1_000, Level.HEALTHY)


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(State.PENDING, id="pending"),
        pytest.param(State.INITIALIZING, id="initializing"),
        pytest.param(State.PENDING_EVICTION, id="pending-eviction"),
    ],
)
def test_an_index_that_is_not_ready_keeps_its_larger_reservation(now, state):
    index = index_with_repositories(
        600, state=state, reserved_storage_bytes=3_000, zoekt_node=node_with_usable_storage(GIB)
    )
    index.update_storage_bytes_and_watermark_level()
    index.refresh_from_db()
    assert index.reserved_storage_bytes == 3_000
    assert index.used_storage_bytes == 600
    assert index.watermark_level == Level.OVERPROVISIONED


def test_an_empty_index_on_a_full_node_keeps_0_reserved_and_turns_critical(now):
    node = node_with_usable_storage(1_000)
    IndexFactory(zoekt_node=node, reserved_storage_bytes=1_000)
    index = index_with_repositories(reserved_storage_bytes=0, zoekt_node=node)
    index.update_storage_bytes_and_watermark_level()
    index.refresh_from_db()
    assert (index.used_storage_bytes, index.reserved_storage_bytes) == (1024, 0)
    assert index.watermark_level == Level.CRITICAL_WATERMARK_EXCEEDED


def test_an_empty_index_with_room_claims_about_1_7_kb(now):
    index = index_with_repositories(
        reserved_storage_bytes=0, zoekt_node=node_with_usable_storage(GIB)
    )
    index.update_storage_bytes_and_watermark_level()
    index.refresh_from_db()
    assert (index.reserved_storage_bytes, index.watermark_level) == (1_706, Level.HEALTHY)


def test_the_refresh_updates_the_instance_it_was_called_on(now):
    index = index_with_repositories(
        600,
        state=State.READY,
        reserved_storage_bytes=3_000,
        zoekt_node=node_with_usable_storage(GIB),
    )
    index.update_storage_bytes_and_watermark_level()
    assert index.used_storage_bytes == 600
    assert index.used_storage_bytes_updated_at == now
    assert index.reserved_storage_bytes == 1_000
    assert index.watermark_level == Level.HEALTHY


def test_skipping_the_used_bytes_refresh_resizes_from_the_stored_used_bytes(now):
    index = index_with_repositories(
        900,
        state=State.READY,
        used_storage_bytes=600,
        used_storage_bytes_updated_at=EPOCH,
        reserved_storage_bytes=3_000,
        zoekt_node=node_with_usable_storage(GIB),
    )
    index.update_storage_bytes_and_watermark_level(skip_used_storage_bytes=True)
    index.refresh_from_db()
    assert index.used_storage_bytes == 600
    assert index.used_storage_bytes_updated_at == EPOCH
    assert (index.reserved_storage_bytes, index.watermark_level) == (1_000, Level.HEALTHY)


def test_a_refresh_leaves_other_indices_alone(now):
    node = node_with_usable_storage(GIB)
    neighbour = IndexFactory(zoekt_node=node, reserved_storage_bytes=3_000, used_storage_bytes=5)
    index = index_with_repositories(600, state=State.READY, zoekt_node=node)
    before = Index.objects.filter(pk=neighbour.pk).values().get()
    index.update_storage_bytes_and_watermark_level()
    assert Index.objects.filter(pk=neighbour.pk).values().get() == before


# --- scopes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(
            state, state in (State.PENDING, State.IN_PROGRESS, State.INITIALIZING), id=state.label
        )
        for state in State
    ],
)
def test_pre_ready_is_pending_in_progress_or_initializing(state, expected):
    index = IndexFactory(state=state)
    assert (index.pk in pks(Index.objects.pre_ready())) is expected


def test_the_pre_ready_states_are_gitlabs():
    assert set(Index.PRE_READY_STATES) == {State.PENDING, State.IN_PROGRESS, State.INITIALIZING}


def test_searchable_indices_are_ready_and_their_namespace_has_search_on():
    searchable = IndexFactory(state=State.READY)
    IndexFactory(state=State.INITIALIZING)
    IndexFactory(
        state=State.READY,
        zoekt_replica=ReplicaFactory(zoekt_enabled_namespace=EnabledNamespaceFactory(search=False)),
    )
    IndexFactory(state=State.READY, zoekt_enabled_namespace=None)
    assert pks(Index.objects.searchable()) == {searchable.pk}


def test_for_root_namespace_id_needs_a_matching_namespace_and_an_enabled_namespace():
    index = IndexFactory()
    namespace_id = index.namespace_id
    IndexFactory()  # another namespace
    IndexFactory(zoekt_enabled_namespace=None, namespace_id=namespace_id)
    assert pks(Index.objects.for_root_namespace_id(namespace_id)) == {index.pk}


def test_an_index_whose_enabled_namespace_was_deleted_is_not_found_for_its_root():
    index = IndexFactory()
    EnabledNamespace.objects.filter(pk=index.zoekt_enabled_namespace_id).delete()
    assert pks(Index.objects.for_root_namespace_id(index.namespace_id)) == set()


@pytest.mark.parametrize(
    ("repository_states", "finished"),
    [
        pytest.param([], True, id="no-repositories"),
        pytest.param(["READY", "READY"], True, id="all-ready"),
        pytest.param(["READY", "FAILED"], True, id="ready-or-failed"),
        pytest.param(["READY", "PENDING"], False, id="one-pending"),
        pytest.param(["READY", "INITIALIZING"], False, id="one-initializing"),
        pytest.param(["FAILED", "ORPHANED"], False, id="one-orphaned"),
        pytest.param(["READY", "PENDING_DELETION"], False, id="one-pending-deletion"),
        pytest.param(["READY", "DELETED"], False, id="one-deleted"),
    ],
)
def test_an_index_has_finished_when_every_repository_is_ready_or_failed(
    repository_states, finished
):
    index = IndexFactory(state=State.INITIALIZING)
    for name in repository_states:
        RepositoryFactory(zoekt_index=index, state=Repository.State[name])
    other = IndexFactory()
    RepositoryFactory(zoekt_index=other, state=Repository.State.PENDING)
    assert pks(Index.objects.with_all_finished_repositories()) == (
        {index.pk} if finished else set()
    )


@pytest.mark.parametrize(
    ("last_indexed", "updated", "stale"),
    [
        pytest.param(EPOCH, EPOCH, True, id="a-fresh-index-is-stale"),
        pytest.param("now", "an-hour-ago", True, id="indexed-after-the-refresh-is-stale"),
        pytest.param("now", "now", True, id="indexed-at-the-refresh-is-stale"),
        pytest.param("an-hour-ago", "now", False, id="refreshed-after-indexing-is-latest"),
    ],
)
def test_used_bytes_are_stale_when_indexed_since_the_last_refresh(
    now, last_indexed, updated, stale
):
    times = {"now": now, "an-hour-ago": now - timedelta(hours=1), EPOCH: EPOCH}
    index = IndexFactory(
        last_indexed_at=times[last_indexed], used_storage_bytes_updated_at=times[updated]
    )
    in_stale = index.pk in pks(Index.objects.with_stale_used_storage_bytes_updated_at())
    in_latest = index.pk in pks(Index.objects.with_latest_used_storage_bytes_updated_at())
    assert (in_stale, in_latest) == (stale, not stale)


def test_a_refresh_moves_an_index_from_stale_to_latest(now):
    index = index_with_repositories(
        10, last_indexed_at=now, zoekt_node=node_with_usable_storage(GIB)
    )
    assert pks(Index.objects.with_stale_used_storage_bytes_updated_at()) == {index.pk}
    clock.advance(1)
    index.update_storage_bytes_and_watermark_level()
    assert pks(Index.objects.with_stale_used_storage_bytes_updated_at()) == set()
    assert pks(Index.objects.with_latest_used_storage_bytes_updated_at()) == {index.pk}


def test_negative_reserved_storage_bytes_finds_only_negative_reservations():
    negative = IndexFactory(reserved_storage_bytes=-1)
    IndexFactory(reserved_storage_bytes=0)
    IndexFactory(reserved_storage_bytes=None)
    IndexFactory(reserved_storage_bytes=1)
    assert pks(Index.objects.negative_reserved_storage_bytes()) == {negative.pk}


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(state, state not in (State.ORPHANED, State.PENDING_DELETION), id=state.label)
        for state in State
    ],
)
def test_an_index_without_a_replica_should_be_orphaned_unless_it_already_is(state, expected):
    index = ReplicalessIndexFactory(state=state)
    IndexFactory(state=state)  # has both its replica and its enabled namespace
    assert pks(Index.objects.should_be_marked_as_orphaned()) == ({index.pk} if expected else set())


def test_an_index_without_an_enabled_namespace_should_be_orphaned():
    index = IndexFactory(state=State.READY)
    Index.objects.filter(pk=index.pk).update(zoekt_enabled_namespace=None)
    assert pks(Index.objects.should_be_marked_as_orphaned()) == {index.pk}


def test_deleting_an_enabled_namespace_leaves_its_indices_to_be_orphaned():
    index = IndexFactory(state=State.READY)
    EnabledNamespace.objects.filter(pk=index.zoekt_enabled_namespace_id).delete()
    index.refresh_from_db()
    assert (index.zoekt_enabled_namespace_id, index.zoekt_replica_id) == (None, None)
    assert pks(Index.objects.should_be_marked_as_orphaned()) == {index.pk}


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(
            state,
            state
            not in (
                State.PENDING_EVICTION,
                State.EVICTED,
                State.ORPHANED,
                State.PENDING_DELETION,
            ),
            id=state.label,
        )
        for state in State
    ],
)
def test_a_critical_index_should_be_evicted_unless_already_leaving(state, expected):
    index = IndexFactory(state=state, watermark_level=Level.CRITICAL_WATERMARK_EXCEEDED)
    IndexFactory(state=state, watermark_level=Level.HIGH_WATERMARK_EXCEEDED)
    assert pks(Index.objects.should_be_pending_eviction()) == ({index.pk} if expected else set())


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(state, state in (State.ORPHANED, State.PENDING_DELETION), id=state.label)
        for state in State
    ],
)
def test_only_orphaned_or_pending_deletion_indices_should_be_deleted(state, expected):
    index = IndexFactory(state=state)
    assert (index.pk in pks(Index.objects.should_be_deleted())) is expected
