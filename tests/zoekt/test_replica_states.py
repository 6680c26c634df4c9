"""Replica states (reference 2.3), replica and enabled-namespace scopes (1.2, 1.3), and the job."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction

from tests.factories import (
    EnabledNamespaceFactory,
    IndexFactory,
    ReplicaFactory,
    ReplicalessIndexFactory,
)
from tests.locking import advisory_lock_held_elsewhere
from zoekt import app_settings
from zoekt.actions import do_update_replica_states
from zoekt.locks import LockKey
from zoekt.models import EnabledNamespace, Index, Replica
from zoekt.tasks import update_replica_states_task

pytestmark = pytest.mark.django_db

PENDING, READY = Replica.State.PENDING, Replica.State.READY
I = Index.State  # noqa: E741


def replica_with_indices(state: int, *index_states: int, **kwargs) -> Replica:
    replica = ReplicaFactory(state=state, **kwargs)
    for index_state in index_states:
        IndexFactory(zoekt_replica=replica, state=index_state)
    return replica


def state_of(replica: Replica) -> int:
    return Replica.objects.values_list("state", flat=True).get(pk=replica.pk)


def pks(queryset) -> set[int]:
    return set(queryset.values_list("pk", flat=True))


set_setting = app_settings.update


# --- do_update_replica_states --------------------------------------------------------------------

STATE_CASES = [
    pytest.param(PENDING, [I.READY], READY, id="pending-with-its-one-index-ready-becomes-ready"),
    pytest.param(
        PENDING, [I.READY, I.READY], READY, id="pending-with-all-indices-ready-becomes-ready"
    ),
    pytest.param(PENDING, [I.PENDING], PENDING, id="pending-with-a-pending-index-stays-pending"),
    pytest.param(
        PENDING, [I.INITIALIZING, I.PENDING], PENDING, id="pending-with-none-ready-stays-pending"
    ),
    pytest.param(
        PENDING, [I.READY, I.INITIALIZING], PENDING, id="pending-with-mixed-indices-stays-pending"
    ),
    pytest.param(PENDING, [], PENDING, id="pending-without-indices-stays-pending"),
    pytest.param(READY, [I.READY, I.READY], READY, id="ready-with-all-indices-ready-stays-ready"),
    pytest.param(READY, [I.READY, I.INITIALIZING], PENDING, id="ready-with-a-non-ready-index"),
    pytest.param(READY, [I.PENDING_EVICTION], PENDING, id="ready-with-an-index-being-evicted"),
    pytest.param(READY, [I.READY, I.ORPHANED], PENDING, id="ready-with-an-orphaned-index"),
    pytest.param(READY, [], READY, id="ready-without-indices-is-left-alone"),
]


@pytest.mark.parametrize(("before", "index_states", "after"), STATE_CASES)
def test_a_replica_is_ready_exactly_when_all_its_indices_are(before, index_states, after):
    replica = replica_with_indices(before, *index_states)
    do_update_replica_states()
    assert state_of(replica) == after


def test_the_update_reports_how_many_replicas_changed_and_a_second_run_changes_nothing():
    replicas = {
        "promoted": replica_with_indices(PENDING, I.READY, I.READY),
        "also promoted": replica_with_indices(PENDING, I.READY),
        "kept pending": replica_with_indices(PENDING, I.READY, I.INITIALIZING),
        "no indices": replica_with_indices(PENDING),
        "demoted": replica_with_indices(READY, I.READY, I.PENDING),
        "kept ready": replica_with_indices(READY, I.READY),
    }
    assert do_update_replica_states() == {"replicas_marked_ready": 2, "replicas_marked_pending": 1}
    after_first = {name: state_of(r) for name, r in replicas.items()}
    assert after_first == {
        "promoted": READY,
        "also promoted": READY,
        "kept pending": PENDING,
        "no indices": PENDING,
        "demoted": PENDING,
        "kept ready": READY,
    }
    assert do_update_replica_states() == {"replicas_marked_ready": 0, "replicas_marked_pending": 0}
    assert {name: state_of(r) for name, r in replicas.items()} == after_first


def test_a_replica_follows_its_indices_back_and_forth():
    replica = replica_with_indices(PENDING, I.READY)
    do_update_replica_states()
    assert state_of(replica) == READY
    Index.objects.filter(zoekt_replica=replica).update(state=I.INITIALIZING)
    do_update_replica_states()
    assert state_of(replica) == PENDING


def test_an_index_without_its_replica_does_not_hold_another_replica_back():
    replica = replica_with_indices(PENDING, I.READY)
    ReplicalessIndexFactory(
        state=I.EVICTED, zoekt_enabled_namespace=replica.zoekt_enabled_namespace
    )
    do_update_replica_states()
    assert state_of(replica) == READY


# --- the scheduled job and its advisory lock -----------------------------------------------------


def test_the_job_skips_while_another_connection_holds_its_lock_and_runs_once_it_is_free():
    replica = replica_with_indices(PENDING, I.READY)
    demoted = replica_with_indices(READY, I.PENDING)
    with advisory_lock_held_elsewhere(LockKey.UPDATE_REPLICA_STATES):
        assert update_replica_states_task() == {"skipped": "lock_held"}
        assert (state_of(replica), state_of(demoted)) == (PENDING, READY)
    assert update_replica_states_task() == {
        "replicas_marked_ready": 1,
        "replicas_marked_pending": 1,
    }
    assert (state_of(replica), state_of(demoted)) == (READY, PENDING)


def test_the_job_is_not_blocked_by_another_jobs_lock():
    replica = replica_with_indices(PENDING, I.READY)
    with advisory_lock_held_elsewhere(LockKey.REFRESH_BUFFER_FACTOR):
        assert update_replica_states_task()["replicas_marked_ready"] == 1
    assert state_of(replica) == READY


# --- replica scopes ------------------------------------------------------------------------------


@pytest.fixture
def replicas():
    return {
        "all ready": replica_with_indices(PENDING, I.READY, I.READY),
        "mixed": replica_with_indices(PENDING, I.READY, I.INITIALIZING),
        "none ready": replica_with_indices(READY, I.PENDING),
        "no indices": replica_with_indices(PENDING),
    }


def names(replicas: dict[str, Replica], queryset) -> set[str]:
    found = pks(queryset)
    return {name for name, replica in replicas.items() if replica.pk in found}


def test_with_all_ready_indices_needs_at_least_one_index_and_all_ready(replicas):
    assert names(replicas, Replica.objects.with_all_ready_indices()) == {"all ready"}


def test_with_non_ready_indices_needs_one_index_that_is_not_ready(replicas):
    assert names(replicas, Replica.objects.with_non_ready_indices()) == {"mixed", "none ready"}


def test_without_indices_finds_replicas_with_no_index_rows(replicas):
    assert names(replicas, Replica.objects.without_indices()) == {"no indices"}


def test_for_namespace_filters_on_the_root_namespace(replicas):
    namespace_id = replicas["mixed"].namespace_id
    assert names(replicas, Replica.objects.for_namespace(namespace_id)) == {"mixed"}


# --- enabled namespaces: missing indices and replica counts --------------------------------------


def test_with_missing_indices_finds_namespaces_without_any_index_row():
    bare = EnabledNamespaceFactory()
    with_replica_only = ReplicaFactory().zoekt_enabled_namespace
    indexed = IndexFactory().zoekt_enabled_namespace
    evicted_only = ReplicalessIndexFactory(state=I.EVICTED).zoekt_enabled_namespace
    found = pks(EnabledNamespace.objects.with_missing_indices())
    assert found == {bare.pk, with_replica_only.pk}
    assert indexed.pk not in found
    assert evicted_only.pk not in found


@pytest.mark.parametrize(
    ("override", "replica_states", "default", "mismatched"),
    [
        pytest.param(None, [PENDING], 1, False, id="default-1-with-one-replica-matches"),
        pytest.param(None, [], 1, True, id="default-1-with-no-replica-mismatches"),
        pytest.param(None, [READY, PENDING], 1, True, id="default-1-with-two-replicas-mismatches"),
        pytest.param(None, [READY, PENDING], 2, False, id="default-2-with-two-replicas-matches"),
        pytest.param(2, [READY, READY], 1, False, id="override-2-with-two-beats-default-1"),
        pytest.param(2, [READY], 1, True, id="override-2-with-one-mismatches-despite-default"),
        pytest.param(1, [PENDING], 3, False, id="override-1-with-one-beats-default-3"),
        pytest.param(3, [READY, PENDING, PENDING], 1, False, id="replicas-in-any-state-count"),
    ],
)
def test_with_mismatched_replicas_compares_the_count_with_the_override_else_the_default(
    override, replica_states, default, mismatched
):
    enabled = EnabledNamespaceFactory(number_of_replicas_override=override)
    for state in replica_states:
        ReplicaFactory(zoekt_enabled_namespace=enabled, state=state)
    found = pks(EnabledNamespace.objects.with_mismatched_replicas(default))
    assert (enabled.pk in found) is mismatched
    assert enabled.number_of_replicas(default) == (override or default)


def test_the_default_number_of_replicas_setting_is_one():
    assert app_settings.current().default_number_of_replicas == 1


def test_a_replica_override_must_be_positive():
    enabled = EnabledNamespaceFactory(number_of_replicas_override=2)
    with pytest.raises(IntegrityError), transaction.atomic():
        EnabledNamespace.objects.filter(pk=enabled.pk).update(number_of_replicas_override=0)
    enabled.refresh_from_db()
    assert enabled.number_of_replicas_override == 2


# --- enabled namespaces: rollout retry -----------------------------------------------------------


@pytest.fixture
def failures(now):
    """Enabled namespaces named by when their last rollout failed."""
    return {
        "never": EnabledNamespaceFactory(last_rollout_failed_at=None),
        "an hour ago": EnabledNamespaceFactory(last_rollout_failed_at=now - timedelta(hours=1)),
        "exactly a day ago": EnabledNamespaceFactory(
            last_rollout_failed_at=now - timedelta(days=1)
        ),
        "a day and a second ago": EnabledNamespaceFactory(
            last_rollout_failed_at=now - timedelta(days=1, seconds=1)
        ),
        "a week ago": EnabledNamespaceFactory(last_rollout_failed_at=now - timedelta(days=7)),
    }


def by_name(failures, queryset) -> set[str]:
    found = pks(queryset)
    return {name for name, enabled in failures.items() if enabled.pk in found}


def test_rollout_is_retried_once_the_default_one_day_interval_has_passed(failures):
    interval = app_settings.current().rollout_retry_interval_seconds
    assert interval == 86400
    allowed = by_name(failures, EnabledNamespace.objects.with_rollout_allowed(interval))
    blocked = by_name(failures, EnabledNamespace.objects.with_rollout_blocked(interval))
    assert allowed == {"never", "a day and a second ago", "a week ago"}
    assert blocked == {"an hour ago", "exactly a day ago"}


def test_a_shorter_retry_interval_allows_more_namespaces(failures):
    set_setting(zoekt_rollout_retry_interval="30m")
    interval = app_settings.current().rollout_retry_interval_seconds
    allowed = by_name(failures, EnabledNamespace.objects.with_rollout_allowed(interval))
    assert allowed == set(failures)
    assert by_name(failures, EnabledNamespace.objects.with_rollout_blocked(interval)) == set()


def test_a_retry_interval_of_0_never_retries_a_failed_namespace(failures):
    set_setting(zoekt_rollout_retry_interval="0")
    interval = app_settings.current().rollout_retry_interval_seconds
    assert interval is None
    allowed = by_name(failures, EnabledNamespace.objects.with_rollout_allowed(interval))
    blocked = by_name(failures, EnabledNamespace.objects.with_rollout_blocked(interval))
    assert allowed == {"never"}
    assert blocked == set(failures) - {"never"}


def test_blocked_is_applied_within_an_already_filtered_queryset(failures):
    interval = app_settings.current().rollout_retry_interval_seconds
    subset = EnabledNamespace.objects.filter(
        pk__in=[failures["never"].pk, failures["an hour ago"].pk]
    )
    assert by_name(failures, subset.with_rollout_blocked(interval)) == {"an hour ago"}


# --- enabled namespaces: last used storage bytes -------------------------------------------------


def test_last_used_storage_bytes_is_the_largest_replica_sum():
    enabled = EnabledNamespaceFactory(metadata={"rollout_required_storage_bytes": 5})
    first = ReplicaFactory(zoekt_enabled_namespace=enabled)
    second = ReplicaFactory(zoekt_enabled_namespace=enabled)
    IndexFactory(zoekt_replica=first, used_storage_bytes=100)
    IndexFactory(zoekt_replica=first, used_storage_bytes=200)
    IndexFactory(zoekt_replica=second, used_storage_bytes=250)
    ReplicalessIndexFactory(zoekt_enabled_namespace=enabled, used_storage_bytes=10_000)
    IndexFactory(used_storage_bytes=50_000)  # another namespace
    assert enabled.update_last_used_storage_bytes() == 300
    enabled.refresh_from_db()
    assert enabled.metadata == {"rollout_required_storage_bytes": 5, "last_used_storage_bytes": 300}


def test_last_used_storage_bytes_is_0_without_replicas_when_none_was_recorded():
    enabled = EnabledNamespaceFactory(metadata={})
    assert enabled.update_last_used_storage_bytes() == 0
    enabled.refresh_from_db()
    assert enabled.metadata == {"last_used_storage_bytes": 0}


def test_an_evicted_namespace_keeps_its_recorded_last_used_storage_bytes():
    # Its indices left their replica: a repeated eviction run must not write 0 over
    # what was recorded while it still had them (docs/eviction.md).
    enabled = EnabledNamespaceFactory(metadata={"last_used_storage_bytes": 999})
    assert enabled.update_last_used_storage_bytes() == 999
    enabled.refresh_from_db()
    assert enabled.metadata == {"last_used_storage_bytes": 999}
