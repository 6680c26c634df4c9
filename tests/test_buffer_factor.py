"""The global buffer factor: observed over ready indices, falling back to 3, kept in Redis."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django.core.cache import cache

from tests.factories import IndexFactory, ProjectFactory, ReplicaFactory, RepositoryFactory
from tests.locking import advisory_lock_held_elsewhere
from zoekt import buffer_factor
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


def index_holding(used: int, *repository_sizes: int, state=State.READY, **kwargs) -> Index:
    """An index using ``used`` bytes that holds one project per Gitaly repository size."""
    index = IndexFactory(state=state, used_storage_bytes=used, **kwargs)
    for size in repository_sizes:
        RepositoryFactory(zoekt_index=index, project=ProjectFactory(repository_size=size))
    return index


# --- the observed factor -------------------------------------------------------------------------


def test_the_factor_is_index_bytes_per_repository_byte_over_ready_indices():
    index_holding(300, 60, 40)
    index_holding(500, 100)
    factor = compute_global_buffer_factor()
    assert (factor.used_storage_bytes, factor.repository_size) == (800, 200)
    assert factor.value == pytest.approx(4.0)
    assert factor.reason == Reason.BUFFER_FACTOR_OBSERVED


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
    index_holding(200, 100)
    index_holding(9_000, 1, state=state)
    factor = compute_global_buffer_factor()
    assert (factor.used_storage_bytes, factor.repository_size) == (200, 100)
    assert factor.value == pytest.approx(2.0)


def test_a_project_held_by_every_replica_is_counted_once_per_copy():
    replica_a = ReplicaFactory()
    replica_b = ReplicaFactory(zoekt_enabled_namespace=replica_a.zoekt_enabled_namespace)
    project = ProjectFactory(repository_size=100)
    for replica in (replica_a, replica_b):
        index = IndexFactory(zoekt_replica=replica, state=State.READY, used_storage_bytes=250)
        RepositoryFactory(zoekt_index=index, project=project)
    factor = compute_global_buffer_factor()
    assert factor.value == pytest.approx(2.5)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: None, id="an-empty-fleet"),
        pytest.param(lambda: index_holding(300, 100, state=State.INITIALIZING), id="nothing-ready"),
        pytest.param(lambda: index_holding(300), id="ready-but-holding-no-projects"),
        pytest.param(lambda: index_holding(300, 0), id="ready-but-repositories-of-size-0"),
        pytest.param(lambda: index_holding(0, 100), id="ready-but-nothing-used"),
    ],
)
def test_without_observations_the_factor_falls_back_to_3(build):
    build()
    factor = compute_global_buffer_factor()
    assert factor.value == 3.0
    assert factor.reason == Reason.BUFFER_FACTOR_NO_OBSERVATIONS


def test_a_project_without_statistics_adds_no_repository_size():
    index = index_holding(400, 100)
    RepositoryFactory(zoekt_index=index, project=ProjectFactory(repository_size=None))
    assert compute_global_buffer_factor().repository_size == 100


# --- caching in Redis ----------------------------------------------------------------------------


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])


def test_the_factor_is_computed_and_stored_in_redis_on_first_use():
    index_holding(300, 100)
    assert cache.get(buffer_factor.CACHE_KEY) is None
    assert global_buffer_factor() == pytest.approx(3.0)
    stored = cache.get(buffer_factor.CACHE_KEY)
    assert stored["value"] == pytest.approx(3.0)
    assert stored["reason"] == Reason.BUFFER_FACTOR_OBSERVED
    ttl = redis_client().ttl(cache.make_key(buffer_factor.CACHE_KEY))
    assert 0 < ttl <= 3600


def test_the_cached_factor_is_served_until_it_is_refreshed():
    index = index_holding(300, 100)
    assert global_buffer_factor() == pytest.approx(3.0)
    Index.objects.filter(pk=index.pk).update(used_storage_bytes=500)
    assert global_buffer_factor() == pytest.approx(3.0)
    assert refresh_global_buffer_factor().value == pytest.approx(5.0)
    assert global_buffer_factor() == pytest.approx(5.0)


def test_a_cache_entry_from_elsewhere_is_replaced_by_an_observation():
    index_holding(400, 100)
    cache.set(buffer_factor.CACHE_KEY, "not a factor")
    assert global_buffer_factor() == pytest.approx(4.0)
    assert cache.get(buffer_factor.CACHE_KEY)["value"] == pytest.approx(4.0)


# --- the hourly job ------------------------------------------------------------------------------


def test_the_job_refreshes_the_cached_factor_and_reports_it():
    index = index_holding(300, 100)
    global_buffer_factor()
    Index.objects.filter(pk=index.pk).update(used_storage_bytes=450)
    assert refresh_buffer_factor_task() == {
        "buffer_factor": pytest.approx(4.5),
        "reason": Reason.BUFFER_FACTOR_OBSERVED,
        "used_storage_bytes": 450,
        "repository_size": 100,
    }
    assert global_buffer_factor() == pytest.approx(4.5)


def test_the_job_reports_the_fallback_when_nothing_is_observed():
    result = refresh_buffer_factor_task()
    assert (result["buffer_factor"], result["reason"]) == (
        3.0,
        Reason.BUFFER_FACTOR_NO_OBSERVATIONS,
    )
    assert cache.get(buffer_factor.CACHE_KEY)["value"] == 3.0


def test_the_job_skips_and_leaves_the_cache_alone_while_its_lock_is_held():
    index = index_holding(300, 100)
    global_buffer_factor()
    Index.objects.filter(pk=index.pk).update(used_storage_bytes=450)
    with advisory_lock_held_elsewhere(LockKey.REFRESH_BUFFER_FACTOR):
        assert refresh_buffer_factor_task() == {"skipped": "lock_held"}
        assert cache.get(buffer_factor.CACHE_KEY)["value"] == pytest.approx(3.0)
    assert refresh_buffer_factor_task()["buffer_factor"] == pytest.approx(4.5)
