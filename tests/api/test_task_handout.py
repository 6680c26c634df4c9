"""Handing tasks to a node on its heartbeat, and their wire shape (reference 7.2, 3.4).

A node receives at most ``concurrency_limit`` of its due tasks, oldest
``perform_at`` first, at most one per project; index tasks whose repository
lost its project are orphaned and those whose repository is no longer
indexable are skipped. At the critical disk watermark only delete tasks go
out. Sent tasks become ``processing`` and are sent again until a callback.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.api.helpers import (
    GIB,
    heartbeat_body,
    make_index_task,
    make_repository,
    make_task,
    set_app_setting,
)
from tests.factories import GroupFactory, IndexFactory, NodeFactory, ProjectFactory
from zoekt import clock
from zoekt.models import ForkNetworkMember, ProjectFeature, Repository, Task

pytestmark = pytest.mark.django_db


def hand_out(node_api, node, extra: dict | None = None) -> list[dict]:
    response = node_api.heartbeat(node.uuid, heartbeat_body(extra))
    assert response.status_code == 200, response.content
    return response.json()["tasks"]


def task_ids(tasks: list[dict]) -> list[int]:
    return [task["payload"]["Callback"]["payload"]["task_id"] for task in tasks]


def state_of(task: Task) -> int:
    task.refresh_from_db()
    return task.state


# --- which tasks, how many, in which order ---------------------------------------------------


def test_no_more_tasks_than_the_concurrency_limit_are_handed_out(node_api, node, index):
    tasks = [make_index_task(index) for _ in range(6)]

    sent = hand_out(node_api, node)

    assert task_ids(sent) == [t.id for t in tasks[:4]]
    assert [state_of(t) for t in tasks] == [Task.State.PROCESSING] * 4 + [Task.State.PENDING] * 2


def test_tasks_are_handed_out_oldest_perform_at_first_then_by_id(node_api, node, index, now):
    # GitLab's hand-out; admission control serves a namespace's tasks in the order they
    # were queued (tests/api/test_admission.py).
    set_app_setting(zoekt_indexing_admission="gitlab")
    later = make_index_task(index, perform_at=now - timedelta(seconds=10))
    oldest_first = make_index_task(index, perform_at=now - timedelta(seconds=20))
    oldest_second = make_index_task(index, perform_at=now - timedelta(seconds=20))
    latest = make_index_task(index, perform_at=now)

    sent = hand_out(node_api, node)

    assert task_ids(sent) == [oldest_first.id, oldest_second.id, later.id, latest.id]


def test_a_task_scheduled_for_later_is_not_handed_out_until_due(node_api, node, index, now):
    task = make_index_task(index, perform_at=now + timedelta(minutes=5))

    assert hand_out(node_api, node) == []
    assert state_of(task) == Task.State.PENDING

    clock.advance(300)
    assert task_ids(hand_out(node_api, node)) == [task.id]


def test_a_processing_task_is_sent_again_on_the_next_heartbeat(node_api, node, index):
    task = make_index_task(index)

    first = hand_out(node_api, node)
    second = hand_out(node_api, node)

    assert task_ids(first) == task_ids(second) == [task.id]
    assert second == first
    assert state_of(task) == Task.State.PROCESSING


def test_only_one_task_per_project_is_handed_out_at_a_time(node_api, node, index):
    repository = make_repository(index)
    index_task = make_task(repository)
    force_task = make_task(repository, task_type=Task.TaskType.FORCE_INDEX_REPO)
    other = make_index_task(index)

    sent = hand_out(node_api, node)

    assert task_ids(sent) == [index_task.id, other.id]
    assert state_of(force_task) == Task.State.PENDING


def test_an_index_task_whose_project_is_gone_is_orphaned(node_api, node, index):
    task = make_index_task(index)
    Repository.objects.filter(id=task.zoekt_repository_id).update(project=None)

    assert hand_out(node_api, node) == []
    assert state_of(task) == Task.State.ORPHANED


@pytest.mark.parametrize(
    "repository_state",
    [
        Repository.State.ORPHANED,
        Repository.State.PENDING_DELETION,
        Repository.State.DELETED,
        Repository.State.FAILED,
    ],
    ids=lambda state: Repository.State(state).label,
)
def test_an_index_task_whose_repository_is_not_indexable_is_skipped(
    node_api, node, index, repository_state
):
    task = make_index_task(index)
    Repository.objects.filter(id=task.zoekt_repository_id).update(
        state=repository_state, retries_left=1
    )

    assert hand_out(node_api, node) == []
    assert state_of(task) == Task.State.SKIPPED


def test_orphaned_and_skipped_tasks_do_not_count_against_the_limit(node_api, node, index):
    orphaned = make_index_task(index)
    Repository.objects.filter(id=orphaned.zoekt_repository_id).update(project=None)
    skipped = make_index_task(index)
    Repository.objects.filter(id=skipped.zoekt_repository_id).update(
        state=Repository.State.FAILED, retries_left=1
    )
    valid = [make_index_task(index) for _ in range(4)]

    assert task_ids(hand_out(node_api, node)) == [t.id for t in valid]


def test_a_delete_task_is_handed_out_even_when_the_project_is_gone(node_api, node, index):
    task = make_index_task(index, task_type=Task.TaskType.DELETE_REPO)
    Repository.objects.filter(id=task.zoekt_repository_id).update(
        project=None, state=Repository.State.DELETED
    )

    assert task_ids(hand_out(node_api, node)) == [task.id]
    assert state_of(task) == Task.State.PROCESSING


def test_finished_tasks_and_tasks_of_other_nodes_are_not_handed_out(node_api, node, index):
    for state in (Task.State.DONE, Task.State.SKIPPED, Task.State.ORPHANED):
        make_index_task(index, state=state)
    make_index_task(index, state=Task.State.FAILED, retries_left=0)
    make_index_task(IndexFactory(zoekt_node=NodeFactory()))

    assert hand_out(node_api, node) == []


def test_at_the_critical_watermark_only_delete_tasks_are_handed_out(node_api, node, index):
    index_task = make_index_task(index)
    delete_task = make_index_task(index, task_type=Task.TaskType.DELETE_REPO)

    response = node_api.heartbeat(
        node.uuid, heartbeat_body({"disk.all": 100 * GIB, "disk.used": 85 * GIB})
    )

    assert response.json()["stop_indexing"] is True
    assert task_ids(response.json()["tasks"]) == [delete_task.id]
    assert state_of(index_task) == Task.State.PENDING


def test_the_queries_of_a_heartbeat_do_not_grow_with_the_tasks_handed_out(node_api, node, index):
    def queries_to_hand_out(count: int) -> int:
        Task.objects.all().delete()
        for _ in range(count):
            make_index_task(index)
        make_index_task(index, task_type=Task.TaskType.DELETE_REPO)
        with CaptureQueriesContext(connection) as queries:
            assert len(hand_out(node_api, node, {"node.concurrency": 30})) == count + 1
        return len(queries.captured_queries)

    hand_out(node_api, node)  # loads the application settings into the cache
    assert queries_to_hand_out(20) == queries_to_hand_out(2)


# --- the wire shape -------------------------------------------------------------------------


GITALY = {"default": {"address": "tcp://gitaly-1:8075", "token": "gitaly-token"}}


@pytest.fixture
def gitaly(settings):
    settings.ZOEKT_GITALY_STORAGES = GITALY


@pytest.fixture
def groups():
    root = GroupFactory()
    return root, GroupFactory(parent=root)


def hashed_path(project_id: int) -> str:
    digest = hashlib.sha256(str(project_id).encode()).hexdigest()
    return f"@hashed/{digest[:2]}/{digest[2:4]}/{digest}.git"


def test_an_index_task_has_gitlabs_exact_shape(node_api, now, gitaly, groups):
    root, subgroup = groups
    node = NodeFactory(schema_version=2531, metadata={"name": "z", "concurrency": 4})
    project = ProjectFactory(namespace=subgroup, visibility_level=10, repository_size=2048)
    ProjectFeature.objects.create(project=project, repository_access_level=10)
    task = make_index_task(IndexFactory(zoekt_node=node), project=project)

    assert hand_out(node_api, node) == [
        {
            "name": "index",
            "payload": {
                "GitalyConnectionInfo": {
                    "Address": "tcp://gitaly-1:8075",
                    "Token": "gitaly-token",
                    "Storage": "default",
                    "Path": hashed_path(project.id),
                },
                "Callback": {
                    "name": "index",
                    "payload": {"task_id": task.id, "schema_version": 2531},
                },
                "RepoId": project.id,
                "FileSizeLimit": 1048576,
                "Parallelism": 1,
                "Timeout": "1800s",
                "FileCountLimit": 500000,
                "TrigramMax": 20000,
                "MissingRepo": False,
                "Metadata": {
                    "project_id": str(project.id),
                    "traversal_ids": f"{root.id}-{subgroup.id}-",
                    "visibility_level": "10",
                    "repository_access_level": "10",
                    "forked": "f",
                    "archived": "f",
                },
            },
        }
    ]


def test_a_force_index_task_adds_force(node_api, node, index, gitaly):
    make_index_task(index, task_type=Task.TaskType.FORCE_INDEX_REPO)

    (sent,) = hand_out(node_api, node)

    assert sent["name"] == "index"
    assert sent["payload"]["Force"] is True


def test_a_plain_index_task_has_no_force_key(node_api, node, index, gitaly):
    make_index_task(index)

    (sent,) = hand_out(node_api, node)

    assert "Force" not in sent["payload"]


@pytest.mark.parametrize("repository_size", [None, 0], ids=["no-statistics", "empty-repository"])
def test_a_missing_repository_has_no_gitaly_connection_info(
    node_api, node, index, gitaly, repository_size
):
    make_index_task(index, repository_size=repository_size)

    (sent,) = hand_out(node_api, node)

    assert sent["payload"]["MissingRepo"] is True
    assert "GitalyConnectionInfo" not in sent["payload"]


def test_the_index_limits_come_from_the_application_settings(node_api, node, index, gitaly):
    set_app_setting(
        zoekt_indexed_file_size_limit="2MB",
        zoekt_indexing_parallelism=4,
        zoekt_indexing_timeout="1h",
        zoekt_maximum_files=1000,
        zoekt_trigram_max=300,
    )
    make_index_task(index)

    (sent,) = hand_out(node_api, node)

    payload = sent["payload"]
    assert payload["FileSizeLimit"] == 2 * 1024 * 1024
    assert payload["Parallelism"] == 4
    assert payload["Timeout"] == "3600s"
    assert payload["FileCountLimit"] == 1000
    assert payload["TrigramMax"] == 300


def metadata_of(node_api, node) -> dict:
    (sent,) = hand_out(node_api, node)
    return sent["payload"]["Metadata"]


def test_a_fork_is_flagged_as_forked(node_api, node, index, gitaly):
    task = make_index_task(index)
    ForkNetworkMember.objects.create(
        project_id=task.project_identifier, forked_from_project=ProjectFactory()
    )

    assert metadata_of(node_api, node)["forked"] == "t"


def test_an_archived_project_is_flagged_as_archived(node_api, node, index, gitaly):
    project = ProjectFactory(archived=True, repository_size=1)
    make_index_task(index, project=project)

    assert metadata_of(node_api, node)["archived"] == "t"


def test_a_project_below_an_archived_group_is_flagged_as_archived(
    node_api, node, index, gitaly, groups
):
    root, subgroup = groups
    root.archived = True
    root.save(update_fields=["archived"])
    make_index_task(index, project=ProjectFactory(namespace=subgroup, repository_size=1))

    metadata = metadata_of(node_api, node)
    assert metadata["archived"] == "t"
    assert metadata["traversal_ids"] == f"{root.id}-{subgroup.id}-"


def test_all_metadata_values_are_strings(node_api, node, index, gitaly):
    make_index_task(index)

    metadata = metadata_of(node_api, node)

    assert set(metadata) == {
        "project_id",
        "traversal_ids",
        "visibility_level",
        "repository_access_level",
        "forked",
        "archived",
    }
    assert all(isinstance(value, str) for value in metadata.values())
    assert metadata["traversal_ids"].endswith("-")


def test_a_delete_task_has_gitlabs_exact_shape(node_api, node, index):
    task = make_index_task(index, task_type=Task.TaskType.DELETE_REPO)

    assert hand_out(node_api, node) == [
        {
            "name": "delete",
            "payload": {
                "RepoId": task.project_identifier,
                "Callback": {
                    "name": "delete",
                    "payload": {"task_id": task.id, "service_type": "zoekt"},
                },
            },
        }
    ]
