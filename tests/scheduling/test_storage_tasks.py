"""Storage upkeep: update_index_used_storage_bytes (4.3), force_update_overprovisioned_index,
index_mismatched_watermark_check, node_with_negative_unclaimed_storage_bytes_check (6.5(c))."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from eviction import actions as eviction
from eviction import tasks as eviction_tasks
from eviction.models import EvictionDecision
from tests.factories import GIB, IndexFactory, NodeFactory, RepositoryFactory
from tests.scheduling import builders
from zoekt import app_settings, clock
from zoekt.clock import EPOCH
from zoekt.models import Index, Node
from zoekt.reasons import Reason
from zoekt.scheduling import handlers

pytestmark = pytest.mark.django_db

I = Index.State  # noqa: E741
W = Index.WatermarkLevel
set_setting = app_settings.update


def fresh(**fields) -> dict:
    """Fields of an index whose used bytes were refreshed after its last indexing."""
    return {"last_indexed_at": EPOCH, "used_storage_bytes_updated_at": clock.now(), **fields}


# --- update_index_used_storage_bytes ---------------------------------------------------------


def test_update_index_used_storage_bytes_dispatches_while_a_stale_index_exists(service, dispatched):
    index = IndexFactory(**fresh())
    assert service().execute("update_index_used_storage_bytes")["skipped"] == (
        Reason.CONDITION_NOT_MET
    )

    Index.objects.filter(pk=index.pk).update(last_indexed_at=clock.now())  # a callback since
    service().execute("update_index_used_storage_bytes")
    assert dispatched.names == ["update_index_used_storage_bytes"]


def test_a_brand_new_index_is_stale(service, dispatched):
    IndexFactory()
    service().execute("update_index_used_storage_bytes")
    assert dispatched.names == ["update_index_used_storage_bytes"]


def test_the_refresh_sums_repository_sizes_and_resizes_the_reservation(now):
    index = IndexFactory(state=I.READY, reserved_storage_bytes=10 * GIB)
    RepositoryFactory(zoekt_index=index, size_bytes=3 * GIB)
    RepositoryFactory(zoekt_index=index, size_bytes=3 * GIB)

    result = handlers.update_index_used_storage_bytes()

    index.refresh_from_db()
    assert result == {"indices_refreshed": 1, "re_emit": False}
    assert index.used_storage_bytes == 6 * GIB
    assert index.used_storage_bytes_updated_at == now
    assert index.reserved_storage_bytes == 10 * GIB  # 6 GiB ÷ 0.6, truncated
    assert index.watermark_level == W.HEALTHY


def test_an_empty_index_counts_1_kib(now):
    index = IndexFactory()
    handlers.update_index_used_storage_bytes()
    index.refresh_from_db()
    assert index.used_storage_bytes == 1024


@pytest.mark.parametrize(
    ("stale", "refreshed", "re_emit"),
    [
        pytest.param(1_000, 1_000, False, id="1000-all"),
        pytest.param(1_001, 1_000, True, id="1001-re-emits"),
    ],
)
def test_1000_stale_indices_are_refreshed_per_event_oldest_first(now, stale, refreshed, re_emit):
    built = builders.indices(stale)
    # The newest-refreshed index is the one left for the next event.
    Index.objects.filter(pk=built[0].pk).update(
        used_storage_bytes_updated_at=now - timedelta(hours=1),
        last_indexed_at=now - timedelta(minutes=30),
    )

    result = handlers.update_index_used_storage_bytes()

    assert result == {"indices_refreshed": refreshed, "re_emit": re_emit}
    left = Index.objects.with_stale_used_storage_bytes_updated_at()
    if re_emit:
        assert list(left.values_list("pk", flat=True)) == [built[0].pk]
    else:
        assert not left.exists()


# --- force_update_overprovisioned_index -------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "dispatches"),
    [
        pytest.param(fresh(state=I.READY, watermark_level=W.OVERPROVISIONED), True, id="ready"),
        pytest.param(
            fresh(state=I.INITIALIZING, watermark_level=W.OVERPROVISIONED),
            False,
            id="not-ready",
        ),
        pytest.param(
            {"state": I.READY, "watermark_level": W.OVERPROVISIONED}, False, id="used-bytes-stale"
        ),
        pytest.param(fresh(state=I.READY, watermark_level=W.HEALTHY), False, id="healthy"),
    ],
)
def test_force_update_needs_a_ready_overprovisioned_index_with_fresh_used_bytes(
    service, dispatched, fields, dispatches
):
    IndexFactory(**fields)
    service().execute("force_update_overprovisioned_index")
    assert dispatched.names == (["shrink_overprovisioned_indices"] if dispatches else [])


def test_shrinking_keeps_the_used_bytes_and_returns_the_rest_to_the_node(now):
    index = IndexFactory(
        **fresh(
            state=I.READY,
            watermark_level=W.OVERPROVISIONED,
            used_storage_bytes=6 * GIB,
            reserved_storage_bytes=30 * GIB,
        )
    )
    RepositoryFactory(zoekt_index=index, size_bytes=1)  # ignored: used bytes are not recounted

    result = handlers.shrink_overprovisioned_indices()

    index.refresh_from_db()
    assert result == {"indices_resized": 1, "re_emit": False}
    assert index.used_storage_bytes == 6 * GIB
    assert index.reserved_storage_bytes == 10 * GIB
    assert index.watermark_level == W.HEALTHY


@pytest.mark.parametrize(
    ("count", "resized", "re_emit"),
    [
        pytest.param(1_000, 1_000, False, id="1000-all"),
        pytest.param(1_001, 1_000, True, id="1001-re-emits"),
    ],
)
def test_1000_overprovisioned_indices_are_resized_per_event(now, count, resized, re_emit):
    builders.indices(
        count,
        **fresh(
            state=I.READY,
            watermark_level=W.OVERPROVISIONED,
            used_storage_bytes=GIB,
            reserved_storage_bytes=10 * GIB,
        ),
    )

    result = handlers.shrink_overprovisioned_indices()

    assert result == {"indices_resized": resized, "re_emit": re_emit}
    assert Index.objects.filter(watermark_level=W.OVERPROVISIONED).count() == count - resized


# --- index_mismatched_watermark_check ----------------------------------------------------------


def test_mismatched_watermarks_are_only_counted(service, dispatched):
    IndexFactory(used_storage_bytes=9, reserved_storage_bytes=10, watermark_level=W.HEALTHY)
    IndexFactory(used_storage_bytes=1, reserved_storage_bytes=10, watermark_level=W.OVERPROVISIONED)
    before = list(Index.objects.order_by("pk").values())

    result = service().execute("index_mismatched_watermark_check")

    assert result == {"task": "index_mismatched_watermark_check", "mismatched_indices": 1}
    assert dispatched == []
    assert list(Index.objects.order_by("pk").values()) == before


def test_no_mismatch_is_a_false_condition(service):
    IndexFactory(used_storage_bytes=1, reserved_storage_bytes=10, watermark_level=W.OVERPROVISIONED)
    result = service().execute("index_mismatched_watermark_check")
    assert result["skipped"] == Reason.CONDITION_NOT_MET


# --- node_with_negative_unclaimed_storage_bytes_check -----------------------------------------


def overcommitted_node(*reservations: int, **fields) -> Node:
    """A search node with 10 GiB usable and indices reserving ``reservations``."""
    node = NodeFactory(total_bytes=20 * GIB, used_bytes=10 * GIB, **fields)
    for reserved in reservations:
        IndexFactory(zoekt_node=node, reserved_storage_bytes=reserved)
    return node


def test_the_check_dispatches_the_search_nodes_with_negative_unclaimed_storage(service, dispatched):
    negative = overcommitted_node(8 * GIB, 8 * GIB)
    overcommitted_node(8 * GIB, 8 * GIB, services=[7])  # not a search node
    overcommitted_node(4 * GIB)  # positive

    result = service().execute("node_with_negative_unclaimed_storage_bytes_check")

    assert dispatched == [("evict_overcommitted_nodes", ([negative.id],))]
    assert result["nodes"] == 1


def test_no_negative_node_is_a_false_condition(service, dispatched):
    overcommitted_node(4 * GIB)
    result = service().execute("node_with_negative_unclaimed_storage_bytes_check")
    assert result["skipped"] == Reason.CONDITION_NOT_MET
    assert dispatched == []


def test_negative_nodes_are_dispatched_1000_ids_an_event(service, dispatched, now):
    nodes = Node.objects.bulk_create(
        [
            Node(
                uuid=uuid.uuid4(),
                index_base_url=f"http://n{i}",
                search_base_url=f"http://n{i}",
                usable_storage_bytes=0,
                last_seen_at=now,
            )
            for i in range(1_001)
        ]
    )
    group = builders.roots(1)[0]
    Index.objects.bulk_create(
        [Index(zoekt_node=node, namespace_id=group.id, reserved_storage_bytes=1) for node in nodes]
    )

    service().execute("node_with_negative_unclaimed_storage_bytes_check")

    assert [len(args[0]) for _, args in dispatched] == [1_000, 1]


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        pytest.param({"zoekt_indexing_enabled": False}, Reason.INDEXING_DISABLED, id="disabled"),
        pytest.param(
            {"zoekt_indexing_enabled": True, "zoekt_indexing_paused": True},
            Reason.INDEXING_PAUSED,
            id="paused",
        ),
        pytest.param(
            {"zoekt_indexing_enabled": False, "zoekt_indexing_paused": True},
            Reason.INDEXING_DISABLED,
            id="disabled-and-paused",
        ),
    ],
)
def test_the_walk_does_nothing_while_indexing_is_disabled_or_paused(settings, reason, now):
    set_setting(**settings)
    node = overcommitted_node(10 * GIB, 10 * GIB, 10 * GIB)  # 20 GiB short
    before = list(Index.objects.order_by("id").values_list("id", "state", "updated_at"))

    result = legacy_walk([node.id])

    assert (result["skipped"], result["nodes_listed"]) == (reason, 1)
    assert result["indices_marked_pending_eviction"] == 0
    assert list(Index.objects.order_by("id").values_list("id", "state", "updated_at")) == before


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        pytest.param({"zoekt_indexing_enabled": False}, Reason.INDEXING_DISABLED, id="disabled"),
        pytest.param(
            {"zoekt_indexing_enabled": True, "zoekt_indexing_paused": True},
            Reason.INDEXING_PAUSED,
            id="paused",
        ),
    ],
)
def test_the_negative_unclaimed_storage_event_does_nothing_while_indexing_is_off(
    settings, reason, now
):
    set_setting(**settings)
    node = overcommitted_node(10 * GIB, 10 * GIB, 10 * GIB)
    before = list(Index.objects.order_by("id").values_list("id", "state"))

    result = eviction_tasks.evict_overcommitted_nodes_task([node.id])

    assert result["skipped"] == reason
    assert list(Index.objects.order_by("id").values_list("id", "state")) == before


def test_the_negative_unclaimed_storage_event_walks_while_indexing_is_on(indexing_enabled, now):
    set_setting(zoekt_node_eviction_safeguards=False)
    node = overcommitted_node(10 * GIB, 10 * GIB, 10 * GIB)
    result = eviction_tasks.evict_overcommitted_nodes_task([node.id])
    assert result["decisions_applied"] == 1
    assert Index.objects.filter(state=I.PENDING_EVICTION).count() == 2


def legacy_walk(node_ids: list[int]) -> dict:
    """GitLab's negative-unclaimed walk: the eviction policy's legacy mode."""
    set_setting(zoekt_node_eviction_safeguards=False)
    result = eviction.run_negative_unclaimed(node_ids)
    applied = EvictionDecision.objects.filter(applied_at__isnull=False)
    marked = sum(row.details.get("indices_marked_pending_eviction", 0) for row in applied)
    return {**result, "indices_marked_pending_eviction": marked}


@pytest.mark.usefixtures("indexing_enabled")
def test_the_walk_marks_indices_in_id_order_until_the_shortfall_is_covered(now):
    node = overcommitted_node(10 * GIB, 10 * GIB, 10 * GIB)  # 20 GiB short
    first, second, third = Index.objects.filter(zoekt_node=node).order_by("id")

    result = legacy_walk([node.id])

    states = dict(Index.objects.values_list("id", "state"))
    assert states == {first.id: I.PENDING_EVICTION, second.id: I.PENDING_EVICTION, third.id: 0}
    assert result["indices_marked_pending_eviction"] == 2


@pytest.mark.usefixtures("indexing_enabled")
def test_the_walk_skips_pending_eviction_but_not_evicted_or_orphaned_indices(now):
    node = overcommitted_node()
    IndexFactory(zoekt_node=node, state=I.PENDING_EVICTION, reserved_storage_bytes=15 * GIB)
    evicted = IndexFactory(zoekt_node=node, state=I.EVICTED, reserved_storage_bytes=15 * GIB)

    legacy_walk([node.id])

    assert Index.objects.get(pk=evicted.pk).state == I.PENDING_EVICTION


@pytest.mark.usefixtures("indexing_enabled")
def test_the_walk_lists_at_most_1000_indices_of_a_node(now):
    node = NodeFactory(total_bytes=0, used_bytes=0)
    Node.objects.filter(pk=node.pk).update(usable_storage_bytes=-1)  # negative, nothing to cover
    builders.indices(1_001, node, reserved_storage_bytes=0)

    result = legacy_walk([node.id])

    assert result["indices_marked_pending_eviction"] == 1_000
    assert Index.objects.filter(state=I.PENDING_EVICTION).count() == 1_000


@pytest.mark.usefixtures("indexing_enabled")
def test_a_node_no_longer_negative_is_left_alone(now):
    node = overcommitted_node(4 * GIB)
    before = list(Index.objects.values_list("id", "state"))
    assert legacy_walk([node.id])["nodes_negative"] == 0
    assert list(Index.objects.values_list("id", "state")) == before


# --- update_index_used_bytes -------------------------------------------------------------------


def test_update_index_used_bytes_is_gitlabs_deprecated_no_op(service, dispatched):
    IndexFactory()
    assert service().execute("update_index_used_bytes") == {
        "task": "update_index_used_bytes",
        "skipped": Reason.DEPRECATED,
    }
    assert dispatched == []
