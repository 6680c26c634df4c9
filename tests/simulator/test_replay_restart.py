"""A node restarted in a replay: stopped, then started again on the same disk.

``Replay.start_node`` starts a new process for a stopped node on the replay's
state directory: the same uuid, what it held. With a restart requested first
(docs/operations.md) the node is back as the same row with every index and
nothing is rebuilt; without one, past the lost-node threshold, today's
lost-node handling deletes it and its heartbeat registers a new, truncated
node. The measurements the rolling-restart replay takes (index bytes built,
dark namespaces) are checked here on a small fleet.
"""

from __future__ import annotations

import pytest

from simulator.fakenode import MIB
from tests.simulator.test_replay import SIZES, make_replay, start_fleet
from zoekt import shutdowns
from zoekt.models import Index, Node, NodeShutdown
from zoekt.reasons import Reason
from zoekt.search_targets import search_targets_many

pytestmark = pytest.mark.django_db(transaction=True)

#: Three projects per root in the small catalog.
TOTAL_INDEX_BYTES = 3 * sum(SIZES.values())
DOWN = 20 * 60


def converged_fleet(replay, lost_after: str = "10m") -> None:
    start_fleet(replay, zoekt_lost_node_threshold=lost_after)
    assert replay.run(3600, until=lambda r: r.converged()) is True
    replay.run(120)


def busiest(replay) -> str:
    """The node that holds the most repositories."""
    return max(replay.nodes, key=lambda name: len(replay.nodes[name].fake.repos))


def layout() -> list[tuple]:
    return sorted(Index.objects.values_list("id", "namespace_id", "zoekt_node_id", "state"))


def built(replay) -> int:
    return sum(node.index_bytes_built() for node in replay.nodes.values())


def dark_roots() -> set[int]:
    roots = list(Index.objects.values_list("namespace_id", flat=True).distinct())
    return {root for root, answer in search_targets_many(roots).items() if not answer.targets}


def test_the_nodes_count_the_index_bytes_they_build():
    with make_replay(traffic={}) as replay:
        converged_fleet(replay)

        assert built(replay) == TOTAL_INDEX_BYTES
        assert TOTAL_INDEX_BYTES == 210 * MIB


def test_a_node_started_again_is_the_same_node_and_holds_what_it_held():
    with make_replay(traffic={}) as replay:
        converged_fleet(replay, lost_after="12h")
        name = busiest(replay)
        node = replay.nodes[name]
        node_id, held, before = node.fake.node_id, node.fake.repos, layout()

        replay.stop_node(name)
        replay.run(600)
        replay.start_node(name)
        replay.run(120)

        assert (node.fake.node_id, node.fake.repos, layout()) == (node_id, held, before)
        assert node.fake.indexed_bytes() == sum(repo.size_bytes for repo in held.values())
        assert built(replay) == TOTAL_INDEX_BYTES  # nothing built again
        assert Node.objects.get(pk=node_id).is_online()
        assert replay.samples[-1].nodes[name].alive is True
        assert [text for _, text in replay.events[-2:]] == [f"{name} stopped", f"{name} started"]


def test_starting_a_node_that_runs_is_refused():
    with make_replay(traffic={}) as replay:
        start_fleet(replay)
        replay.run(60)
        name = next(iter(replay.nodes))
        fake = replay.nodes[name].fake

        with pytest.raises(ValueError, match="running"):
            replay.start_node(name)

        assert replay.nodes[name].fake is fake


def test_without_a_restart_record_the_node_is_lost_and_comes_back_truncated_and_empty():
    with make_replay() as replay:
        converged_fleet(replay)
        name = busiest(replay)
        node = replay.nodes[name]
        old_id = node.fake.node_id

        replay.stop_node(name)
        replay.run(DOWN)
        assert not Node.objects.filter(pk=old_id).exists()  # handled as lost
        replay.start_node(name)
        replay.run(replay.tick_seconds)

        # A new registration: a new row, and the reply's truncate wiped what it held.
        assert node.fake.node_id != old_id
        assert node.fake.repos == {}
        assert node.disk.indexed_bytes() == 0
        assert replay.run(3600, until=lambda r: r.converged()) is True
        assert built(replay) > TOTAL_INDEX_BYTES  # what it held was built again elsewhere


def test_with_a_restart_record_nothing_is_lost_rebuilt_or_dark_after_the_node_is_back():
    with make_replay(searches_per_sample=200) as replay:
        converged_fleet(replay)
        name = busiest(replay)
        node = replay.nodes[name]
        node_id, before = node.fake.node_id, layout()
        record = shutdowns.do_request_node_shutdown(
            node_id, type="restart", reason="upgrade", requested_by="ops"
        )

        replay.stop_node(name)
        replay.run(DOWN)  # twice the lost-node threshold
        assert dark_roots()  # its namespaces have no other copy: dark while it is down
        replay.start_node(name)
        replay.run(replay.tick_seconds)
        back_at = replay.t

        assert dark_roots() == set()
        replay.run(600)
        assert layout() == before
        assert node.fake.node_id == node_id
        assert built(replay) == TOTAL_INDEX_BYTES
        done = NodeShutdown.objects.get(pk=record.pk)
        assert (done.status, done.status_reason) == ("complete", Reason.NODE_RETURNED)
        assert all(s.dark == 0 for s in replay.samples if s.t >= back_at and s.searches)
