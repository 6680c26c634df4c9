"""The global buffer factor as GitLab's newest code computes it, cached in Redis for an hour.

Per root namespace: the used bytes of its ready indices above the 1 KiB
placeholder, over its root storage statistics' repository size (no
statistics row, or size 0: left out). The ratio of the sums, times the
safety margin (1 / 0.6) × 1.5 = 2.5; 3.0 when there is nothing to observe.
"""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django.core.cache import cache

from tests.factories import (
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NamespaceRootStorageStatisticsFactory,
    NodeFactory,
    ProjectFactory,
    ReplicaFactory,
    RepositoryFactory,
)
from tests.locking import advisory_lock_held_elsewhere
from zoekt import buffer_factor, capacity
from zoekt.buffer_factor import (
    compute_global_buffer_factor,
    global_buffer_factor,
    refresh_global_buffer_factor,
)
from zoekt.locks import LockKey
from zoekt.models import Index
from zoekt.reasons import Reason
from zoekt.tasks import refresh_buffer_factor_task

pytestmark = pytest.mark.django_db

State = Index.State
MIB = 1024**2
PLACEHOLDER = capacity.DEFAULT_USED_STORAGE_BYTES
NO_STATISTICS = object()


def namespace(repository_size=NO_STATISTICS):
    """An enabled root namespace, with a root statistics row unless told otherwise."""
    root = GroupFactory()
    if repository_size is not NO_STATISTICS:
        NamespaceRootStorageStatisticsFactory(namespace=root, repository_size=repository_size)
    return EnabledNamespaceFactory(root_namespace=root)


def index_of(enabled, used: int, *, state=State.READY, replica=None) -> Index:
    """One index of ``enabled`` on a node of its own, using ``used`` bytes."""
    replica = replica or ReplicaFactory(zoekt_enabled_namespace=enabled)
    return IndexFactory(zoekt_replica=replica, state=state, used_storage_bytes=used)


def observed(used: int, repository_size: int) -> float:
    return used / repository_size * 2.5


# --- the margin ----------------------------------------------------------------------------------


def test_the_safety_margin_is_one_over_the_ideal_fill_times_one_and_a_half():
    assert pytest.approx((1 / 0.6) * 1.5) == buffer_factor.SAFETY_MARGIN
    assert pytest.approx(2.5) == buffer_factor.SAFETY_MARGIN


def test_a_freshly_provisioned_index_is_not_critical_under_the_margin():
    # Planned reserved = repository size × factor = used × margin, so used ÷ reserved = 1 / margin.
    margin = buffer_factor.SAFETY_MARGIN
    assert 1 / margin < capacity.STORAGE_CRITICAL_WATERMARK
    assert 1 / margin < capacity.STORAGE_IDEAL_PERCENT_USED


# --- the observed factor -------------------------------------------------------------------------


def test_one_namespace_gives_its_used_bytes_over_its_repository_size_times_the_margin():
    index_of(namespace(repository_size=4 * MIB), 2 * MIB)
    factor = compute_global_buffer_factor()
    assert (factor.used_storage_bytes, factor.repository_size) == (2 * MIB, 4 * MIB)
    assert factor.value == pytest.approx(0.5 * 2.5)
    assert factor.reason == Reason.BUFFER_FACTOR_OBSERVED
    assert factor.namespaces == 1


def test_the_factor_is_the_ratio_of_the_sums_not_the_mean_of_the_ratios():
    index_of(namespace(repository_size=1 * MIB), 2 * MIB)  # ratio 2
    index_of(namespace(repository_size=4 * MIB), 1 * MIB)  # ratio 0.25
    factor = compute_global_buffer_factor()
    assert factor.value == pytest.approx(3 / 5 * 2.5)  # the mean of the ratios would be 2.8125
    assert factor.value != pytest.approx((2 + 0.25) / 2 * 2.5)
    assert (factor.used_storage_bytes, factor.repository_size, factor.namespaces) == (
        3 * MIB,
        5 * MIB,
        2,
    )


def test_the_ready_indices_of_one_namespace_add_up_against_its_one_repository_size():
    enabled = namespace(repository_size=10 * MIB)
    replica = ReplicaFactory(zoekt_enabled_namespace=enabled)
    index_of(enabled, 3 * MIB, replica=replica)
    index_of(enabled, 2 * MIB, replica=replica)
    factor = compute_global_buffer_factor()
    assert (factor.used_storage_bytes, factor.repository_size) == (5 * MIB, 10 * MIB)
    assert factor.value == pytest.approx(observed(5 * MIB, 10 * MIB))


@pytest.mark.parametrize(
    ("used", "counted"),
    [
        pytest.param(0, False, id="nothing-used"),
        pytest.param(PLACEHOLDER, False, id="exactly-the-1-KiB-placeholder"),
        pytest.param(PLACEHOLDER + 1, True, id="one-byte-above-the-placeholder"),
    ],
)
def test_indices_at_or_below_the_placeholder_are_left_out(used, counted):
    index_of(namespace(repository_size=2 * MIB), 1 * MIB)
    index_of(namespace(repository_size=1 * MIB), used)
    factor = compute_global_buffer_factor()
    if counted:
        assert factor.used_storage_bytes == 1 * MIB + used
        assert factor.repository_size == 3 * MIB
    else:
        assert (factor.used_storage_bytes, factor.repository_size) == (1 * MIB, 2 * MIB)
        assert factor.value == pytest.approx(observed(1 * MIB, 2 * MIB))


def test_placeholder_sized_ready_indices_cannot_drive_the_factor_towards_0():
    index_of(namespace(repository_size=100 * MIB), 150 * MIB)
    for _ in range(5):  # ready, but their used bytes were never measured: the placeholder
        index_of(namespace(repository_size=10 * 1024 * MIB), PLACEHOLDER)
    factor = compute_global_buffer_factor()
    assert factor.namespaces == 1
    assert factor.value == pytest.approx(1.5 * 2.5)


def test_a_placeholder_index_beside_a_measured_one_adds_nothing_to_its_namespace():
    enabled = namespace(repository_size=4 * MIB)
    replica = ReplicaFactory(zoekt_enabled_namespace=enabled)
    index_of(enabled, 2 * MIB, replica=replica)
    index_of(enabled, PLACEHOLDER, replica=replica)
    assert compute_global_buffer_factor().used_storage_bytes == 2 * MIB


@pytest.mark.parametrize(
    "repository_size",
    [
        pytest.param(NO_STATISTICS, id="no-root-statistics-row"),
        pytest.param(0, id="repository-size-0"),
    ],
)
def test_namespaces_without_a_repository_size_are_left_out(repository_size):
    index_of(namespace(repository_size=2 * MIB), 1 * MIB)
    index_of(namespace(repository_size), 50 * MIB)
    factor = compute_global_buffer_factor()
    assert (factor.used_storage_bytes, factor.repository_size, factor.namespaces) == (
        1 * MIB,
        2 * MIB,
        1,
    )
    assert factor.value == pytest.approx(observed(1 * MIB, 2 * MIB))


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(State.PENDING, id="pending"),
        pytest.param(State.INITIALIZING, id="initializing"),
        pytest.param(State.PENDING_EVICTION, id="pending-eviction"),
        pytest.param(State.EVICTED, id="evicted"),
        pytest.param(State.ORPHANED, id="orphaned"),
    ],
)
def test_indices_that_are_not_ready_are_not_observed(state):
    index_of(namespace(repository_size=2 * MIB), 1 * MIB)
    index_of(namespace(repository_size=1 * MIB), 90 * MIB, state=state)
    factor = compute_global_buffer_factor()
    assert (factor.used_storage_bytes, factor.repository_size) == (1 * MIB, 2 * MIB)


def test_an_index_whose_enabled_namespace_is_gone_is_not_observed():
    index_of(namespace(repository_size=2 * MIB), 1 * MIB)
    gone = index_of(namespace(repository_size=1 * MIB), 90 * MIB)
    Index.objects.filter(pk=gone.pk).update(zoekt_enabled_namespace=None)
    assert compute_global_buffer_factor().used_storage_bytes == 1 * MIB


def test_repository_sizes_come_from_the_root_statistics_not_the_projects():
    enabled = namespace(repository_size=8 * MIB)
    index = index_of(enabled, 4 * MIB)
    # The project's own statistics say 1 MiB; the root namespace's row is what counts.
    project = ProjectFactory(namespace=enabled.root_namespace, repository_size=1 * MIB)
    RepositoryFactory(zoekt_index=index, project=project)
    assert compute_global_buffer_factor().repository_size == 8 * MIB


def build_one_of_each_excluded_kind() -> None:
    index_of(namespace(repository_size=5 * MIB), PLACEHOLDER)
    index_of(namespace(), 5 * MIB)
    index_of(namespace(repository_size=0), 5 * MIB)
    index_of(namespace(repository_size=5 * MIB), 5 * MIB, state=State.INITIALIZING)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: None, id="an-empty-fleet"),
        pytest.param(
            lambda: index_of(namespace(repository_size=MIB), MIB, state=State.PENDING),
            id="nothing-ready",
        ),
        pytest.param(
            lambda: index_of(namespace(repository_size=MIB), PLACEHOLDER), id="only-placeholders"
        ),
        pytest.param(lambda: index_of(namespace(), MIB), id="no-statistics"),
        pytest.param(build_one_of_each_excluded_kind, id="one-of-each-excluded-kind"),
    ],
)
def test_without_observations_the_factor_is_3(build):
    build()
    factor = compute_global_buffer_factor()
    assert factor.value == 3.0
    assert factor.reason == Reason.BUFFER_FACTOR_NO_OBSERVATIONS
    assert (factor.used_storage_bytes, factor.repository_size, factor.namespaces) == (0, 0, 0)


def test_the_factor_of_a_fleet_with_nodes_and_replicas_of_many_namespaces():
    nodes = [NodeFactory() for _ in range(3)]
    sizes = [(3 * MIB, 2 * MIB), (7 * MIB, 5 * MIB), (1 * MIB, 9 * MIB)]
    for (size, used), node in zip(sizes, nodes, strict=True):
        enabled = namespace(repository_size=size)
        IndexFactory(
            zoekt_replica=ReplicaFactory(zoekt_enabled_namespace=enabled),
            zoekt_node=node,
            state=State.READY,
            used_storage_bytes=used,
        )
    assert compute_global_buffer_factor().value == pytest.approx(16 / 11 * 2.5)


# --- caching in Redis ----------------------------------------------------------------------------


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])


def test_the_factor_is_computed_and_stored_in_redis_for_an_hour_on_first_use():
    index_of(namespace(repository_size=2 * MIB), 1 * MIB)
    assert cache.get(buffer_factor.CACHE_KEY) is None
    assert global_buffer_factor() == pytest.approx(1.25)
    stored = cache.get(buffer_factor.CACHE_KEY)
    assert stored["value"] == pytest.approx(1.25)
    assert stored["reason"] == Reason.BUFFER_FACTOR_OBSERVED
    assert buffer_factor.CACHE_SECONDS == 3600
    ttl = redis_client().ttl(cache.make_key(buffer_factor.CACHE_KEY))
    assert 3590 < ttl <= 3600


def test_the_cached_factor_is_served_until_it_is_refreshed():
    index = index_of(namespace(repository_size=2 * MIB), 1 * MIB)
    assert global_buffer_factor() == pytest.approx(1.25)
    Index.objects.filter(pk=index.pk).update(used_storage_bytes=2 * MIB)
    assert global_buffer_factor() == pytest.approx(1.25)
    assert refresh_global_buffer_factor().value == pytest.approx(2.5)
    assert global_buffer_factor() == pytest.approx(2.5)


def test_a_cache_entry_from_elsewhere_is_replaced_by_an_observation():
    index_of(namespace(repository_size=2 * MIB), 1 * MIB)
    cache.set(buffer_factor.CACHE_KEY, "not a factor")
    assert global_buffer_factor() == pytest.approx(1.25)
    assert cache.get(buffer_factor.CACHE_KEY)["value"] == pytest.approx(1.25)


# --- the hourly job ------------------------------------------------------------------------------


def test_the_job_refreshes_the_cached_factor_and_reports_it():
    index = index_of(namespace(repository_size=2 * MIB), 1 * MIB)
    global_buffer_factor()
    Index.objects.filter(pk=index.pk).update(used_storage_bytes=3 * MIB)
    assert refresh_buffer_factor_task() == {
        "buffer_factor": pytest.approx(3.75),
        "reason": Reason.BUFFER_FACTOR_OBSERVED,
        "used_storage_bytes": 3 * MIB,
        "repository_size": 2 * MIB,
    }
    assert global_buffer_factor() == pytest.approx(3.75)


def test_the_job_reports_the_fallback_when_nothing_is_observed():
    result = refresh_buffer_factor_task()
    assert (result["buffer_factor"], result["reason"]) == (
        3.0,
        Reason.BUFFER_FACTOR_NO_OBSERVATIONS,
    )
    assert cache.get(buffer_factor.CACHE_KEY)["value"] == 3.0


def test_the_job_skips_and_leaves_the_cache_alone_while_its_lock_is_held():
    index = index_of(namespace(repository_size=2 * MIB), 1 * MIB)
    global_buffer_factor()
    Index.objects.filter(pk=index.pk).update(used_storage_bytes=3 * MIB)
    with advisory_lock_held_elsewhere(LockKey.REFRESH_BUFFER_FACTOR):
        assert refresh_buffer_factor_task() == {"skipped": "lock_held"}
        assert cache.get(buffer_factor.CACHE_KEY)["value"] == pytest.approx(1.25)
    assert refresh_buffer_factor_task()["buffer_factor"] == pytest.approx(3.75)
