"""Memory-pressure moves (``eviction.memory_pressure``): the pure rule, then the job
against the database, with the move built while the hot namespace serves."""

from __future__ import annotations

from datetime import timedelta

import pytest

from eviction import memory_pressure as mp
from eviction import moves
from eviction.memory_pressure import MemoryIndex, MemoryNode, clock_update, decide
from tests.conftest import NOW
from tests.eviction.test_resplit import (
    _hot_namespace,
    _index_replacement,
    _node,
    memory_planning_on,
)
from tests.factories import GIB
from zoekt import app_settings, clock
from zoekt.models import Index, Move, Node
from zoekt.search_targets import search_targets

HOUR = 3600
SUSTAIN = 8 * HOUR


def node(node_id, rss, *, budget=100 * GIB, since=NOW - timedelta(hours=9), **kw) -> MemoryNode:
    fields = {
        "name": f"n{node_id}",
        "budget_bytes": budget,
        "rss_bytes": rss,
        "estimated_bytes": rss,
        "over_high_since": since,
        "cooling_until": None,
        "total_bytes": 1000 * GIB,
        "used_bytes": 100 * GIB,
        **kw,
    }
    return MemoryNode(id=node_id, **fields)


def index(index_id, node_id, estimate, *, namespace=None, used=GIB, excluded=False):
    return MemoryIndex(index_id, node_id, namespace or index_id, estimate, used, excluded)


def run(nodes, indices, holding=None, now=NOW):
    if holding is None:
        holding = {i.enabled_namespace_id: {i.node_id} for i in indices}
    return decide(nodes, indices, holding=holding, sustain_seconds=SUSTAIN, now=now)


# --- pure ----------------------------------------------------------------------------------------


def test_the_hot_namespace_leaves_not_the_small_ones():
    hot = node(1, 80 * GIB)
    cold = node(2, 10 * GIB)
    small = [index(i, 1, GIB) for i in range(10, 40)]
    (choice,) = run([hot, cold], [index(1, 1, 40 * GIB), *small])
    assert (choice.index_id, choice.target_node_id, choice.reason) == (1, 2, mp.SUSTAINED)


def test_under_the_high_watermark_nothing_is_decided():
    assert run([node(1, 74 * GIB), node(2, 10 * GIB)], [index(1, 1, 40 * GIB)]) == []


def test_it_waits_for_the_sustain_period_unless_critical():
    recent = NOW - timedelta(hours=1)
    (waiting,) = run([node(1, 80 * GIB, since=recent), node(2, 0)], [index(1, 1, 30 * GIB)])
    assert waiting.reason == mp.NOT_SUSTAINED and not waiting.moves
    (critical,) = run([node(1, 86 * GIB, since=recent), node(2, 0)], [index(1, 1, 30 * GIB)])
    assert critical.reason == mp.CRITICAL and critical.target_node_id == 2


def test_a_target_that_would_cross_its_own_band_is_refused_then_a_smaller_index_goes():
    # Node 2 at 40 %: the 40 GiB index would take it to 80 % (over 70 %); 20 GiB fits.
    choices = run(
        [node(1, 90 * GIB), node(2, 40 * GIB)], [index(1, 1, 40 * GIB), index(2, 1, 20 * GIB)]
    )
    assert [(c.index_id, c.target_node_id) for c in choices] == [(2, 2)]


def test_small_ones_that_relieve_nothing_do_not_move_when_the_hot_one_fits_nowhere():
    # 80 GiB of 100: 5 GiB must go. The 60 GiB index fits nowhere; 1 GiB ones do not help.
    small = [index(i, 1, GIB) for i in range(10, 20)]
    (choice,) = run([node(1, 80 * GIB), node(2, 30 * GIB)], [index(1, 1, 60 * GIB), *small])
    assert choice.reason == mp.NO_TARGET and not choice.moves


def test_nothing_fits_whole_is_no_target():
    (choice,) = run([node(1, 90 * GIB), node(2, 60 * GIB)], [index(1, 1, 40 * GIB)])
    assert choice.reason == mp.NO_TARGET and not choice.moves


def test_a_node_holding_the_namespace_a_cooling_node_and_a_moved_namespace_are_left_out():
    pressed = node(1, 90 * GIB)
    holder, cooling = node(2, 0), node(3, 0, cooling_until=NOW + timedelta(hours=1))
    free = node(4, 30 * GIB)
    (choice,) = run(
        [pressed, holder, cooling, free],
        [index(1, 1, 10 * GIB, namespace=7), index(2, 1, 30 * GIB, excluded=True)],
        holding={7: {1, 2}},
    )
    assert (choice.index_id, choice.target_node_id) == (1, 4)


def test_one_move_at_a_time_off_a_node_and_none_while_it_cools():
    assert run([node(1, 90 * GIB, moving_out=True), node(2, 0)], [index(1, 1, GIB)])[0].reason == (
        mp.IN_FLIGHT
    )
    cooling = node(1, 90 * GIB, cooling_until=NOW + timedelta(hours=1))
    assert run([cooling, node(2, 0)], [index(1, 1, GIB)])[0].reason == mp.COOLING


def test_the_clock_keeps_through_the_band_and_clears_under_it():
    start = NOW - timedelta(hours=3)
    assert clock_update(0.80, None, NOW) == NOW
    assert clock_update(0.80, start, NOW) == start
    assert clock_update(0.72, start, NOW) == start  # in the band: kept
    assert clock_update(0.69, start, NOW) is None
    assert clock_update(None, start, NOW) == start  # no reading: unchanged


# --- against the database ------------------------------------------------------------------------


def _report_rss(target: Node, rss: int) -> None:
    """What the node's heartbeat reports: its webserver's resident bytes."""
    metadata = dict(Node.objects.get(id=target.id).metadata or {})
    health = dict(metadata.get("process_health") or {})
    health["webserver"] = {**(health.get("webserver") or {}), "rss_bytes": rss}
    metadata["process_health"] = health
    Node.objects.filter(id=target.id).update(metadata=metadata)


@pytest.fixture
def pressed(now):
    memory_planning_on(16 * GIB, zoekt_eviction_moves=True, zoekt_memory_pressure_moves=True)
    hot, cold = _node("hot", used=30 * GIB), _node("cold")
    enabled, source = _hot_namespace(hot, projects=8)  # 8 GiB of estimate
    small, _ = _hot_namespace(hot, projects=1)
    return hot, cold, enabled, source, small


@pytest.mark.django_db
def test_off_until_enabled(pressed):
    app_settings.update(zoekt_memory_pressure_moves=False)
    assert mp.run_memory_pressure() == {"skipped": "memory_pressure_moves_off"}


@pytest.mark.django_db
def test_a_node_over_its_memory_high_watermark_for_the_sustain_period_moves_its_hot_one(pressed):
    hot, cold, enabled, source, _small = pressed
    assert _rss_is_read(hot)
    _report_rss(hot, 13 * GIB)  # 81 % of 16 GiB
    _report_rss(cold, GIB)

    first = mp.run_memory_pressure()
    assert first["moves_started"] == [] and first["choices"][0]["reason"] == mp.NOT_SUSTAINED
    hot.refresh_from_db()
    assert hot.memory_high_watermark_exceeded_at == clock.now()

    clock.advance(SUSTAIN)
    for n in (hot, cold):
        Node.objects.filter(id=n.id).update(last_seen_at=clock.now())
    result = mp.run_memory_pressure()
    (move_id,) = result["moves_started"]
    move = Move.objects.get(pk=move_id)
    assert move.trigger == "memory_pressure" and move.source_index_ref == source.id
    assert move.state == Move.State.BUILDING and move.target_node_id == cold.id
    assert move.details["memory_reason"] == mp.SUSTAINED
    # Run again: the move is live, nothing more starts.
    assert mp.run_memory_pressure()["moves_started"] == []
    # It serves from hot while it builds, then from cold.
    assert [t.node_id for t in search_targets(enabled.root_namespace_id).targets] == [hot.id]
    _index_replacement(move)
    assert moves.advance_move(move.id) == Move.State.DONE
    assert [t.node_id for t in search_targets(enabled.root_namespace_id).targets] == [cold.id]
    assert Index.objects.get(pk=source.id).state == Index.State.EVICTED


def _rss_is_read(target: Node) -> bool:
    from zoekt import memory

    _report_rss(target, 123)
    target.refresh_from_db()
    return memory.webserver_counter(target.metadata, "rss_bytes") == 123
