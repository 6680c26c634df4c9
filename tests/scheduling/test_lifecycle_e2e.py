"""The whole indexing lifecycle through the real API, Celery and database, with fake nodes.

Nothing is set by hand: fake nodes register by heartbeat against a live
server; the catalog and the enabled namespace come through the operator API;
the rollout and every scheduling job run as Celery tasks (eager, so their
events run right after the dispatching job commits) in a loop, as beat would
run them over hours, with the throttles bypassed. The fake nodes execute the
tasks they are handed and call back over HTTP.

1. Enable a namespace with projects, roll it out, index it: the namespace
   reaches a ready replica that ``search_targets`` serves.
2. Delete a project: its repository is orphaned, a delete task goes to its
   node, the node deletes it and the callback destroys the row.
3. Stop the node holding the namespace and move the clock past the lost-node
   threshold: the node is deleted with its indices and repositories, and the
   rollout re-plans the namespace on the other node, which indexes it.

The live server runs in another thread, so time moves with
the ``ZOEKT_CLOCK_OFFSET_SECONDS`` setting (read by ``zoekt.clock`` in every thread).
"""

from __future__ import annotations

import pytest
import requests
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from planner.tasks import rollout_task
from simulator.fakenode import MIB, FakeNode
from tests.scheduling.conftest import set_setting
from zoekt.models import EnabledNamespace, Index, Node, Project, Replica, Repository, Task
from zoekt.scheduling.service import TASKS
from zoekt.scheduling.tasks import run_scheduled_task

pytestmark = pytest.mark.django_db(transaction=True)

ROOT_ID = 7000
PROJECTS = 6
TWELVE_HOURS = 12 * 3600


@pytest.fixture
def operator(live_server):
    user = get_user_model().objects.create_user("operator", password="pw-12345678", is_staff=True)
    session = requests.Session()
    session.headers["Authorization"] = f"Token {Token.objects.create(user=user).key}"

    def call(method: str, path: str, **kwargs) -> requests.Response:
        return session.request(method, f"{live_server.url}{path}", timeout=30, **kwargs)

    yield call
    session.close()


@pytest.fixture
def nodes(make_fake_node):
    return [make_fake_node(name, concurrency=4) for name in ("zoekt-a", "zoekt-b")]


def catalog() -> dict:
    namespaces = [
        {
            "id": ROOT_ID,
            "name": "Lifecycle",
            "path": "lifecycle",
            "type": "Group",
            "parent_id": None,
            "visibility_level": 20,
            "archived": False,
        }
    ]
    projects, statistics = [], []
    for k in range(PROJECTS):
        namespace_id, project_id = ROOT_ID + 1 + k, ROOT_ID + 100 + k
        namespaces.append(
            {
                "id": namespace_id,
                "name": f"project {k}",
                "path": f"project-{k}",
                "type": "Project",
                "parent_id": ROOT_ID,
                "visibility_level": 20,
                "archived": False,
            }
        )
        projects.append(
            {
                "id": project_id,
                "name": f"project {k}",
                "path": f"project-{k}",
                "namespace_id": ROOT_ID,
                "project_namespace_id": namespace_id,
                "visibility_level": 20,
                "archived": False,
                "repository_storage": "default",
                "repository_access_level": 20,
                "forked_from_project_id": None,
            }
        )
        statistics.append({"project_id": project_id, "repository_size": MIB, "storage_size": MIB})
    return {"namespaces": namespaces, "projects": projects, "project_statistics": statistics}


def used_bytes_held(index: Index) -> int:
    return sum(Repository.objects.filter(zoekt_index=index).values_list("size_bytes", flat=True))


def tick(running: list[FakeNode]) -> None:
    """What beat and the nodes do in a while: rollout, every scheduled task, a pull per node."""
    rollout_task()
    for name in TASKS:
        run_scheduled_task(name, bypass_throttle=True)
    for node in running:
        result = node.step()
        assert result.heartbeat.status == 200, result.heartbeat.error


def run_until(condition, running: list[FakeNode], *, ticks: int = 15) -> int:
    for n in range(1, ticks + 1):
        tick(running)
        if condition():
            return n
    raise AssertionError(f"not reached after {ticks} ticks")


def test_a_namespace_is_indexed_served_pruned_and_re_planned_after_its_node_is_lost(
    operator, nodes, eager_celery, clock_offset
):
    set_setting(zoekt_indexing_enabled=True, zoekt_search_enabled=True)
    for node in nodes:
        assert node.step().heartbeat.reply["truncate"] is True
    assert Node.objects.count() == 2

    # --- 1. enable, roll out, index, serve --------------------------------------------------
    loaded = operator("POST", "/api/v1/catalog/bulk_upsert", json=catalog())
    assert loaded.status_code == 200, loaded.text
    enabled = operator("PUT", f"/api/v4/admin/zoekt/shards/0/indexed_namespaces/{ROOT_ID}")
    assert enabled.status_code == 200, enabled.text

    def search_targets() -> dict:
        reply = operator("GET", f"/api/v1/namespaces/{ROOT_ID}/search_targets")
        assert reply.status_code == 200, reply.text
        return reply.json()

    assert search_targets()["reason"] == "no_ready_replica"
    run_until(lambda: search_targets()["search_enabled"], nodes)

    replica = Replica.objects.get(namespace_id=ROOT_ID)
    assert replica.state == Replica.State.READY
    (index,) = Index.objects.filter(zoekt_replica=replica)
    assert index.state == Index.State.READY
    holder = next(n for n in nodes if Node.objects.get(uuid=n.uuid).id == index.zoekt_node_id)
    other = next(n for n in nodes if n is not holder)
    project_ids = sorted(Project.objects.values_list("id", flat=True))
    assert sorted(holder.repos) == project_ids
    assert other.repos == {}
    assert set(Repository.objects.values_list("state", flat=True)) == {Repository.State.READY}
    assert Repository.objects.filter(retries_left=Repository.DB_DEFAULT_RETRIES_LEFT).count() == 6
    served = search_targets()
    assert [t["node_id"] for t in served["targets"]] == [index.zoekt_node_id]
    assert served["targets"][0]["replica_id"] == replica.id
    # One pass after the last callback, the used bytes are the sum of the repositories' sizes.
    tick(nodes)
    index.refresh_from_db()
    assert index.used_storage_bytes == used_bytes_held(index) > 1024

    # --- 2. a deleted project's repository is deleted on its node -------------------------------
    gone = project_ids[0]
    Project.objects.filter(pk=gone).delete()  # the catalog's source of truth deleted it
    assert Repository.objects.get(project_identifier=gone).project_id is None

    run_until(
        lambda: not Repository.objects.filter(project_identifier=gone).exists(), nodes, ticks=5
    )
    assert gone not in holder.repos
    assert sorted(holder.repos) == project_ids[1:]
    delete = Task.objects.get(project_identifier=gone, task_type=Task.TaskType.DELETE_REPO)
    assert delete.state == Task.State.DONE
    # And one pass after the delete callback, without the deleted repository's size.
    held_before = index.used_storage_bytes
    tick(nodes)
    index.refresh_from_db()
    assert index.used_storage_bytes == used_bytes_held(index) < held_before
    assert search_targets()["search_enabled"] is True

    # --- 3. the holder is lost: its rows go and the namespace is re-planned ----------------------
    holder_id = index.zoekt_node_id
    clock_offset(TWELVE_HOURS + 60)
    # Only the other node keeps pulling; the holder has stopped.
    run_until(lambda: not Node.objects.filter(pk=holder_id).exists(), [other], ticks=2)
    assert not Index.objects.filter(zoekt_node_id=holder_id).exists()
    assert not Repository.objects.filter(zoekt_index_id=index.id).exists()

    run_until(lambda: search_targets()["search_enabled"], [other])

    assert not Replica.objects.filter(pk=replica.pk).exists()  # index-less: deleted by the rollout
    new_replica = Replica.objects.get(namespace_id=ROOT_ID)
    assert new_replica.state == Replica.State.READY
    other_id = Node.objects.get(uuid=other.uuid).id
    assert list(Index.objects.values_list("zoekt_node_id", "state")) == [
        (other_id, Index.State.READY)
    ]
    assert sorted(other.repos) == project_ids[1:]
    assert [t["node_id"] for t in search_targets()["targets"]] == [other_id]
    assert EnabledNamespace.objects.get(root_namespace_id=ROOT_ID).last_rollout_failed_at is None
