"""A fake node loses its state directory, comes back under the same uuid, and is rebuilt.

Through the real API over HTTP, Celery (eager) and the database, as
``test_lifecycle_e2e``: the node indexes a namespace that search then
serves; it stops, its state directory is wiped but for its uuid, and it
heartbeats again holding nothing. The heartbeat is no registration (no
truncate), so until the check notices, search would still go to it. The
check sees the shortfall, waits for it to persist, re-indexes the node's
indices, and the node indexes the namespace again. A restart that keeps the
state directory, by contrast, holds and reports what it held.
"""

from __future__ import annotations

import shutil

import pytest
from django.conf import settings

from planner.tasks import rollout_task
from simulator.fakenode import MIB, FakeNode, FakeNodeConfig
from tests.scheduling.conftest import set_setting
from zoekt import operator_actions
from zoekt.catalog import do_bulk_upsert_catalog
from zoekt.models import Index, Node, Project, Repository
from zoekt.reasons import Reason
from zoekt.scheduling.lost_index_data import (
    HEALTHY,
    REINDEX,
    SHORTFALL_SEEN,
    SUSTAIN_SECONDS,
    reindex_lost_index_data_task,
)
from zoekt.scheduling.service import TASKS
from zoekt.scheduling.tasks import run_scheduled_task
from zoekt.search_targets import search_targets

pytestmark = pytest.mark.django_db(transaction=True)

ROOT_ID = 7100
PROJECTS = 5
REPO_BYTES = 32 * MIB


def catalog() -> dict:
    """One group with ``PROJECTS`` projects of 1 MiB each."""
    group = {"type": "Group", "parent_id": None, "visibility_level": 20, "archived": False}
    namespaces = [{"id": ROOT_ID, "name": "Lost", "path": "lost", **group}]
    projects, statistics = [], []
    for k in range(PROJECTS):
        namespace_id, project_id = ROOT_ID + 1 + k, ROOT_ID + 100 + k
        project = {"id": namespace_id, "name": f"p{k}", "path": f"p{k}", "type": "Project"}
        namespaces.append({**group, **project, "parent_id": ROOT_ID})
        projects.append(
            {
                "id": project_id,
                "name": f"p{k}",
                "path": f"p{k}",
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


def run_until(condition, node: FakeNode, *, ticks: int = 15) -> None:
    """What beat and the node do in a while (rollout, every scheduled task, a pull), until."""
    for _ in range(ticks):
        rollout_task()
        for name in TASKS:
            run_scheduled_task(name, bypass_throttle=True)
        result = node.step()
        assert result.heartbeat.status == 200, result.heartbeat.error
        if condition():
            return
    raise AssertionError(f"not reached after {ticks} ticks")


@pytest.fixture
def later(settings):
    """Move every thread's clock (the live server's too) forward by ``seconds``."""
    offset = [0.0]

    def advance(seconds: float) -> None:
        offset[0] += seconds
        settings.ZOEKT_CLOCK_OFFSET_SECONDS = offset[0]

    settings.ZOEKT_CLOCK_OFFSET_SECONDS = 0.0
    return advance


def test_a_node_that_lost_its_state_directory_gets_its_indices_rebuilt(
    live_server, tmp_path, eager_celery, later
):
    set_setting(zoekt_indexing_enabled=True, zoekt_search_enabled=True)
    secret_file = tmp_path / "gitlab_shell_secret"
    secret_file.write_text(settings.GITLAB_SHELL_SECRETS[0] + "\n")
    state_dir = tmp_path / "nodes"
    config = {
        "base_url": live_server.url,
        "secret_file": secret_file,
        "state_dir": state_dir,
        "name": "zoekt-lost",
        "concurrency": 8,
        "index_size": lambda _: REPO_BYTES,
    }
    running: list[FakeNode] = []

    def start() -> FakeNode:
        node = FakeNode(FakeNodeConfig(**config))
        running.append(node)
        return node

    def heartbeat(node: FakeNode) -> dict:
        later(10)  # past the heartbeat's 5 s debounce, so the reading is stored
        result = node.step()
        assert result.heartbeat.status == 200, result.heartbeat.error
        return result.heartbeat.reply

    try:
        node = start()
        assert heartbeat(node)["truncate"] is True
        do_bulk_upsert_catalog(**catalog())
        operator_actions.do_enable_namespace(0, ROOT_ID, search=True)
        run_until(lambda: search_targets(ROOT_ID).search_enabled, node)
        project_ids = sorted(Project.objects.values_list("id", flat=True))
        assert sorted(node.repos) == project_ids
        heartbeat(node)
        assert reindex_lost_index_data_task()["decisions"] == {HEALTHY: 1}
        node_row = Node.objects.get(uuid=node.uuid)
        assert node_row.indexed_bytes == len(project_ids) * REPO_BYTES

        # A restart with the state directory: the same holdings, reported at once.
        node.stop()
        node = start()
        assert sorted(node.repos) == project_ids
        assert heartbeat(node)["truncate"] is False
        assert reindex_lost_index_data_task()["decisions"] == {HEALTHY: 1}

        # The disk is lost; the uuid is kept (written back into an empty state directory).
        node.stop()
        shutil.rmtree(state_dir)
        state_dir.mkdir()
        (state_dir / "zoekt-lost.uuid").write_text(f"{node.uuid}\n")
        node = start()
        assert node.repos == {}
        assert heartbeat(node)["truncate"] is False
        assert Node.objects.get(pk=node_row.pk).indexed_bytes == 0
        assert search_targets(ROOT_ID).search_enabled  # what the check is for
        assert reindex_lost_index_data_task()["decisions"] == {SHORTFALL_SEEN: 1}

        later(SUSTAIN_SECONDS)
        heartbeat(node)
        result = reindex_lost_index_data_task()
        assert result["decisions"] == {REINDEX: 1}
        assert result["reindexed"] == {"indexed_bytes_shortfall": 1}
        assert result["repositories_reset"] == len(project_ids)
        assert search_targets(ROOT_ID).reason == Reason.NO_READY_REPLICA
        (index,) = Index.objects.filter(zoekt_node_id=node_row.pk)
        assert index.state == Index.State.INITIALIZING

        # The node is handed its repositories again and indexes them; search comes back.
        run_until(lambda: search_targets(ROOT_ID).search_enabled, node)
        assert sorted(node.repos) == project_ids
        assert set(Repository.objects.values_list("state", flat=True)) == {Repository.State.READY}
        index.refresh_from_db()
        assert index.state == Index.State.READY
        heartbeat(node)
        assert Node.objects.get(pk=node_row.pk).indexed_bytes == len(project_ids) * REPO_BYTES
        again = reindex_lost_index_data_task()
        assert again["decisions"] == {HEALTHY: 1}
        assert again["reindexed"] == {}
    finally:
        for node in running:
            node.stop()
