"""Two runs of the same job at once never duplicate tasks or rows.

Each case starts the same job in two threads (two database connections),
released together by a barrier, against committed rows; then it checks the
rows the job writes have no duplicates and say what one run would have made.
Events run in the thread that dispatched them (Celery eager mode), so nothing
reaches a broker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count

from config.celery import app as celery_app
from eviction import tasks as eviction_tasks
from tests.factories import GIB, IndexFactory, NodeFactory, ReplicaFactory
from tests.scheduling import builders
from tests.scheduling.conftest import set_setting
from zoekt import clock
from zoekt.models import EnabledNamespace, Index, Node, Replica, Repository, Task
from zoekt.scheduling import events, tasks

pytestmark = pytest.mark.django_db(transaction=True)

R = Repository.State
I = Index.State  # noqa: E741


@pytest.fixture(autouse=True)
def eager(monkeypatch):
    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)


def twice_at_once(job: Callable[[], object]) -> list:
    barrier = threading.Barrier(2)
    results: list = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=30)
            results.append(job())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(results) == 2
    return results


def no_duplicate_tasks() -> None:
    dupes = (
        Task.objects.filter(state=Task.State.PENDING)
        .values("zoekt_repository_id", "task_type")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert list(dupes) == []


def test_two_repo_to_index_runs_make_one_task_per_repository():
    set_setting(zoekt_indexing_enabled=True)
    index = builders.group_with_index(state=I.INITIALIZING)
    builders.repositories(index, 1_200)

    twice_at_once(lambda: tasks.run_scheduled_task("repo_to_index_check"))
    twice_at_once(events.index_repos_task)

    no_duplicate_tasks()
    assert Task.objects.count() <= 1_200
    # Whatever is left is picked up by the next tick: run it until done.
    while Repository.objects.filter(state=R.PENDING).exists():
        events.index_repos_task()
    assert Task.objects.count() == 1_200
    no_duplicate_tasks()


def test_two_initial_indexing_runs_of_one_index_make_one_row_per_project():
    index = builders.group_with_index()
    builders.projects(index.zoekt_enabled_namespace.root_namespace, 1_500)

    results = twice_at_once(lambda: events.initialize_index_task(index.id))

    assert Repository.objects.count() == 1_500
    assert sorted(r.get("repositories_created", 0) for r in results) in ([0, 1_500], [1_500, 0])
    assert Index.objects.get(pk=index.pk).state == I.INITIALIZING


def test_two_reindex_runs_of_one_node_make_one_task_per_repository():
    node = NodeFactory(schema_version=2)
    index = builders.group_with_index(node, state=I.READY)
    builders.repositories(index, 300, state=R.READY, schema_version=1)

    twice_at_once(lambda: events.reindex_repos_task(node.id))

    assert Task.objects.count() == 300
    no_duplicate_tasks()


def test_two_repo_to_delete_runs_make_one_delete_task_per_repository():
    index = builders.group_with_index(state=I.ORPHANED)
    builders.repositories(index, 700, state=R.PENDING_DELETION)

    twice_at_once(events.delete_repos_task)
    while Repository.objects.filter(state=R.PENDING_DELETION).exists():
        events.delete_repos_task()

    assert Task.objects.filter(task_type=Task.TaskType.DELETE_REPO).count() == 700
    no_duplicate_tasks()


def test_two_auto_index_runs_enable_each_namespace_once():
    set_setting(zoekt_indexing_enabled=True, zoekt_auto_index_root_namespace=True)
    builders.roots(1_500)

    twice_at_once(lambda: tasks.run_scheduled_task("auto_index_self_managed"))

    assert EnabledNamespace.objects.count() == 1_500


def test_two_lost_node_runs_delete_the_node_once():
    now = clock.now()
    node = NodeFactory(last_seen_at=now - timedelta(hours=13))
    index = builders.group_with_index(node)
    builders.repositories(index, 50)

    results = twice_at_once(lambda: events.delete_lost_node_task(node.id))

    assert not Node.objects.filter(pk=node.pk).exists()
    assert Repository.objects.count() == 0
    assert sorted(bool(r.get("node_deleted")) for r in results) == [False, True]


def test_two_eviction_runs_evict_each_replica_once():
    replica = ReplicaFactory()
    IndexFactory(zoekt_replica=replica, state=I.PENDING_EVICTION)
    IndexFactory(zoekt_replica=replica, state=I.READY)

    results = twice_at_once(eviction_tasks.evict_indices_task)

    assert sum(r.get("replicas_deleted", 0) for r in results) == 1
    assert Index.objects.filter(state=I.EVICTED).count() == 2


def test_two_storage_refreshes_claim_each_byte_once():
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=10 * GIB)  # 90 GiB usable
    built = builders.indices(20, node, state=I.INITIALIZING, reserved_storage_bytes=GIB)
    for index in built:
        builders.repositories(index, 1, size_bytes=3 * GIB)  # each wants 5 GiB

    twice_at_once(events.update_index_used_storage_bytes_task)

    reserved = sum(Index.objects.values_list("reserved_storage_bytes", flat=True))
    assert reserved <= 90 * GIB
    unclaimed = Node.objects.with_unclaimed_storage_bytes().get(pk=node.pk)
    assert unclaimed.annotated_unclaimed_storage_bytes >= 0


def test_two_replica_state_runs_agree():
    set_setting(zoekt_indexing_enabled=True)
    replica = ReplicaFactory()
    IndexFactory(zoekt_replica=replica, state=I.READY)

    results = twice_at_once(lambda: tasks.run_scheduled_task("update_replica_states"))

    assert Replica.objects.get(pk=replica.pk).state == Replica.State.READY
    assert sum(r.get("replicas_marked_ready", 0) for r in results) == 1
