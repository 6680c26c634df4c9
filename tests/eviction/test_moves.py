"""Moves instead of deletes (``eviction.moves``), against the real database: the replacement
is built on another node while the old copy serves, the lease holds the reconcilers off, the
swap happens only on a confirmed ready copy, and delete-first only as a recorded fallback."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from eviction import actions as eviction
from eviction import moves
from eviction.models import EvictionDecision
from planner.rollout import RolloutService
from tests.eviction.conftest import beat, ready_namespace
from tests.factories import GIB, NodeFactory
from zoekt import actions, app_settings, capacity, clock
from zoekt.models import Index, Move, Node, Replica
from zoekt.reasons import Reason
from zoekt.scheduling import handlers
from zoekt.scheduling.service import SchedulingService
from zoekt.search_targets import search_targets

pytestmark = pytest.mark.django_db

HOUR = 3600


@pytest.fixture(autouse=True)
def _moves_on(_eviction_on):
    app_settings.update(zoekt_eviction_moves=True)


def _fleet(*, hot_used: int = 80, room: int = 100):
    """``hot`` over the high watermark for 9 h with one 10 GiB one-index namespace;
    ``roomy`` with ``room`` GiB of disk; the namespace's root id."""
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB, metadata={"name": "hot"})
    roomy = NodeFactory(total_bytes=room * GIB, used_bytes=GIB, metadata={"name": "roomy"})
    enabled = ready_namespace(hot, 10 * GIB)
    hot = beat(hot, hot_used * GIB)
    hot = beat(hot, hot_used * GIB, seconds=9 * HOUR)
    roomy = beat(roomy, GIB, seconds=0)
    return hot, roomy, enabled


def _keep_online(*nodes: Node) -> None:
    for node in nodes:
        node.refresh_from_db()
        beat(node, node.used_bytes, seconds=1)


def _finish_indexing(move: Move) -> None:
    """What the target's callbacks and the replica-state job do once it indexed."""
    Index.objects.filter(id=move.replacement_index_id).update(state=Index.State.READY)
    actions.do_update_replica_states()
    # Its build replica is whole now, but a partial copy in general: never searched.
    assert Replica.objects.get(pk=move.replacement_replica_id).state == Replica.State.READY


def _targets(enabled) -> list[int]:
    return [t.node_id for t in search_targets(enabled.root_namespace_id).targets]


def test_a_node_level_decision_builds_the_replacement_elsewhere_while_the_old_copy_serves(now):
    hot, roomy, enabled = _fleet()
    before = Node.objects.with_unclaimed_storage_bytes().get(pk=roomy.pk)

    result = eviction.run_node_level()

    assert result["decisions_applied"] == 1
    move = Move.objects.get()
    assert move.state == Move.State.BUILDING
    assert (move.source_node_id, move.target_node_id) == (hot.id, roomy.id)
    assert move.trigger == "node_level" and move.bytes == 10 * GIB
    decision = EvictionDecision.objects.get()
    assert move.decision_id == decision.id
    assert decision.details["moves_started"] == [move.id]
    assert decision.details["namespaces_left_without_ready_replica"] == 0
    # The old replica is untouched and still answers; the replacement is pending on roomy.
    source = Replica.objects.get(pk=move.source_replica_ref)
    assert source.state == Replica.State.READY
    assert Index.objects.get(pk=move.source_index_ref).state == Index.State.READY
    replacement = Index.objects.get(pk=move.replacement_index_id)
    assert (replacement.zoekt_node_id, replacement.state) == (roomy.id, Index.State.PENDING)
    assert _targets(enabled) == [hot.id]
    # Its reservation counts on the target at once.
    after = Node.objects.with_unclaimed_storage_bytes().get(pk=roomy.pk)
    claimed = before.unclaimed_storage_bytes - after.unclaimed_storage_bytes
    assert claimed == replacement.reserved_storage_bytes == int(10 * GIB / 0.60)
    # Once indexed to the same size it is healthy, not at its critical index watermark
    # (where the index-watermark trigger would move it on).
    assert capacity.index_watermark_level(10 * GIB, replacement.reserved_storage_bytes) == (
        capacity.IndexWatermark.HEALTHY
    )
    # The deadline grows with the bytes.
    assert move.deadline_at == clock.now() + timedelta(seconds=Move.deadline_seconds(10 * GIB))
    assert Move.deadline_seconds(100 * GIB) > Move.deadline_seconds(10 * GIB) > 3600


def test_the_swap_retires_only_the_source_once_the_replacement_is_ready(now):
    hot, roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()

    assert moves.advance_moves() == {"building": 1}  # not ready yet: nothing changes
    assert _targets(enabled) == [hot.id]
    _finish_indexing(move)
    _keep_online(hot, roomy)
    assert _targets(enabled) == [hot.id]  # ready, but searched only once swapped in

    assert moves.advance_moves() == {"done": 1}
    move.refresh_from_db()
    assert move.state == Move.State.DONE
    assert move.ready_to_swap_at and move.swapping_at and move.done_at
    # The serving replica stays; the replacement took the source's place in it.
    (replica,) = Replica.objects.filter(zoekt_enabled_namespace=enabled)
    assert replica.id == move.source_replica_ref
    assert list(Index.objects.filter(zoekt_replica=replica).values_list("id", flat=True)) == [
        move.replacement_index_id
    ]
    source = Index.objects.get(pk=move.source_index_ref)
    assert (source.state, source.zoekt_replica_id) == (Index.State.EVICTED, None)
    assert _targets(enabled) == [roomy.id]
    # Run again: idempotent.
    assert moves.advance_moves() == {}
    assert Replica.objects.filter(zoekt_enabled_namespace=enabled).count() == 1


def test_an_index_of_a_split_namespace_moves_and_the_replica_serves_throughout(now):
    hot, roomy, _ = _fleet()
    other = NodeFactory(total_bytes=100 * GIB, used_bytes=GIB, metadata={"name": "other"})
    beat(other, GIB, seconds=0)
    # Split over hot (lower range) and other (upper range); hot's part is the smaller.
    Index.objects.all().update(used_storage_bytes=40 * GIB)  # the one-index namespace
    enabled = ready_namespace(hot, 5 * GIB)
    replica = Replica.objects.get(zoekt_enabled_namespace=enabled)
    lower = Index.objects.get(zoekt_enabled_namespace=enabled)
    Index.objects.filter(pk=lower.pk).update(metadata={"project_namespace_id_to": 1000})
    upper = Index.objects.create(
        zoekt_enabled_namespace=enabled,
        zoekt_replica=replica,
        zoekt_node=other,
        namespace_id=enabled.root_namespace_id,
        state=Index.State.READY,
        used_storage_bytes=GIB,
        reserved_storage_bytes=2 * GIB,
        metadata={"project_namespace_id_from": 1001},
    )
    beat(hot, 80 * GIB, seconds=1)
    before = sorted(_targets(enabled))

    eviction.run_node_level()

    move = Move.objects.get(zoekt_enabled_namespace=enabled)
    assert move.target_node_id == roomy.id  # not other: it holds the upper range
    assert (move.project_namespace_id_from, move.project_namespace_id_to) == (None, 1000)
    assert Index.objects.get(pk=move.replacement_index_id).metadata == {
        "project_namespace_id_to": 1000
    }
    assert sorted(_targets(enabled)) == before == sorted([hot.id, other.id])
    _finish_indexing(move)
    _keep_online(hot, roomy, other)
    assert sorted(_targets(enabled)) == before
    moves.advance_move(move.id)
    move.refresh_from_db()
    assert move.state == Move.State.DONE
    served = sorted(Index.objects.filter(zoekt_replica=replica).values_list("id", flat=True))
    assert served == sorted([upper.id, move.replacement_index_id])
    assert Replica.objects.get(pk=replica.pk).state == Replica.State.READY
    assert sorted(_targets(enabled)) == sorted([roomy.id, other.id])


def test_the_swap_is_refused_when_the_replacement_is_not_on_a_searchable_node(now):
    hot, roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    _finish_indexing(move)
    _keep_online(hot)
    Node.objects.filter(pk=roomy.pk).update(last_seen_at=clock.now() - timedelta(hours=1))

    assert moves.advance_moves() == {"building": 1}
    move.refresh_from_db()
    assert move.reason == Reason.MOVE_NOT_COVERED
    assert Replica.objects.get(pk=move.source_replica_ref).state == Replica.State.READY
    assert _targets(enabled) == [hot.id]


def test_the_rollout_leaves_a_moving_namespace_alone(now):
    """Two replicas where one is wanted look like a surplus: the rollout would destroy
    the pending (the replacement) first. The lease keeps it."""
    _hot, _roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    assert Replica.objects.filter(zoekt_enabled_namespace=enabled).count() == 2

    RolloutService().execute(dry_run=False, batch_size=10)

    assert Replica.objects.filter(pk=move.replacement_replica_id).exists()
    assert Replica.objects.filter(pk=move.source_replica_ref).exists()
    # Once the move is over the namespace is the rollout's again.
    Move.objects.filter(pk=move.pk).update(state=Move.State.CANCELLED)
    RolloutService().execute(dry_run=False, batch_size=10)
    assert Replica.objects.filter(zoekt_enabled_namespace=enabled).count() == 1


def test_no_target_leaves_the_index_serving_unless_the_node_is_critical(now):
    hot, _roomy, enabled = _fleet(room=12)  # 12 GiB: too small for the reservation
    result = eviction.run_node_level()
    assert result["decisions_applied"] == 0
    decision = EvictionDecision.objects.get()
    assert decision.reason == Reason.EVICTION_NOTHING_ELIGIBLE
    assert decision.details["not_moved"][0]["reason"] == Reason.MOVE_NO_TARGET
    assert not Move.objects.exists()
    assert _targets(enabled) == [hot.id]


def test_at_critical_with_no_target_delete_first_is_a_recorded_fallback(now):
    _hot, _roomy, enabled = _fleet(hot_used=90, room=12)
    result = eviction.run_node_level()
    assert result["decisions_applied"] == 1
    (fallback,) = Move.objects.all()
    assert fallback.state == Move.State.FALLEN_BACK
    assert fallback.reason == Reason.MOVE_FALLBACK_CRITICAL_NO_TARGET
    assert fallback.details["why_not_moved"] == Reason.MOVE_NO_TARGET
    assert fallback.fallen_back_at == clock.now()
    assert not Replica.objects.filter(zoekt_enabled_namespace=enabled).exists()
    decision = EvictionDecision.objects.get()
    assert decision.details["namespaces_left_without_ready_replica"] == 1


def test_the_target_is_never_the_source_a_node_holding_the_namespace_or_a_cooling_node(now):
    _hot, roomy, enabled = _fleet()
    holder = NodeFactory(total_bytes=500 * GIB, used_bytes=GIB, metadata={"name": "holder"})
    cooling = NodeFactory(total_bytes=900 * GIB, used_bytes=GIB, metadata={"name": "cool"})
    beat(holder, GIB, seconds=0)
    beat(cooling, GIB, seconds=0)
    Node.objects.filter(pk=cooling.pk).update(
        eviction_cooldown_until=clock.now() + timedelta(hours=2)
    )
    # An evicted index of the namespace keeps its slot on ``holder`` (GitLab's unique key).
    Index.objects.create(
        zoekt_enabled_namespace=enabled,
        zoekt_node=holder,
        namespace_id=enabled.root_namespace_id,
        state=Index.State.EVICTED,
    )
    eviction.run_node_level()
    assert Move.objects.get().target_node_id == roomy.id


def test_a_move_past_its_deadline_retries_with_backoff_then_is_parked(now):
    hot, roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    replacements = [move.replacement_index_id]

    for attempt, wait in ((1, moves.RETRY_BACKOFF_SECONDS), (2, 2 * moves.RETRY_BACKOFF_SECONDS)):
        clock.advance(Move.deadline_seconds(move.bytes) + 1)
        _keep_online(hot, roomy)
        assert moves.advance_moves() == {"planned": 1}
        move.refresh_from_db()
        assert move.reason == Reason.MOVE_RETRYING and move.details["attempts"] == attempt + 1
        assert move.replacement_index_id is None and move.target_node_id is None
        # What was built is retired; the source still serves the whole time.
        assert Index.objects.get(pk=replacements[-1]).state == Index.State.EVICTED
        assert _targets(enabled) == [hot.id]
        # GitLab's deletion pipeline frees roomy's slot of the namespace.
        handlers.orphan_indices()
        handlers.delete_indices()
        assert not Index.objects.filter(pk=replacements[-1]).exists()
        # Not before the backoff has passed (it doubles), then built again: on roomy,
        # the one node there is, although the last attempt failed there.
        clock.advance(wait // 2)
        _keep_online(hot, roomy)
        assert moves.advance_moves() == {"planned": 1}
        clock.advance(wait // 2)
        _keep_online(hot, roomy)
        assert moves.advance_moves() == {"building": 1}
        move.refresh_from_db()
        assert move.target_node_id == roomy.id
        assert move.replacement_index_id not in replacements
        replacements.append(move.replacement_index_id)

    clock.advance(Move.deadline_seconds(move.bytes) + 1)
    _keep_online(hot, roomy)
    assert moves.advance_moves() == {"parked": 1}
    move.refresh_from_db()
    assert move.reason == Reason.MOVE_DEADLINE_PASSED and move.parked_at == clock.now()
    assert [f["reason"] for f in move.details["failures"]] == ["move_deadline_passed"] * 3
    assert not Replica.objects.filter(pk=move.replacement_replica_id).exists()
    assert Index.objects.get(pk=replacements[-1]).state == Index.State.EVICTED
    assert Replica.objects.get(pk=move.source_replica_ref).state == Replica.State.READY
    assert _targets(enabled) == [hot.id]


def test_a_retry_prefers_a_node_the_failed_attempt_did_not_use(now):
    hot, roomy, _enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    other = NodeFactory(total_bytes=100 * GIB, used_bytes=GIB, metadata={"name": "other"})
    other = beat(other, 2 * GIB, seconds=0)  # fuller than roomy: not the first choice
    clock.advance(Move.deadline_seconds(move.bytes) + 1)
    _keep_online(hot, roomy, other)
    moves.advance_moves()
    clock.advance(moves.RETRY_BACKOFF_SECONDS)
    _keep_online(hot, roomy, other)
    moves.advance_moves()
    move.refresh_from_db()
    assert move.details["failed_targets"] == [roomy.id]
    assert move.state == Move.State.BUILDING and move.target_node_id == other.id


def test_the_database_refuses_a_second_live_move_of_one_index(now):
    _hot, _roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        Move.objects.create(
            trigger="node_level",
            state=Move.State.PLANNED,
            zoekt_enabled_namespace=enabled,
            namespace_id=move.namespace_id,
            source_index_ref=move.source_index_ref,
        )
    # A finished one does not hold the slot.
    Move.objects.filter(pk=move.pk).update(state=Move.State.DONE)
    Move.objects.create(
        trigger="node_level",
        zoekt_enabled_namespace=enabled,
        namespace_id=move.namespace_id,
        source_index_ref=move.source_index_ref,
    )


def test_an_index_already_moving_is_not_chosen_again(now):
    hot, _roomy, _enabled = _fleet()
    eviction.run_node_level()
    Node.objects.filter(pk=hot.pk).update(eviction_cooldown_until=None)  # cooldown over
    eviction.run_node_level()
    assert Move.objects.count() == 1
    assert EvictionDecision.objects.filter(applied_at__isnull=False).count() == 1


@pytest.mark.parametrize("mode", ["gitlab", "admission"])
def test_the_replacement_is_indexed_ahead_of_the_pending_queue(now, mode):
    app_settings.update(zoekt_indexing_admission=mode)
    _hot, roomy, _enabled = _fleet()
    waiting = ready_namespace(roomy, GIB)  # an older index on roomy, never indexed
    Index.objects.filter(zoekt_enabled_namespace=waiting).update(state=Index.State.PENDING)
    eviction.run_node_level()
    move = Move.objects.get()
    dispatched = []
    SchedulingService(dispatch=lambda event, args: dispatched.append((event, args))).execute(
        "initial_indexing"
    )
    started = [args[0] for event, args in dispatched if event == "initialize_index"]
    older = Index.objects.get(zoekt_enabled_namespace=waiting).id
    # GitLab's rule starts one index a node a minute: the replacement's. Admission control
    # starts both while the node's queue is short, the replacement first.
    expected = [move.replacement_index_id] + ([older] if mode == "admission" else [])
    assert started == expected


@pytest.mark.django_db(transaction=True)
def test_two_workers_swapping_at_once_retire_the_source_once(now):
    hot, roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    _finish_indexing(move)
    _keep_online(hot, roomy)
    start = threading.Barrier(2)
    outcomes = []
    at = clock.now()  # the frozen clock is this thread's

    def worker():
        try:
            start.wait()
            outcomes.append(moves.advance_move(move.id, now=at))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # One swapped; the other found the row locked (or already done) and did nothing.
    assert sorted(outcomes) in (["done", "locked"], ["done", "done"])
    move.refresh_from_db()
    assert move.state == Move.State.DONE
    assert move.details["source_index_evicted"] == move.source_index_ref
    replicas = list(Replica.objects.filter(zoekt_enabled_namespace=enabled))
    assert [r.id for r in replicas] == [move.source_replica_ref]
    indices = list(Index.objects.filter(zoekt_replica=replicas[0]).values_list("id", flat=True))
    assert indices == [move.replacement_index_id]


def test_the_headroom_counts_moves_already_heading_to_the_target(now):
    """A target takes a replacement only while its disk, with every move already heading
    to it, stays under the high watermark less the hysteresis band (70 %)."""
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB, metadata={"name": "hot"})
    target = NodeFactory(total_bytes=100 * GIB, used_bytes=GIB, metadata={"name": "target"})
    first = ready_namespace(hot, 10 * GIB)
    second = ready_namespace(hot, 11 * GIB)
    hot = beat(hot, 80 * GIB)
    hot = beat(hot, 80 * GIB, seconds=9 * HOUR)
    beat(target, 50 * GIB, seconds=0)  # 50 % + 10 GiB = 60 %; + 11 GiB more = 71 %

    eviction.run_node_level()

    (move,) = Move.objects.all()
    assert move.zoekt_enabled_namespace_id == first.id
    decision = EvictionDecision.objects.get()
    assert decision.details["not_moved"] == [
        {
            "index_id": Index.objects.get(zoekt_enabled_namespace=second).id,
            "reason": Reason.MOVE_NO_TARGET,
        }
    ]
    assert _targets(second) == [hot.id]  # still serving where it is


def test_moves_beyond_the_per_source_throttle_wait_planned_and_start_as_slots_free(now):
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB, metadata={"name": "hot"})
    roomy = NodeFactory(total_bytes=1000 * GIB, used_bytes=GIB, metadata={"name": "roomy"})
    spare = NodeFactory(total_bytes=1000 * GIB, used_bytes=GIB, metadata={"name": "spare"})
    namespaces = [ready_namespace(hot, size * GIB) for size in (5, 6, 7)]
    hot = beat(hot, 80 * GIB)
    hot = beat(hot, 80 * GIB, seconds=9 * HOUR)
    beat(roomy, GIB, seconds=0)
    beat(spare, GIB, seconds=0)

    eviction.run_node_level()

    states = dict(Move.objects.values_list("zoekt_enabled_namespace_id", "state"))
    assert [states[n.id] for n in namespaces] == ["building", "building", "planned"]
    waiting = Move.objects.get(zoekt_enabled_namespace=namespaces[2])
    assert waiting.reason == Reason.MOVE_THROTTLED and waiting.replacement_index_id is None
    assert _targets(namespaces[2]) == [hot.id]  # it serves where it is meanwhile
    # A planned move holds the lease: the next decision does not choose its index again.
    Node.objects.filter(pk=hot.pk).update(eviction_cooldown_until=None)
    eviction.run_node_level()
    assert Move.objects.count() == 3
    # One finishes: the planned one starts on the next step.
    first = Move.objects.get(zoekt_enabled_namespace=namespaces[0])
    _finish_indexing(first)
    _keep_online(hot, roomy, spare)
    outcome = moves.advance_moves()
    assert outcome == {"done": 1, "building": 2}
    waiting.refresh_from_db()
    assert waiting.state == Move.State.BUILDING and waiting.replacement_index_id is not None
    assert waiting.reason == ""


def test_the_per_target_throttle_spreads_replacements(now):
    app_settings.update(zoekt_move_max_per_source=5, zoekt_move_max_per_target=1)
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB, metadata={"name": "hot"})
    targets = [
        NodeFactory(total_bytes=1000 * GIB, used_bytes=GIB, metadata={"name": f"t{i}"})
        for i in range(2)
    ]
    for size in (5, 6, 7):
        ready_namespace(hot, size * GIB)
    hot = beat(hot, 80 * GIB)
    hot = beat(hot, 80 * GIB, seconds=9 * HOUR)
    for target in targets:
        beat(target, GIB, seconds=0)

    eviction.run_node_level()

    building = Move.objects.filter(state=Move.State.BUILDING)
    assert sorted(building.values_list("target_node_id", flat=True)) == sorted(
        t.id for t in targets
    )
    assert Move.objects.filter(state=Move.State.PLANNED).count() == 1


def test_a_project_created_during_a_move_is_indexed_into_the_replacement_before_the_swap(now):
    from tests.factories import ProjectFactory
    from zoekt.models import Repository, Task
    from zoekt.scheduling.indexing import IndexingTaskService

    hot, roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    _finish_indexing(move)
    _keep_online(hot, roomy)
    # Created meanwhile: the router sends it to the serving replica (the source index),
    # never to the build replica, so nothing is indexed twice in the end.
    project = ProjectFactory(namespace_id=enabled.root_namespace_id, repository_size=GIB)
    IndexingTaskService(project.id).execute()
    assert Repository.objects.filter(project_identifier=project.id).count() == 1
    Repository.objects.filter(project_identifier=project.id).update(state=Repository.State.READY)

    assert moves.advance_moves() == {"building": 1}
    move.refresh_from_db()
    assert move.reason == Reason.MOVE_CATCHING_UP
    caught = Repository.objects.get(
        zoekt_index_id=move.replacement_index_id, project_identifier=project.id
    )
    assert Task.objects.filter(zoekt_repository_id=caught.id).count() == 1
    assert _targets(enabled) == [hot.id]  # the source still serves, with the new project
    # Indexed on the target: the swap goes through.
    Repository.objects.filter(pk=caught.pk).update(state=Repository.State.READY)
    assert moves.advance_moves() == {"done": 1}
    assert _targets(enabled) == [roomy.id]
    held = Repository.objects.filter(project_identifier=project.id).values_list(
        "zoekt_index_id", flat=True
    )
    assert move.replacement_index_id in set(held)


def test_a_project_deleted_during_a_move_is_deleted_from_both_copies(now):
    from tests.factories import ProjectFactory, RepositoryFactory
    from zoekt.models import Repository, Task
    from zoekt.scheduling.indexing import IndexingTaskService

    hot, roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    project = ProjectFactory(namespace_id=enabled.root_namespace_id, repository_size=GIB)
    for index_id in (move.source_index_ref, move.replacement_index_id):
        RepositoryFactory(
            zoekt_index_id=index_id,
            project=project,
            project_identifier=project.id,
            state=Repository.State.READY,
        )

    IndexingTaskService(
        project.id, task_type=Task.TaskType.DELETE_REPO, root_namespace_id=enabled.root_namespace_id
    ).execute()

    deletes = Task.objects.filter(
        task_type=Task.TaskType.DELETE_REPO, project_identifier=project.id
    )
    assert sorted(deletes.values_list("zoekt_node_id", flat=True)) == sorted([hot.id, roomy.id])


def test_the_index_watermark_trigger_moves_instead_of_deleting(now):
    hot, roomy, enabled = _fleet()
    Index.objects.filter(zoekt_node=hot).update(
        watermark_level=Index.WatermarkLevel.CRITICAL_WATERMARK_EXCEEDED
    )

    eviction.run_index_watermark()
    eviction.evict_indices()  # GitLab's tail: nothing is pending eviction to delete

    move = Move.objects.get()
    assert move.trigger == "index_watermark" and move.state == Move.State.BUILDING
    assert Index.objects.get(pk=move.source_index_ref).state == Index.State.READY
    assert _targets(enabled) == [hot.id]
    _finish_indexing(move)
    _keep_online(hot, roomy)
    assert moves.advance_moves() == {"done": 1}
    assert _targets(enabled) == [roomy.id]


def test_the_negative_unclaimed_trigger_moves_instead_of_deleting_after_the_sustain_period(now):
    hot, roomy, enabled = _fleet()
    # Reservations over the usable storage: the 10 GiB index reserves 200 GiB.
    Index.objects.filter(zoekt_node=hot).update(reserved_storage_bytes=200 * GIB)

    result = eviction.run_negative_unclaimed([hot.id])

    assert result["decisions_applied"] == 1, result
    move = Move.objects.get()
    assert move.trigger == "negative_unclaimed" and move.state == Move.State.BUILDING
    assert move.target_node_id == roomy.id
    assert Index.objects.get(pk=move.source_index_ref).state == Index.State.READY
    assert _targets(enabled) == [hot.id]


def test_a_source_lost_with_its_node_mid_move_leaves_the_replacement_in_its_place(now):
    _hot, roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    serving = move.source_replica_ref
    Index.objects.filter(pk=move.source_index_ref).delete()  # its node was lost
    _finish_indexing(move)
    _keep_online(roomy)
    assert moves.advance_moves() == {"done": 1}
    move.refresh_from_db()
    assert move.details["source_gone_before_swap"] is True
    (replica,) = Replica.objects.filter(zoekt_enabled_namespace=enabled)
    assert replica.id == serving
    assert list(Index.objects.filter(zoekt_replica=replica).values_list("id", flat=True)) == [
        move.replacement_index_id
    ]
    actions.do_update_replica_states()
    assert _targets(enabled) == [roomy.id]


def test_no_reconciler_touches_an_in_flight_move(now):
    """Every scheduled task of GitLab's scheduler (orphans, deletions, lost nodes,
    watermarks, the three eviction triggers, storage refresh, replica states), with
    their events run at once, and the rollout, for an hour of passes: the source keeps
    serving and the replacement stays, in its own build replica."""
    from celery import current_app

    from eviction.tasks import EVICTION_EVENTS
    from zoekt.scheduling import events
    from zoekt.scheduling.service import TASKS, SchedulingService

    hot, roomy, enabled = _fleet()
    # The source is at its critical index watermark (used = reserved): the index
    # watermark trigger would choose it, were it not moving.
    Index.objects.filter(zoekt_node=hot).update(
        watermark_level=Index.WatermarkLevel.CRITICAL_WATERMARK_EXCEEDED
    )
    eviction.run_node_level()
    move = Move.objects.get()

    def run_event(event: str, args: tuple) -> None:
        if event in events.EVENTS:
            events.EVENTS[event](*args)
        else:
            current_app.tasks[EVICTION_EVENTS[event]](*args)

    for _ in range(6):
        _keep_online(hot, roomy)
        service = SchedulingService(dispatch=run_event, bypass_throttle=True)
        for task in TASKS:
            service.execute(task)
        RolloutService().execute(dry_run=False, batch_size=10)
        clock.advance(600)

    move.refresh_from_db()
    assert move.state == Move.State.BUILDING
    source = Index.objects.get(pk=move.source_index_ref)
    assert (source.state, source.zoekt_replica_id) == (Index.State.READY, move.source_replica_ref)
    assert Replica.objects.get(pk=move.source_replica_ref).state == Replica.State.READY
    replacement = Index.objects.get(pk=move.replacement_index_id)
    assert replacement.zoekt_replica_id == move.replacement_replica_id
    assert replacement.state not in Index.SHOULD_BE_DELETED_STATES
    assert Replica.objects.filter(zoekt_enabled_namespace=enabled).count() == 2
    assert Move.objects.count() == 1
    _keep_online(hot, roomy)
    assert _targets(enabled) == [hot.id]


def test_with_memory_planning_on_a_target_without_the_memory_for_it_is_passed_over(now):
    from tests.factories import ProjectFactory

    hot, roomy, enabled = _fleet()
    # The moving namespace: 8 GiB of repositories, an 8 GiB estimate at ratio 1.
    ProjectFactory(namespace=enabled.root_namespace, repository_size=8 * GIB)
    # roomy, the emptiest disk, already holds 10 GiB of estimate: 18 of 24 GiB is 75 %.
    crowded = ready_namespace(roomy, GIB)
    ProjectFactory(namespace=crowded.root_namespace, repository_size=10 * GIB)
    spare = NodeFactory(total_bytes=100 * GIB, used_bytes=5 * GIB, metadata={"name": "spare"})
    beat(spare, 5 * GIB, seconds=0)
    app_settings.update(zoekt_node_memory_budget_bytes=24 * GIB, zoekt_memory_ratio=1)

    eviction.run_node_level()

    assert Move.objects.get().target_node_id == spare.id
    # With memory planning off the disk alone decides: roomy.
    Move.objects.all().delete()
    Replica.objects.filter(zoekt_enabled_namespace=enabled, state=Replica.State.PENDING).delete()
    Index.objects.filter(zoekt_enabled_namespace=enabled, zoekt_node=spare).delete()
    app_settings.update(zoekt_node_memory_budget_bytes=None)
    Node.objects.filter(pk=hot.pk).update(eviction_cooldown_until=None)
    eviction.run_node_level()
    assert Move.objects.get().target_node_id == roomy.id
