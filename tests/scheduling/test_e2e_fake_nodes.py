"""Fake nodes against the real node endpoints, served by a live server.

The fake nodes speak HTTP only (``simulator.fakenode``); the test creates the
fleet's rows with the factories and tasks with ``create_bulk_tasks``, then
lets the nodes heartbeat, execute and call back. Repository and task states
must end as GitLab's would (reference 3, 7).

The live server runs in another thread of this process, so a frozen
``zoekt.clock`` (thread-local) would not reach it. Time is moved with
``ZOEKT_CLOCK_OFFSET_SECONDS`` instead, which both threads read.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from simulator.fakenode import GIB, FakeNode, default_index_size
from tests.factories import (
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    ProjectFactory,
    ReplicaFactory,
    RepositoryFactory,
)
from zoekt import app_settings, clock
from zoekt.models import Node, Project, Repository, Task
from zoekt.scheduling.task_creation import create_bulk_tasks

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024**2
LIVE = (Task.State.PENDING, Task.State.PROCESSING)


@pytest.fixture
def make_node(make_fake_node):
    def make(name: str, **overrides) -> FakeNode:
        return make_fake_node(name, **{"concurrency": 2, "task_delay": (0.0, 0.02), **overrides})

    return make


def drive(nodes: list[FakeNode], *, rounds: int = 20) -> list:
    """Step every node until no task is pending or processing; returns all callbacks."""
    callbacks = []
    for _ in range(rounds):
        for node in nodes:
            result = node.step()
            assert result.heartbeat.status == 200, result.heartbeat.error
            callbacks.extend(result.callbacks)
        if not Task.objects.filter(state__in=LIVE).exists():
            return callbacks
    raise AssertionError(f"tasks still live after {rounds} rounds")


def namespace_on(nodes: list[Node], projects_per_node: int, *, first_size: int = MIB):
    """An enabled namespace with one replica and one index per node, each holding projects."""
    root = GroupFactory()
    enabled = EnabledNamespaceFactory(root_namespace=root)
    replica = ReplicaFactory(zoekt_enabled_namespace=enabled)
    layout: dict[int, list[Project]] = {}
    for node in nodes:
        index = IndexFactory(zoekt_replica=replica, zoekt_node=node)
        layout[node.id] = []
        for _ in range(projects_per_node):
            project = ProjectFactory(namespace=root, repository_size=first_size)
            RepositoryFactory(zoekt_index=index, project=project)
            layout[node.id].append(project)
    return layout


def test_two_fake_nodes_register_index_and_delete_as_gitlab_would(make_node, clock_offset):
    a = make_node("zoekt-a")
    b = make_node("zoekt-b")

    # Registration: the first heartbeat creates the row and asks the node to truncate.
    first_a, first_b = a.step(), b.step()
    assert first_a.heartbeat.reply["truncate"] is True
    assert first_b.heartbeat.reply["truncate"] is True
    assert Node.objects.count() == 2
    node_a = Node.objects.get(uuid=a.uuid)
    node_b = Node.objects.get(uuid=b.uuid)
    assert first_a.heartbeat.reply["id"] == node_a.id
    assert node_a.index_base_url == "http://zoekt-a:6065"
    assert node_a.search_base_url == "http://zoekt-a:6070"
    assert node_a.total_bytes == 100 * GIB
    assert node_a.schema_version == 2531
    assert node_a.metadata["name"] == "zoekt-a"
    assert node_a.metadata["version"] == "v1.16.2"
    assert node_a.metadata["concurrency"] == 2
    assert node_a.metadata["process_health"]["webserver"]["shards_loaded"] == 0
    assert node_a.metadata["process_health"]["indexer"]["restarts_15m"] == 0
    # The webserver block stamps the column, not the metadata; both 1.16 nodes are searchable.
    assert node_a.webserver_last_seen_at == node_a.last_seen_at
    assert "webserver_last_seen_at" not in node_a.metadata
    assert set(Node.objects.searchable().values_list("id", flat=True)) == {node_a.id, node_b.id}
    assert a.step().heartbeat.reply["truncate"] is False

    # Initial indexing of a namespace split over both nodes.
    layout = namespace_on([node_a, node_b], projects_per_node=3)
    assert create_bulk_tasks(Repository.objects.all()) == 6
    assert set(Repository.objects.values_list("state", flat=True)) == {
        Repository.State.INITIALIZING
    }
    callbacks = drive([a, b])

    assert len(callbacks) == 6
    assert {c.status for c in callbacks} == {202}
    assert set(Task.objects.values_list("state", flat=True)) == {Task.State.DONE}
    for repo in Repository.objects.all():
        assert repo.state == Repository.State.READY
        assert repo.size_bytes == default_index_size(repo.project_identifier)
        assert repo.index_file_count == 1
        assert repo.retries_left == Repository.DB_DEFAULT_RETRIES_LEFT
        assert repo.schema_version == 2531
        assert repo.indexed_at is not None
    assert set(a.repos) == {p.id for p in layout[node_a.id]}
    assert set(b.repos) == {p.id for p in layout[node_b.id]}

    # Past the 5 s save debounce, the heartbeat records what the node now holds.
    clock_offset(10)
    a.step()
    node_a.refresh_from_db()
    held = sum(default_index_size(p.id) for p in layout[node_a.id])
    assert node_a.indexed_bytes == held
    assert node_a.used_bytes == 10 * GIB + held
    assert node_a.usable_storage_bytes == 100 * GIB - 10 * GIB
    assert node_a.metadata["process_health"]["webserver"]["shards_loaded"] == 3
    assert node_a.metadata["task_count"] == 0
    assert node_a.webserver_last_seen_at == node_a.last_seen_at

    # Orphaned repositories are deleted: the delete callbacks destroy their rows.
    orphans = [layout[node_a.id][0].id, layout[node_b.id][0].id]
    Project.objects.filter(id__in=orphans).delete()
    orphaned = Repository.objects.filter(project__isnull=True)
    assert sorted(orphaned.values_list("project_identifier", flat=True)) == sorted(orphans)
    assert create_bulk_tasks(orphaned, task_type=Task.TaskType.DELETE_REPO) == 2
    callbacks = drive([a, b])

    assert [c.body["name"] for c in callbacks] == ["delete", "delete"]
    assert not Repository.objects.filter(project_identifier__in=orphans).exists()
    assert Repository.objects.count() == 4
    assert set(Repository.objects.values_list("state", flat=True)) == {Repository.State.READY}
    assert Task.objects.count() == 8
    assert set(Task.objects.values_list("state", flat=True)) == {Task.State.DONE}
    assert orphans[0] not in a.repos
    assert orphans[1] not in b.repos
    assert len(a.repos) == len(b.repos) == 2


def test_a_node_that_always_fails_exhausts_the_task_and_spends_one_repository_retry(
    make_node, clock_offset, eager_celery
):
    node = make_node("zoekt-f", success_rate=0.0)
    node.step()
    row = Node.objects.get(uuid=node.uuid)
    layout = namespace_on([row], projects_per_node=1)
    project = layout[row.id][0]
    assert create_bulk_tasks(Repository.objects.all()) == 1
    task = Task.objects.get()
    repo = Repository.objects.get()
    assert repo.retries_left == Repository.MODEL_DEFAULT_RETRIES_LEFT

    # First failure: the task is rescheduled 5 to 7.5 minutes out, still processing.
    first = node.step()
    assert [(c.success, c.status) for c in first.callbacks] == [(False, 202)]
    task.refresh_from_db()
    assert task.state == Task.State.PROCESSING
    assert task.retries_left == 2
    delay = task.perform_at - clock.now()
    assert timedelta(minutes=4, seconds=50) < delay <= timedelta(minutes=7.5)

    # Until then the server does not offer it again.
    idle = node.step()
    assert idle.heartbeat.reply["tasks"] == []
    assert idle.callbacks == []

    # Past perform_at it is offered again and the node runs it again (a retry, not a repeat).
    clock_offset(8 * 60)
    second = node.step()
    assert [job.task_id for job in second.heartbeat.accepted] == [task.id]
    assert [c.success for c in second.callbacks] == [False]
    task.refresh_from_db()
    assert task.retries_left == 1
    assert task.state == Task.State.PROCESSING
    assert task.perform_at - clock.now() > timedelta(minutes=9, seconds=50)

    # The third failure is final; the failed-task handler spends one repository retry.
    clock_offset(8 * 60 + 16 * 60)
    third = node.step()
    assert [c.success for c in third.callbacks] == [False]
    task.refresh_from_db()
    assert task.state == Task.State.FAILED
    assert task.retries_left == 0
    repo.refresh_from_db()
    assert repo.retries_left == Repository.MODEL_DEFAULT_RETRIES_LEFT - 1
    assert repo.state == Repository.State.PENDING
    assert repo.project_id == project.id
    assert node.repos == {}

    # A failed task is not offered again.
    clock_offset(2 * 3600)
    assert node.step().heartbeat.reply["tasks"] == []


def test_stop_indexing_on_a_full_disk_lets_deletes_through(make_node, clock_offset):
    node = make_node("zoekt-full", disk_total_bytes=10 * GIB, disk_base_used_bytes=GIB)
    node.step()
    row = Node.objects.get(uuid=node.uuid)
    keep, drop = namespace_on([row], projects_per_node=2)[row.id]
    create_bulk_tasks(Repository.objects.all())
    drive([node])
    assert set(node.repos) == {keep.id, drop.id}

    # 90 % used is past the critical watermark: only delete tasks are handed out.
    node.extra_used_bytes = 8 * GIB
    Project.objects.filter(id=drop.id).delete()
    orphaned = Repository.objects.filter(project__isnull=True)
    assert create_bulk_tasks(orphaned, Task.TaskType.DELETE_REPO) == 1
    assert create_bulk_tasks(Repository.objects.filter(project_id=keep.id)) == 1
    full = node.step()
    assert full.heartbeat.reply["stop_indexing"] is True
    assert node.stop_indexing is True
    assert [c.body["name"] for c in full.callbacks] == ["delete"]
    assert not Repository.objects.filter(project_identifier=drop.id).exists()
    waiting = Task.objects.filter(task_type=Task.TaskType.INDEX_REPO, state=Task.State.PENDING)
    assert waiting.count() == 1
    assert set(node.repos) == {keep.id}

    # Space freed: indexing resumes.
    node.extra_used_bytes = 0
    resumed = node.step()
    assert resumed.heartbeat.reply["stop_indexing"] is False
    assert [c.body["name"] for c in resumed.callbacks] == ["index"]
    assert not Task.objects.filter(state__in=LIVE).exists()


def test_indexing_paused_stops_indexing_and_hands_out_nothing(make_node):
    node = make_node("zoekt-p")
    node.step()
    row = Node.objects.get(uuid=node.uuid)
    namespace_on([row], projects_per_node=1)
    create_bulk_tasks(Repository.objects.all())
    setting = app_settings.load_row()
    setting.zoekt_indexing_paused = True
    setting.save()
    paused = node.step()
    assert paused.heartbeat.reply["stop_indexing"] is True
    assert paused.heartbeat.reply["tasks"] == []
    assert Task.objects.get().state == Task.State.PENDING

    setting.zoekt_indexing_paused = False
    setting.save()
    drive([node])
    assert Repository.objects.get().state == Repository.State.READY


def test_fake_nodes_in_their_own_threads_index_everything(make_node):
    nodes = [make_node(f"zoekt-t{i}", task_delay=(0.0, 0.05)) for i in range(2)]
    for node in nodes:
        node.step()
    rows = list(Node.objects.filter(uuid__in=[n.uuid for n in nodes]))
    namespace_on(rows, projects_per_node=4)
    assert create_bulk_tasks(Repository.objects.all()) == 8

    for node in nodes:
        node.start()
    deadline = time.monotonic() + 30
    while Task.objects.filter(state__in=LIVE).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    for node in nodes:
        node.stop()

    assert set(Task.objects.values_list("state", flat=True)) == {Task.State.DONE}
    assert set(Repository.objects.values_list("state", flat=True)) == {Repository.State.READY}
    assert sum(len(node.repos) for node in nodes) == 8
