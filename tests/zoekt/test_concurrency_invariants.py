"""Two of every writer at once, with their advisory locks bypassed (the services called
directly, each in its own thread and connection), and heartbeats racing with them:
afterwards the fleet's invariants hold (``tests.invariants``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection

from eviction import actions as eviction
from eviction import moves
from planner.rollout import RolloutService
from tests.factories import GIB, EnabledNamespaceFactory, GroupFactory, NodeFactory, ProjectFactory
from tests.invariants import searchable_roots, violations
from zoekt import actions, app_settings, clock
from zoekt.models import Index, Move, Node, Replica, Repository

pytestmark = pytest.mark.django_db(transaction=True)
HOUR = 3600


def race(*jobs: Callable[[], object], rounds: int = 1) -> list[BaseException]:
    """Run the jobs at once (a barrier releases them together), ``rounds`` times each;
    returns the exceptions they raised (the caller asserts there are none)."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(jobs))

    def run(job):
        try:
            for _ in range(rounds):
                barrier.wait(30)
                job()
        except BaseException as error:  # surfaced to the test
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return errors


def heartbeat(node: Node, used: int) -> Callable[[], None]:
    def beat():
        actions.do_record_heartbeat(
            node.uuid,
            {
                "node.name": node.name,
                "node.url": node.index_base_url,
                "disk.all": node.total_bytes,
                "disk.used": used,
                "disk.indexed": used,
            },
        )

    return beat


def rollout() -> None:
    RolloutService().execute(dry_run=False)


def _fleet(namespaces: int = 24):
    app_settings.update(
        zoekt_indexing_enabled=True,
        zoekt_search_enabled=True,
        zoekt_node_level_eviction_enabled=True,
        zoekt_eviction_moves=True,
        zoekt_rollout_batch_size=namespaces,
    )
    nodes = [
        NodeFactory(total_bytes=100 * GIB, used_bytes=GIB, metadata={"name": f"zoekt-{i}"})
        for i in range(3)
    ]
    for node in nodes:
        heartbeat(node, GIB)()
    for k in range(namespaces):
        group = GroupFactory()
        EnabledNamespaceFactory(root_namespace=group)
        for _ in range(1 + k % 3):
            ProjectFactory(namespace=group, repository_size=(50 + 10 * k) * 1024**2)
    return nodes


def _index_everything() -> None:
    """What the nodes' callbacks and the scheduling jobs do once they indexed."""
    from zoekt.scheduling import handlers

    for index_id in Index.objects.filter(state=Index.State.PENDING).values_list("id", flat=True):
        handlers.initialize_index(index_id)
    Repository.objects.update(state=Repository.State.READY, size_bytes=100 * 1024**2)
    Index.objects.filter(state__in=(Index.State.PENDING, Index.State.INITIALIZING)).update(
        state=Index.State.READY, used_storage_bytes=GIB
    )
    actions.do_update_replica_states()


def test_two_rollouts_and_heartbeats_at_once_keep_every_invariant(now):
    nodes = _fleet()
    errors = race(rollout, rollout, *(heartbeat(n, GIB) for n in nodes), rounds=3)
    assert errors == []
    assert Replica.objects.exists()
    assert violations(reserved=True) == []
    # And again, with the replicas there: nothing more is created.
    before = Replica.objects.count()
    assert race(rollout, rollout) == []
    assert Replica.objects.count() == before
    assert violations(reserved=True) == []


def test_two_eviction_runs_and_two_move_runs_at_once_lose_no_namespace(now):
    nodes = _fleet()
    rollout()
    _index_everything()
    searchable = searchable_roots()
    assert searchable
    # The busiest node fills and stays over the high watermark past the sustain period.
    hot = max(nodes, key=lambda n: Index.objects.filter(zoekt_node=n).count())
    heartbeat(hot, 80 * GIB)()
    clock.advance(9 * HOUR)
    others = [n for n in nodes if n.id != hot.id]
    for node in nodes:
        heartbeat(node, 80 * GIB if node.id == hot.id else GIB)()

    errors = race(
        eviction.run_node_level,
        eviction.run_node_level,
        moves.advance_moves,
        moves.advance_moves,
        heartbeat(hot, 80 * GIB),
        *(heartbeat(n, GIB) for n in others),
        rounds=2,
    )
    assert errors == []
    assert Move.objects.exists()
    assert violations(searchable_before=searchable) == []

    # Round after round the replacements finish and two swap runs race with a rollout
    # (the throttles start two moves off the node at a time), until every move ended.
    for _ in range(30):
        if not Move.objects.live().exists():
            break
        _index_everything()
        clock.advance(60)
        for node in nodes:
            heartbeat(node, 80 * GIB if node.id == hot.id else GIB)()
        assert race(moves.advance_moves, moves.advance_moves, rollout) == []
        assert violations(searchable_before=searchable) == []
    assert not Move.objects.live().exists(), list(Move.objects.values("state", "reason"))
    assert Move.objects.filter(state=Move.State.DONE).count() >= 2
    assert violations(searchable_before=searchable) == []


def test_the_invariants_see_what_they_guard(now):
    """The checker is not vacuous: a surplus replica, a lost namespace and an over-reserved
    node are each reported."""
    _fleet(namespaces=2)
    rollout()
    _index_everything()
    searchable = searchable_roots()
    first, second = Replica.objects.order_by("id")[:2]
    enabled = first.zoekt_enabled_namespace
    Replica.objects.create(zoekt_enabled_namespace=enabled, namespace_id=enabled.root_namespace_id)
    full = first.indices.first().zoekt_node
    Index.objects.filter(zoekt_node=full).update(reserved_storage_bytes=10**15)
    Index.objects.filter(zoekt_replica=second).update(state=Index.State.PENDING)
    found = "\n".join(violations(reserved=True, searchable_before=searchable))
    assert f"namespace {enabled.id} has 2 replicas" in found
    assert f"node {full.id} reserves" in found
    assert f"namespace {second.namespace_id} lost its last ready copy" in found
