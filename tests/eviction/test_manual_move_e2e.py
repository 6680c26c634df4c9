"""A move by hand from request to swap, through the node API and every scheduling job.

The fleet runs on the simulated clock: the nodes heartbeat through the node
API and answer every task they are handed with a success callback (a fake
node), and every minute the whole scheduling service runs (throttles off,
its events at once) with ``advance_moves``, as beat would. The replacement
is built on the named node, turns ready from the callbacks, is swapped in,
and the old index alone is evicted and then deleted from its node; the
namespace is searchable, every project by exactly one index, at every step.
"""

from __future__ import annotations

import pytest
from django.test import Client

from eviction import manual, moves
from tests.api.helpers import GIB, HOST, NodeAPI, heartbeat_body
from tests.eviction.test_manual_moves import namespace_on
from tests.factories import NodeFactory
from zoekt import app_settings, clock
from zoekt.models import Index, Move, Node, Project, Replica, Repository
from zoekt.scheduling import events
from zoekt.scheduling.service import TASKS, SchedulingService
from zoekt.search_targets import search_targets

pytestmark = pytest.mark.django_db

MIB = 1024**2


class FakeFleet:
    """Nodes that heartbeat through the API and report every task they get as done."""

    def __init__(self, api: NodeAPI, *nodes: Node):
        self.api = api
        self.nodes = nodes
        self.callbacks: dict[int, list[str]] = {node.id: [] for node in nodes}

    def beat(self, node: Node) -> None:
        body = heartbeat_body(
            {
                "node.name": node.name,
                "node.url": node.index_base_url,
                "disk.all": 100 * GIB,
                "disk.used": 10 * GIB,
                "disk.indexed": 0,
            }
        )
        response = self.api.heartbeat(node.uuid, body)
        assert response.status_code == 200, response.content
        for task in response.json()["tasks"]:
            callback = task["payload"]["Callback"]
            answer = {"name": callback["name"], "success": True, "payload": callback["payload"]}
            if callback["name"] == "index":
                stats = {"size_in_bytes": 64 * MIB, "index_file_count": 1}
                answer["additional_payload"] = {"repo_stats": stats}
            reply = self.api.callback(node.uuid, answer)
            assert reply.status_code == 202, reply.content
            self.callbacks[node.id].append(callback["name"])

    def minute(self) -> None:
        """Heartbeats every 20 s, then one minute of beat: the scheduling jobs, the moves."""
        for _ in range(3):
            clock.advance(20)
            for node in self.nodes:
                self.beat(node)

        def run_now(event: str, args: tuple) -> None:
            events.task_for(event)(*args)

        service = SchedulingService(bypass_throttle=True, dispatch=run_now)
        for name in TASKS:
            service.execute(name)
        moves.advance_moves()


def served(root_namespace_id: int) -> list[tuple[int, int]]:
    """``(node, index)`` of each search target; asserts that every project of the
    namespace is searched on exactly one of them."""
    answer = search_targets(root_namespace_id)
    assert answer.search_enabled, answer.reason
    ranges = [
        (t.node_id, i.index_id, i.project_namespace_id_from, i.project_namespace_id_to)
        for t in answer.targets
        for i in t.indices
    ]
    for project in Project.objects.filter(namespace_id=root_namespace_id):
        owners = [
            r
            for r in ranges
            if (r[2] is None or project.project_namespace_id >= r[2])
            and (r[3] is None or project.project_namespace_id <= r[3])
        ]
        assert len(owners) == 1, (project.id, ranges)
    return sorted({(r[0], r[1]) for r in ranges})


@pytest.fixture
def fleet(now):
    app_settings.update(zoekt_indexing_enabled=True, zoekt_search_enabled=True)
    src = NodeFactory(metadata={"name": "src", "concurrency": 4})
    dst = NodeFactory(metadata={"name": "dst", "concurrency": 4})
    moving = namespace_on(src)
    staying = namespace_on(src, projects=2)
    clock.advance(60)  # past the heartbeat's 5 s debounce of the rows just made
    fake = FakeFleet(NodeAPI(Client(HTTP_HOST=HOST)), src, dst)
    fake.minute()
    return fake, src, dst, moving, staying


def test_a_hand_move_builds_on_the_named_node_swaps_and_evicts_the_old_index_alone(fleet):
    fake, src, dst, index, staying = fleet
    root = index.namespace_id
    assert served(root) == [(src.id, index.id)]

    move = manual.do_move_index(index.id, dst.id, requested_by="ops", reason="rebalance").move

    assert (move.state, move.target_node_id) == (Move.State.BUILDING, dst.id)
    replacement_id = move.replacement_index_id
    assert Index.objects.get(pk=replacement_id).zoekt_node_id == dst.id
    seen = []
    for _ in range(15):
        fake.minute()
        seen.append(served(root))  # searchable, every project once, at every step
        move.refresh_from_db()
        if move.state == Move.State.DONE:
            break
    assert move.state == Move.State.DONE, move.reason
    # The old copy served while the replacement was built, until it, and only it, took over.
    assert seen[0] == [(src.id, index.id)] and seen[-1] == [(dst.id, replacement_id)]
    assert all(step in ([(src.id, index.id)], [(dst.id, replacement_id)]) for step in seen)
    assert fake.callbacks[dst.id].count("index") == 4  # the four projects, built once
    replacement = Index.objects.get(pk=replacement_id)
    assert (replacement.state, replacement.zoekt_replica_id) == (
        Index.State.READY,
        move.source_replica_ref,
    )
    assert not Replica.objects.filter(pk=move.replacement_replica_id).exists()
    assert move.details["source_index_evicted"] == index.id
    assert move.details["requested_by"] == "ops"

    # The old index alone leaves its node: its repositories are deleted there, then its row.
    for _ in range(30):
        fake.minute()
        assert served(root) == [(dst.id, replacement_id)]
        if not Index.objects.filter(pk=index.id).exists():
            break
    assert not Index.objects.filter(pk=index.id).exists()
    assert fake.callbacks[src.id].count("delete") == 4
    kept = Index.objects.get(pk=staying.pk)
    assert (kept.state, kept.zoekt_node_id, kept.zoekt_replica_id) == (
        Index.State.READY,
        src.id,
        staying.zoekt_replica_id,
    )
    assert Repository.objects.filter(zoekt_index=kept, state=Repository.State.READY).count() == 2
    assert served(staying.namespace_id) == [(src.id, staying.id)]
