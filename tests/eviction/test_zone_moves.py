"""Moves keep the replicas of a namespace in distinct zones when another zone can take
the index (docs/planner.md, "Zones"): eviction's ``choose_target`` and the
memory-pressure policy prefer a node outside the zones of the namespace's other
replicas, and take one inside only when nothing else fits."""

from __future__ import annotations

from datetime import timedelta

import pytest

from eviction import actions as eviction
from eviction.memory_policy import MemoryIndex, MemoryNode, decide
from tests.eviction.conftest import beat, ready_namespace
from tests.factories import GIB, NodeFactory
from zoekt import app_settings, clock
from zoekt.models import Move, Node

HOUR = 3600


@pytest.fixture(autouse=True)
def _moves_on(_eviction_on):
    app_settings.update(zoekt_eviction_moves=True)


def _zone(node: Node, zone: str | None) -> Node:
    Node.objects.filter(pk=node.pk).update(zone=zone)
    node.refresh_from_db()
    return node


def _fleet(*, third_zone: str | None):
    """``hot`` (zone a) over the high watermark with a replica of a namespace whose other
    replica is on ``peer`` (zone b); ``roomy`` (zone b) has the most room; ``modest``
    (``third_zone``) a little less."""
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB, metadata={"name": "hot"})
    peer = NodeFactory(total_bytes=100 * GIB, used_bytes=GIB, metadata={"name": "peer"})
    roomy = NodeFactory(total_bytes=500 * GIB, used_bytes=GIB, metadata={"name": "roomy"})
    modest = NodeFactory(total_bytes=200 * GIB, used_bytes=GIB, metadata={"name": "modest"})
    enabled = ready_namespace(hot, 10 * GIB, also_on=peer)
    for node, zone in ((hot, "a"), (peer, "b"), (roomy, "b"), (modest, third_zone)):
        _zone(node, zone)
    hot = beat(hot, 80 * GIB)
    hot = beat(hot, 80 * GIB, seconds=9 * HOUR)
    for node in (peer, roomy, modest):
        beat(node, GIB, seconds=0)
    return hot, peer, roomy, modest, enabled


def test_an_evicted_index_moves_to_a_zone_its_other_replica_is_not_in(now):
    _hot, _peer, roomy, modest, _enabled = _fleet(third_zone="c")

    eviction.run_node_level()

    move = Move.objects.get()
    assert move.target_node_id == modest.id
    assert move.target_node_id != roomy.id  # the roomiest, but in the other replica's zone


def test_a_node_without_a_zone_is_as_good_as_a_free_zone(now):
    _hot, _peer, _roomy, modest, _enabled = _fleet(third_zone=None)

    eviction.run_node_level()

    assert Move.objects.get().target_node_id == modest.id


def test_when_only_the_other_replica_s_zone_has_room_the_index_still_moves(now):
    _hot, _peer, roomy, modest, _enabled = _fleet(third_zone="b")

    eviction.run_node_level()

    # Every candidate is in zone b: the roomiest, as without zones.
    assert Move.objects.get().target_node_id == roomy.id
    assert modest.zone == "b"


def test_without_zones_the_roomiest_node_takes_it(now):
    _hot, _peer, roomy, _modest, _enabled = _fleet(third_zone=None)
    Node.objects.update(zone=None)

    eviction.run_node_level()

    assert Move.objects.get().target_node_id == roomy.id


def _memory_node(node_id: int, zone: str | None, *, rss: int, budget: int = 100):
    return MemoryNode(
        id=node_id,
        name=f"zoekt-{node_id}",
        budget_bytes=budget,
        rss_bytes=rss,
        estimated_bytes=rss,
        over_high_since=clock.now() - timedelta(hours=9),
        cooling_until=None,
        total_bytes=1000,
        used_bytes=100,
        zone=zone,
    )


def test_a_memory_pressure_move_prefers_a_zone_the_other_replicas_are_not_in(now):
    nodes = [
        _memory_node(1, "a", rss=95),
        _memory_node(2, "b", rss=0),  # the emptiest, but the other replica's zone
        _memory_node(3, "c", rss=20),
    ]
    index = MemoryIndex(10, 1, 7, estimate_bytes=30, used_bytes=10, replica_id=70)
    kwargs = {"holding": {7: {1, 4}}, "sustain_seconds": 0, "now": now}

    with_zones = decide(nodes, [index], replica_zones={7: [(70, "a"), (71, "b")]}, **kwargs)
    without = decide(nodes, [index], **kwargs)

    assert [choice.target_node_id for choice in with_zones] == [3]
    assert [choice.target_node_id for choice in without] == [2]
