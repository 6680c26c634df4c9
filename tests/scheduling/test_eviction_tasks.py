"""Eviction: index_should_be_marked_as_pending_eviction_check and indices_to_evict_check (6.5(b)),
and node-level eviction behind zoekt_node_level_eviction_enabled (6.5(a))."""

from __future__ import annotations

from datetime import timedelta

import pytest

from eviction import actions as eviction
from eviction.models import EvictionDecision
from tests.factories import (
    GIB,
    EnabledNamespaceFactory,
    IndexFactory,
    NamespaceRootStorageStatisticsFactory,
    NodeFactory,
    ReplicaFactory,
)
from tests.scheduling import builders
from tests.scheduling.conftest import set_setting
from zoekt.models import EnabledNamespace, Index, Replica
from zoekt.reasons import Reason
from zoekt.scheduling import handlers

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _delete_step(db):
    """These are GitLab's paths (mark, then evict the replica): moves off. The moves'
    own tests are in tests/eviction/test_moves.py."""
    set_setting(zoekt_eviction_moves=False)


I = Index.State  # noqa: E741
CRITICAL = Index.WatermarkLevel.CRITICAL_WATERMARK_EXCEEDED


# --- index_should_be_marked_as_pending_eviction_check --------------------------------------------


@pytest.mark.parametrize(
    ("state", "dispatches"),
    [
        pytest.param(I.READY, True, id="ready"),
        pytest.param(I.INITIALIZING, True, id="initializing"),
        pytest.param(I.PENDING_EVICTION, False, id="already-pending-eviction"),
        pytest.param(I.EVICTED, False, id="evicted"),
        pytest.param(I.ORPHANED, False, id="orphaned"),
        pytest.param(I.PENDING_DELETION, False, id="pending-deletion"),
    ],
)
def test_a_critical_index_outside_eviction_and_deletion_states_is_marked(
    service, dispatched, state, dispatches
):
    IndexFactory(state=state, watermark_level=CRITICAL)
    IndexFactory(state=I.READY)  # healthy

    service().execute("index_should_be_marked_as_pending_eviction_check")

    assert dispatched.names == (["mark_indices_pending_eviction"] if dispatches else [])


@pytest.mark.parametrize(
    ("count", "marked"),
    [pytest.param(1_000, 1_000, id="1000-all"), pytest.param(1_001, 1_000, id="1001-capped")],
)
def test_1000_critical_indices_are_marked_pending_eviction_per_event(now, count, marked):
    builders.indices(count, state=I.READY, watermark_level=CRITICAL)

    eviction.run_index_watermark()

    assert Index.objects.filter(state=I.PENDING_EVICTION).count() == marked
    applied = EvictionDecision.objects.filter(trigger="index_watermark", applied_at__isnull=False)
    assert sum(len(row.index_ids) for row in applied) == marked


# --- indices_to_evict_check ----------------------------------------------------------------


def test_indices_to_evict_check_needs_a_pending_eviction_index(service, dispatched):
    IndexFactory(state=I.READY)
    assert service().execute("indices_to_evict_check")["skipped"] == Reason.CONDITION_NOT_MET
    IndexFactory(state=I.PENDING_EVICTION)
    service().execute("indices_to_evict_check")
    assert dispatched.names == ["evict_indices"]


def test_eviction_takes_the_whole_replica_even_if_one_index_was_critical(now):
    replica = ReplicaFactory()
    critical = IndexFactory(zoekt_replica=replica, state=I.PENDING_EVICTION)
    sibling = IndexFactory(zoekt_replica=replica, state=I.READY)
    other = IndexFactory(state=I.READY)

    result = eviction.evict_indices()

    assert result["indices_evicted"] == 2
    assert result["replicas_deleted"] == 1
    assert not Replica.objects.filter(pk=replica.pk).exists()
    for index in (critical, sibling):
        index.refresh_from_db()
        assert (index.state, index.zoekt_replica_id) == (I.EVICTED, None)
        assert index.zoekt_enabled_namespace_id is not None  # keeps its slot until deleted
    assert Index.objects.get(pk=other.pk).state == I.READY


@pytest.mark.parametrize(
    ("count", "replicas"),
    [pytest.param(1_000, 1_000, id="1000-all"), pytest.param(1_001, 1_000, id="1001-capped")],
)
def test_1000_pending_eviction_indices_are_taken_per_event(now, count, replicas):
    builders.indices(count, state=I.PENDING_EVICTION)

    result = eviction.evict_indices()

    assert result["replicas_deleted"] == replicas
    assert Index.objects.filter(state=I.EVICTED).count() == replicas
    assert Index.objects.filter(state=I.PENDING_EVICTION).count() == count - replicas


def test_evicted_indices_are_then_orphaned(service, dispatched, now):
    IndexFactory(state=I.PENDING_EVICTION)
    eviction.evict_indices()
    service().execute("index_should_be_marked_as_orphaned_check")
    assert dispatched.names == ["orphan_indices"]
    handlers.orphan_indices()
    assert Index.objects.get().state == I.ORPHANED


# --- node-level eviction (GitLab's SaaS legacy) --------------------------------------------------


def namespace_on(node, size_bytes: int) -> EnabledNamespace:
    """An enabled namespace of the given GitLab repository size, with a replica on ``node``."""
    stats = NamespaceRootStorageStatisticsFactory(repository_size=size_bytes)
    enabled = EnabledNamespaceFactory(root_namespace=stats.namespace)
    IndexFactory(
        zoekt_replica=ReplicaFactory(zoekt_enabled_namespace=enabled),
        zoekt_node=node,
        used_storage_bytes=size_bytes,
    )
    return enabled


def test_node_level_eviction_is_off_by_default(service, now):
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=80 * GIB)
    namespace_on(node, GIB)

    result = service().execute("eviction")

    assert result == {"task": "eviction", "skipped": Reason.NODE_LEVEL_EVICTION_DISABLED}
    assert Replica.objects.count() == 1


def test_node_level_eviction_dispatches_its_job_when_a_node_is_over_high(service, dispatched, now):
    set_setting(zoekt_node_level_eviction_enabled=True)
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=80 * GIB)
    namespace_on(hot, 5 * GIB)

    result = service().execute("eviction")

    assert result == {
        "task": "eviction",
        "dispatched": ["evict_from_nodes"],
        "nodes_over_high_watermark": 1,
    }
    assert dispatched.names == ["evict_from_nodes"]


def test_legacy_node_level_eviction_takes_the_smallest_namespaces_until_under_the_low_watermark(
    now,
):
    set_setting(zoekt_node_level_eviction_enabled=True, zoekt_node_eviction_safeguards=False)
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=80 * GIB)  # 80 % ≥ 75 %
    small = namespace_on(hot, 5 * GIB)  # 75 %: still ≥ 60 %
    crossing = namespace_on(hot, 16 * GIB)  # 59 %: crosses the line, taken
    largest = namespace_on(hot, 30 * GIB)
    elsewhere = NodeFactory()
    # The crossing namespace has a second replica on another node: it goes too.
    IndexFactory(
        zoekt_replica=ReplicaFactory(zoekt_enabled_namespace=crossing),
        zoekt_node=elsewhere,
        used_storage_bytes=7,
    )

    result = eviction.run_node_level()

    assert result["namespaces_affected"] == 2
    (decision,) = EvictionDecision.objects.all()
    assert (decision.mode, decision.reason) == ("legacy", Reason.EVICTION_OVER_HIGH_WATERMARK)
    assert decision.details["replicas_deleted"] == 3
    left = set(Replica.objects.values_list("zoekt_enabled_namespace_id", flat=True))
    assert left == {largest.id}
    small.refresh_from_db()
    crossing.refresh_from_db()
    assert small.metadata["last_used_storage_bytes"] == 5 * GIB
    assert crossing.metadata["last_used_storage_bytes"] == 16 * GIB
    # Their indices lost their replica: the orphan check takes them from here.
    assert Index.objects.should_be_marked_as_orphaned().count() == 3


@pytest.mark.parametrize(
    ("used_gib", "online", "evicts"),
    [
        pytest.param(75, True, True, id="at-the-high-watermark"),
        pytest.param(74, True, False, id="below-the-high-watermark"),
        pytest.param(90, False, False, id="offline-node"),
    ],
)
def test_only_online_nodes_at_or_above_the_high_watermark_are_relieved(
    now, used_gib, online, evicts
):
    set_setting(zoekt_node_level_eviction_enabled=True, zoekt_node_eviction_safeguards=False)
    seen = now if online else now - timedelta(minutes=1)
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=used_gib * GIB, last_seen_at=seen)
    namespace_on(node, 20 * GIB)

    result = eviction.run_node_level()

    assert (Replica.objects.count() == 0) is evicts
    if not evicts:
        assert result["skipped"] == Reason.CONDITION_NOT_MET


def test_node_level_eviction_runs_once_per_5_minutes(service, now):
    set_setting(zoekt_node_level_eviction_enabled=True)
    assert service().execute("eviction")["skipped"] == Reason.CONDITION_NOT_MET
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=80 * GIB)
    namespace_on(node, 30 * GIB)
    assert service().execute("eviction") == {
        "task": "eviction",
        "skipped": Reason.THROTTLED,
        "period_seconds": 300,
    }
    assert Replica.objects.count() == 1
