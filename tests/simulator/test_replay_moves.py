"""Moves end to end: fake nodes through the real API, the real jobs on a simulated clock.

A node filled past the high watermark by data that stays is evicted from after the sustain
period; with moves, each namespace on it is rebuilt elsewhere while it serves, and at every
tick from the decision to the last swap every namespace has a search target whose indices
cover its projects exactly once (asserted at the instant searches are drawn). Several
moves run at once, and a group enabled meanwhile is placed by the rollout (never on the
cooling node) while they do."""

from __future__ import annotations

import pytest

from simulator.fakenode import GIB, MIB
from tests.simulator.test_replay import HOT, make_replay, small_catalog
from zoekt.models import Index, Move, Namespace
from zoekt.search_targets import search_targets_many

pytestmark = pytest.mark.django_db(transaction=True)


def _covered_once(root_id: int, answer) -> bool:
    """Every project namespace of the root in exactly one target index's range."""
    ids = list(Namespace.objects.project_namespaces_under(root_id).values_list("id", flat=True))
    hits = dict.fromkeys(ids, 0)
    for target in answer.targets:
        for index in target.indices:
            low = index.project_namespace_id_from
            high = index.project_namespace_id_to
            for pid in ids:
                if (low is None or pid >= low) and (high is None or pid <= high):
                    hits[pid] += 1
    return bool(ids) and all(count == 1 for count in hits.values())


LATE = 9400  # a group enabled while the moves run: the rollout places it meanwhile
LATE_PROJECTS = [(50_500, LATE, 15 * MIB), (50_501, LATE, 15 * MIB)]


def test_a_sustained_overfill_moves_every_namespace_off_without_a_dark_tick():
    roots, projects = small_catalog()
    sizes = {pid: size for pid, _, size in projects + LATE_PROJECTS}
    checked = []
    late_enabled = []
    late_served = []  # ticks at which the late group had a search target
    # Indexing takes time (256 KiB/s a task): the replacements build over many ticks.
    with make_replay(
        tick_seconds=30.0,
        indexing_bytes_per_second=256 * 1024,
        index_size=lambda repo_id: sizes[repo_id],
    ) as replay:
        roots_list = list(roots)
        replay.settings(
            zoekt_indexing_enabled=True,
            zoekt_search_enabled=True,
            zoekt_node_level_eviction_enabled=True,
            zoekt_eviction_sustain_period="30m",
            zoekt_eviction_moves=True,
        )
        _, projects = replay.catalog
        from simulator.replay import catalog_rows

        replay.load_catalog(*catalog_rows({**roots, LATE: "late"}, projects + LATE_PROJECTS))
        for name in ("zoekt-a", "zoekt-b", "zoekt-c"):
            replay.add_node(name, disk_total_bytes=10 * GIB, disk_base_used_bytes=GIB)
        replay.enable(roots_list)
        assert replay.run(3600, until=lambda r: r.converged())
        # The node holding the hot namespace fills with data that stays (78 %).
        hot_node_id = Index.objects.get(namespace_id=HOT).zoekt_node_id
        hot = next(n for n, node in replay.nodes.items() if node.fake.node_id == hot_node_id)
        leaving = set(
            Index.objects.filter(zoekt_node_id=hot_node_id).values_list("namespace_id", flat=True)
        )
        replay.spike(hot, int(6.8 * GIB), 10 * 3600, ramp=0)

        def every_tick(r):
            if not Move.objects.exists():
                return
            if not late_enabled:
                # A rollout runs while the moves do: a new group to place.
                r.enable([LATE], label="late group enabled")
                late_enabled.append(r.t)
            answers = search_targets_many([*roots_list, LATE])
            if answers[LATE].targets:
                late_served.append(r.t)
            for root_id in roots_list:
                assert _covered_once(root_id, answers[root_id]), (r.t, root_id)
            checked.append(r.t)

        replay.watch(every_tick)
        done = replay.run(
            4 * 3600,
            until=lambda r: (
                Move.objects.exists()
                and not Move.objects.live().exists()
                and not Index.objects.filter(zoekt_node_id=hot_node_id).exists()
                and bool(late_served)
            ),
        )
        assert done is True
    # The late group was placed during the moves, and not on the cooling node.
    late = list(Index.objects.filter(namespace_id=LATE))
    assert late and all(index.zoekt_node_id != hot_node_id for index in late)
    moves = list(Move.objects.all())
    assert {m.namespace_id for m in moves} == leaving
    assert all(m.state == Move.State.DONE for m in moves)
    assert all(m.target_node_id != hot_node_id for m in moves)
    # Watched from the first decision to the last swap, a tick at a time, never dark.
    assert len(checked) > 10
    # No dark search from the first decision on (the initial fill was dark, before it).
    dark = [s for s in replay.samples if s.t >= checked[0] and s.searches and s.dark]
    assert dark == []
    assert any(s.dark for s in replay.samples if s.t < checked[0])
    # Each moved namespace serves from its new node with all its projects.
    for namespace_id in leaving:
        assert (
            Index.objects.filter(namespace_id=namespace_id, state=Index.State.READY)
            .exclude(zoekt_node_id=hot_node_id)
            .exists()
        )


def _watch_coverage(replay, roots_list, checked, *, while_=lambda: True):
    """At the instant searches are drawn: every namespace covered exactly once."""

    def every_tick(r):
        if not while_():
            return
        answers = search_targets_many(roots_list)
        for root_id in roots_list:
            assert _covered_once(root_id, answers[root_id]), (r.t, root_id)
        checked.append(r.t)

    replay.watch(every_tick)


def test_a_two_node_resplit_moves_half_a_hot_index_with_no_dark_tick():
    from eviction import moves as move_machinery
    from zoekt.models import Repository

    checked: list[float] = []
    # Heartbeats every tick of 20 s: a node is online between ticks (the threshold is 30 s).
    sizes = {pid: size for pid, _, size in small_catalog()[1] + LATE_PROJECTS}
    with make_replay(
        tick_seconds=20.0,
        indexing_bytes_per_second=256 * 1024,
        index_size=lambda repo_id: sizes[repo_id],
    ) as replay:
        roots, projects = replay.catalog
        roots_list = list(roots)
        replay.settings(zoekt_indexing_enabled=True, zoekt_search_enabled=True)
        from simulator.replay import catalog_rows

        replay.load_catalog(*catalog_rows({**roots, LATE: "late"}, projects + LATE_PROJECTS))
        for name in ("zoekt-a", "zoekt-b"):
            replay.add_node(name, disk_total_bytes=10 * GIB, disk_base_used_bytes=GIB)
        replay.enable(roots_list)
        assert replay.run(3600, until=lambda r: r.converged())
        # Placed by disk: the hot namespace sits whole on one node.
        (hot_index,) = Index.objects.filter(namespace_id=HOT)
        # Memory planning switched on (a 320 MiB budget, an 80 MiB ceiling per index:
        # the hot 3 × 40 MiB wants two pieces), then the re-split.
        replay.settings(zoekt_node_memory_budget_bytes=320 * MIB, zoekt_memory_ratio=1.0)
        plan = move_machinery.start_resplit(HOT)
        assert len(plan.carves) == 1, plan.as_dict()
        move_id = plan.move_id
        # A rollout runs while the carve does: a new group to place.
        replay.enable([LATE], label="late group enabled")
        _watch_coverage(
            replay, roots_list, checked, while_=lambda: Move.objects.filter(id=move_id).exists()
        )
        done = replay.run(
            3 * 3600,
            until=lambda r: (
                Move.objects.get(id=move_id).state == Move.State.DONE
                and Index.objects.filter(namespace_id=LATE, state=Index.State.READY).exists()
                and not Repository.objects.filter(
                    zoekt_index_id=hot_index.id,
                    state__in=(Repository.State.PENDING_DELETION, Repository.State.DELETED),
                ).exists()
            ),
        )
        assert done is True
    move = Move.objects.get(id=move_id)
    assert move.state == Move.State.DONE and move.trigger == "resplit"
    assert move.building_at < move.done_at  # indexing took time: many ticks watched
    assert len(checked) > 10
    dark = [s for s in replay.samples if s.t >= checked[0] and s.searches and s.dark]
    assert dark == []
    assert Index.objects.filter(namespace_id=LATE, state=Index.State.READY).exists()
    # The hot namespace is now one replica of two indices on the two nodes, ready.
    indices = list(Index.objects.filter(namespace_id=HOT).order_by("id"))
    assert len(indices) == 2 and {i.state for i in indices} == {Index.State.READY}
    assert len({i.zoekt_node_id for i in indices}) == 2
    assert len({i.zoekt_replica_id for i in indices}) == 1
    hot_index.refresh_from_db()
    assert hot_index.metadata != {}
    # The carved repositories left the source node.
    kept = Repository.objects.filter(zoekt_index=hot_index).count()
    assert 0 < kept < 3


def test_an_index_of_a_namespace_split_over_three_nodes_moves_with_no_dark_tick():
    checked: list[float] = []
    # Heartbeats every tick of 20 s: a node is online between ticks (the threshold is 30 s).
    # Slow indexing (64 KiB/s a task): the replacement builds over many ticks.
    with make_replay(tick_seconds=20.0, indexing_bytes_per_second=64 * 1024) as replay:
        roots, projects = replay.catalog
        roots_list = list(roots)
        # Memory-aware from the start with a small budget: the hot namespace is split
        # over three nodes (a 40 MiB ceiling against its 3 × 40 MiB).
        replay.settings(
            zoekt_indexing_enabled=True,
            zoekt_search_enabled=True,
            zoekt_node_memory_budget_bytes=160 * MIB,
            zoekt_memory_ratio=1.0,
            zoekt_node_level_eviction_enabled=True,
            zoekt_eviction_sustain_period="30m",
            zoekt_eviction_moves=True,
        )
        from simulator.replay import catalog_rows

        replay.load_catalog(*catalog_rows(roots, projects))
        for name in ("zoekt-a", "zoekt-b", "zoekt-c"):
            replay.add_node(name, disk_total_bytes=10 * GIB, disk_base_used_bytes=GIB)
        replay.enable(roots_list)
        assert replay.run(3600, until=lambda r: r.converged())
        hot = list(Index.objects.filter(namespace_id=HOT).order_by("id"))
        assert len({i.zoekt_node_id for i in hot}) == 3
        # A fourth node joins; the node of the hot namespace's middle index fills up.
        replay.add_node("zoekt-d", disk_total_bytes=10 * GIB, disk_base_used_bytes=GIB)
        middle = hot[1]
        name = next(
            n for n, node in replay.nodes.items() if node.fake.node_id == middle.zoekt_node_id
        )
        replay.spike(name, int(6.8 * GIB), 10 * 3600, ramp=0)
        _watch_coverage(replay, roots_list, checked, while_=lambda: Move.objects.exists())
        done = replay.run(
            4 * 3600,
            until=lambda r: (
                Move.objects.filter(source_index_ref=middle.id, state=Move.State.DONE).exists()
                and not Move.objects.live().exists()
            ),
        )
        assert done is True
    move = Move.objects.get(source_index_ref=middle.id)
    assert move.target_node_id == replay.nodes["zoekt-d"].fake.node_id
    assert (move.project_namespace_id_from, move.project_namespace_id_to) == (
        middle.metadata.get("project_namespace_id_from"),
        middle.metadata.get("project_namespace_id_to"),
    )
    assert len(checked) > 10
    dark = [s for s in replay.samples if s.t >= checked[0] and s.searches and s.dark]
    assert dark == []
    # Still three indices, one replica, none on the filled node.
    after = list(Index.objects.filter(namespace_id=HOT, state=Index.State.READY))
    assert len(after) == 3 and middle.zoekt_node_id not in {i.zoekt_node_id for i in after}
