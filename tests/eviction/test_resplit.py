"""Re-splitting a hot index with moves (``eviction.resplit``, ``moves.start_resplit``):
planned memory-aware by the real planner, carved range by range, the source narrowed at
each swap, and the namespace covered exactly once the whole time."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command, load_command_class

from eviction import moves, resplit
from eviction.resplit import Carve, Piece, carves, narrowed
from tests.factories import (
    GIB,
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ProjectFactory,
    ReplicaFactory,
    RepositoryFactory,
)
from zoekt import actions, app_settings, clock
from zoekt.models import Index, Move, Node, Replica, Repository
from zoekt.search_targets import search_targets
from zoekt.units import project_namespace_range

pytestmark = pytest.mark.django_db


# --- pure: pieces into carves ------------------------------------------------------------------


def test_pieces_above_the_kept_one_are_carved_top_down_and_below_it_bottom_up():
    pieces = [Piece(1, None, 9), Piece(2, 10, 19), Piece(7, 20, 29), Piece(3, 35, None)]
    out, kept = carves(None, None, source_node_id=7, pieces=pieces)
    assert kept == 2
    assert out == [
        Carve(3, 35, None, "top"),
        Carve(1, None, 9, "bottom"),
        Carve(2, 10, 19, "bottom"),
    ]
    # The source's range stays one range at every step and ends as the kept piece;
    # ids without a project (30..34) belong to the piece below them.
    low, high = None, None
    for carve in out:
        low, high = narrowed(low, high, carve)
    assert (low, high) == (20, 34)


def test_the_pieces_tile_the_source_range_exactly():
    pieces = [Piece(1, None, 200), Piece(2, 250, None)]
    out, kept = carves(100, 500, source_node_id=1, pieces=pieces)
    assert kept == 0
    assert out == [Carve(2, 250, 500, "top")]
    assert narrowed(100, 500, out[0]) == (100, 249)


def test_with_no_piece_on_the_source_its_first_piece_stays():
    out, kept = carves(None, None, source_node_id=9, pieces=[Piece(1, None, 5), Piece(2, 6, None)])
    assert kept == 0 and out == [Carve(2, 6, None, "top")]


def test_one_piece_is_nothing_to_carve():
    assert carves(None, None, source_node_id=1, pieces=[Piece(2, None, None)]) == ([], 0)


# --- against the database ----------------------------------------------------------------------


def _node(name: str, used: int = GIB) -> Node:
    return NodeFactory(
        total_bytes=100 * GIB,
        used_bytes=used,
        metadata={"name": name, "concurrency": 4},
        services=[0],
    )


def _hot_namespace(node: Node, projects: int = 10, size: int = GIB):
    """A one-index namespace on ``node``: ``projects`` projects of ``size`` bytes, each
    with a ready repository."""
    root = GroupFactory()
    enabled = EnabledNamespaceFactory(root_namespace=root)
    replica = ReplicaFactory(zoekt_enabled_namespace=enabled, state=Replica.State.READY)
    index = IndexFactory(
        zoekt_replica=replica,
        zoekt_node=node,
        state=Index.State.READY,
        used_storage_bytes=projects * size,
        reserved_storage_bytes=projects * size * 2,
    )
    for _ in range(projects):
        project = ProjectFactory(namespace=root, repository_size=size)
        RepositoryFactory(
            zoekt_index=index,
            project=project,
            project_identifier=project.id,
            state=Repository.State.READY,
            size_bytes=size,
        )
    return enabled, index


def memory_planning_on(budget: int = 8 * GIB, **more) -> None:
    """Indexing and search on, memory planning with ``budget`` per node and ratio 1."""
    app_settings.update(
        zoekt_indexing_enabled=True,
        zoekt_search_enabled=True,
        zoekt_node_memory_budget_bytes=budget,
        zoekt_memory_ratio=1,
        **more,
    )


@pytest.fixture
def fleet(now):
    memory_planning_on()
    hot, cold = _node("hot", used=30 * GIB), _node("cold")
    enabled, index = _hot_namespace(hot)
    return hot, cold, enabled, index


def _covered_once(enabled) -> list[tuple[int, int | None, int | None]]:
    """(node, from, to) of each target; asserts that every project of the namespace falls
    in exactly one target's range."""
    answer = search_targets(enabled.root_namespace_id)
    assert answer.search_enabled, answer.reason
    served = [
        (t.node_id, i.project_namespace_id_from, i.project_namespace_id_to)
        for t in answer.targets
        for i in t.indices
    ]
    for project in _projects(enabled):
        owners = [
            s
            for s in served
            if (s[1] is None or project >= s[1]) and (s[2] is None or project <= s[2])
        ]
        assert len(owners) == 1, (project, served)
    return served


def _projects(enabled) -> list[int]:
    from zoekt.models import Project

    return sorted(
        Project.objects.filter(namespace_id=enabled.root_namespace_id).values_list(
            "project_namespace_id", flat=True
        )
    )


def _index_replacement(move: Move) -> None:
    """What the target node does: index every repository of the replacement's range."""
    from zoekt.scheduling.handlers import initialize_index

    initialize_index(move.replacement_index_id)
    Repository.objects.filter(zoekt_index_id=move.replacement_index_id).update(
        state=Repository.State.READY
    )
    Index.objects.filter(id=move.replacement_index_id).update(state=Index.State.READY)
    actions.do_update_replica_states()


def test_memory_planning_off_is_a_clear_refusal(fleet):
    app_settings.update(zoekt_node_memory_budget_bytes=None)
    _hot, _cold, enabled, _index = fleet
    with pytest.raises(resplit.ResplitError, match="memory planning is off"):
        moves.start_resplit(enabled.root_namespace_id)
    assert not Move.objects.exists()


def test_a_hot_index_is_resplit_onto_a_second_node_with_no_dark_moment(fleet):
    hot, cold, enabled, index = fleet
    projects = _projects(enabled)
    assert _covered_once(enabled) == [(hot.id, None, None)]

    plan = moves.start_resplit(enabled.root_namespace_id)

    # The planner split the range over both nodes; the piece on hot stays there.
    assert [p.node_id for p in plan.pieces] == [cold.id, hot.id]
    assert plan.pieces[plan.kept].node_id == hot.id
    (carve,) = plan.carves
    assert (carve.node_id, carve.end, carve.project_namespace_id_from) == (cold.id, "bottom", None)
    boundary = carve.project_namespace_id_to
    assert projects[0] <= boundary < projects[-1]
    move = Move.objects.get(pk=plan.move_id)
    assert move.trigger == "resplit" and move.state == Move.State.BUILDING
    assert move.target_node_id == cold.id
    replacement = Index.objects.get(pk=move.replacement_index_id)
    assert replacement.metadata == {"project_namespace_id_to": boundary}
    moving = [p for p in projects if p <= boundary]
    assert move.bytes == len(moving) * GIB

    # While it builds, hot serves everything.
    _index_replacement(move)
    assert Repository.objects.filter(zoekt_index=replacement).count() == len(moving)
    assert _covered_once(enabled) == [(hot.id, None, None)]

    assert moves.advance_move(move.id) == Move.State.DONE
    move.refresh_from_db()
    index.refresh_from_db()
    # In one transaction: cold joined the serving replica, hot narrowed to the rest.
    assert index.state == Index.State.READY
    assert index.metadata == {"project_namespace_id_from": boundary + 1}
    assert Index.objects.get(pk=replacement.pk).zoekt_replica_id == index.zoekt_replica_id
    assert not Replica.objects.filter(pk=move.replacement_replica_id).exists()
    assert sorted(_covered_once(enabled)) == sorted(
        [(hot.id, boundary + 1, None), (cold.id, None, boundary)]
    )
    # The carved repositories leave hot through GitLab's deletion pipeline.
    leaving = Repository.objects.filter(
        zoekt_index=index, state=Repository.State.PENDING_DELETION
    ).count()
    assert leaving == len(moving) == move.details["repositories_leaving_source"]
    assert Repository.objects.filter(zoekt_index=index, state=Repository.State.READY).count() == (
        len(projects) - len(moving)
    )
    assert Replica.objects.get(pk=index.zoekt_replica_id).state == Replica.State.READY


def test_a_project_created_during_the_carve_in_its_range_reaches_the_replacement(fleet):
    _hot, _cold, enabled, index = fleet
    plan = moves.start_resplit(enabled.root_namespace_id)
    move = Move.objects.get(pk=plan.move_id)
    _index_replacement(move)
    # A new project under the root: the router sends it to hot (the build replica takes
    # nothing from it); its project namespace id is the highest, outside the carve.
    late = ProjectFactory(namespace=enabled.root_namespace, repository_size=GIB)
    RepositoryFactory(
        zoekt_index=index, project=late, project_identifier=late.id, state=Repository.State.READY
    )
    # One inside the carved range, indexed on hot during the move: the swap waits for it.
    early = Repository.objects.filter(zoekt_index_id=move.replacement_index_id).order_by("id")[0]
    early.delete()
    assert moves.advance_move(move.id) == Move.State.BUILDING
    move.refresh_from_db()
    assert move.details["catching_up_projects"] == 1
    Repository.objects.filter(zoekt_index_id=move.replacement_index_id).update(
        state=Repository.State.READY
    )
    assert moves.advance_move(move.id) == Move.State.DONE
    index.refresh_from_db()
    assert Repository.objects.get(zoekt_index=index, project=late).state == Repository.State.READY
    _covered_once(enabled)


def test_the_router_sends_a_new_project_to_the_index_whose_range_holds_it(fleet):
    from zoekt.scheduling.indexing import fetch_indices_for_indexing

    hot, _cold, enabled, _index = fleet
    plan = moves.start_resplit(enabled.root_namespace_id)
    move = Move.objects.get(pk=plan.move_id)
    _index_replacement(move)
    moves.advance_move(move.id)
    late = ProjectFactory(namespace=enabled.root_namespace, repository_size=GIB)
    # Above the boundary: hot's range, although cold has far more free bytes.
    targets = fetch_indices_for_indexing(late.id, enabled.root_namespace_id)
    assert [i.zoekt_node_id for i in targets] == [hot.id]


def test_a_second_resplit_while_one_is_live_is_refused(fleet):
    _hot, _cold, enabled, _index = fleet
    moves.start_resplit(enabled.root_namespace_id)
    with pytest.raises(resplit.ResplitError, match="live move"):
        moves.start_resplit(enabled.root_namespace_id)
    assert Move.objects.count() == 1


def test_three_nodes_carve_twice_one_after_the_other(now):
    memory_planning_on()
    hot = _node("hot", used=40 * GIB)
    others = [_node("cold-a"), _node("cold-b", used=2 * GIB)]
    enabled, _index = _hot_namespace(hot, projects=12)
    plan = moves.start_resplit(enabled.root_namespace_id)
    assert len(plan.pieces) == 3 and len(plan.carves) == 2
    seen = []
    move = Move.objects.get(pk=plan.move_id)
    for _ in plan.carves:
        seen.append(move.target_node_id)
        _covered_once(enabled)
        _index_replacement(move)
        _covered_once(enabled)
        assert moves.advance_move(move.id) == Move.State.DONE
        _covered_once(enabled)
        move.refresh_from_db()
        follow = move.details.get("next_move_id")
        if follow:
            move = Move.objects.get(pk=follow)
            assert move.state == Move.State.BUILDING
    assert sorted(seen) == sorted(o.id for o in others)
    assert Move.objects.live().count() == 0
    served = _covered_once(enabled)
    assert {node for node, _, _ in served} == {hot.id, *(o.id for o in others)}


def test_the_command_prints_the_plan_and_starts_it(fleet, capsys):
    hot, _cold, enabled, _index = fleet
    call_command("zoekt_move", "--resplit", str(enabled.root_namespace_id))
    out = capsys.readouterr().out
    assert "carve 1" in out and "(cold)" in out and f"stays on node {hot.id} (hot)" in out
    assert Move.objects.live().count() == 1


def test_the_command_dry_run_writes_nothing(fleet, capsys):
    _hot, _cold, enabled, _index = fleet
    call_command("zoekt_move", "--resplit", str(enabled.root_namespace_id), "--dry-run")
    assert "dry run" in capsys.readouterr().out
    assert not Move.objects.exists()


@pytest.mark.parametrize("value", ["123456789", "abc"])
def test_the_command_refuses_what_it_cannot_resplit(fleet, value):
    with pytest.raises(CommandError):
        call_command("zoekt_move", "--resplit", value)
    assert not Move.objects.exists()


def test_the_admin_action_starts_a_resplit(fleet, admin_client):
    _hot, _cold, enabled, _index = fleet
    response = admin_client.post(
        "/admin/zoekt/enablednamespace/",
        {"action": "resplit_with_moves", "_selected_action": [enabled.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert Move.objects.live().count() == 1
    assert "re-split" in response.content.decode().lower()


def test_planning_a_resplit_writes_nothing(fleet):
    _hot, _cold, enabled, index = fleet
    before = (Index.objects.count(), Move.objects.count(), clock.now())
    resplit.plan_resplit(enabled.root_namespace_id)
    index.refresh_from_db()
    assert (Index.objects.count(), Move.objects.count(), clock.now()) == before
    assert index.metadata == {}


# --- what the command prints ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("low", "high", "text"),
    [
        pytest.param(None, None, "all projects", id="open-both-ends"),
        pytest.param(900336, None, "from 900336", id="open-top"),
        pytest.param(None, 900335, "up to 900335", id="open-bottom"),
        pytest.param(900278, 900335, "900278–900335", id="closed"),
    ],
)
def test_a_project_namespace_range_reads_in_words(low, high, text):
    assert project_namespace_range(low, high) == text


def dry_run(*args: str) -> str:
    out = io.StringIO()
    call_command("zoekt_move", *args, "--dry-run", stdout=out)
    return out.getvalue()


def test_the_dry_run_names_open_ranges_in_words(fleet):
    _hot, _cold, enabled, index = fleet
    out = dry_run("--resplit", str(enabled.root_namespace_id))
    assert "…" not in out
    assert f"index {index.id} (all projects)" in out
    assert "(up to " in out and "(from " in out


def test_the_dry_run_s_json_keeps_open_ends_null(fleet):
    _hot, _cold, enabled, _index = fleet
    plan = json.loads(dry_run("--resplit", str(enabled.root_namespace_id), "--json"))
    assert plan["pieces"][0]["project_namespace_id_from"] is None
    assert plan["pieces"][-1]["project_namespace_id_to"] is None


@pytest.fixture
def no_room_at_home(now):
    """A hot index whose node has too little disk left for any piece of it: the plan puts
    every piece on the two roomy nodes."""
    memory_planning_on()
    hot = _node("hot", used=99 * GIB)
    roomy = [_node("roomy-a"), _node("roomy-b")]
    enabled, index = _hot_namespace(hot, projects=12)
    return hot, roomy, enabled, index


def test_the_dry_run_says_once_where_the_first_piece_stays_when_the_plan_put_none_at_home(
    no_room_at_home,
):
    hot, roomy, enabled, _index = no_room_at_home
    plan = resplit.plan_resplit(enabled.root_namespace_id)
    assert {piece.node_id for piece in plan.pieces} <= {node.id for node in roomy}
    planned_for = plan.pieces[0].node_id
    out = dry_run("--resplit", str(enabled.root_namespace_id))
    first = next(line for line in out.splitlines() if line.startswith("  piece 1 "))
    assert f"stays on node {hot.id} (hot), planned for node {planned_for}" in first
    assert "warning: the plan put no piece" not in out
    assert not Move.objects.exists()


def test_the_dry_run_s_json_warns_when_the_plan_put_no_piece_at_home(no_room_at_home):
    _hot, _roomy, enabled, _index = no_room_at_home
    plan = json.loads(dry_run("--resplit", str(enabled.root_namespace_id), "--json"))
    assert any("no piece on the index's node" in warning for warning in plan["warnings"])


def refusal(*args: str) -> str:
    with pytest.raises(CommandError) as refused:
        call_command("zoekt_move", *args)
    assert not Move.objects.exists()
    return str(refused.value)


def test_a_resplit_of_an_id_no_namespace_has_says_it_does_not_exist(fleet):
    message = refusal("--resplit", "999999", "--dry-run")
    assert message == "namespace 999999: no namespace has this id, so none is enabled for Zoekt"


def test_a_resplit_of_a_namespace_not_enabled_says_it_exists(fleet):
    group = GroupFactory()
    message = refusal("--resplit", str(group.id), "--dry-run")
    assert message == f"namespace {group.id}: it exists but is not enabled for Zoekt"


def test_a_resplit_of_a_subgroup_names_its_root(fleet):
    _hot, _cold, enabled, _index = fleet
    subgroup = GroupFactory(parent=enabled.root_namespace)
    message = refusal("--resplit", str(subgroup.id), "--dry-run")
    assert message == (
        f"namespace {subgroup.id}: it exists but is not a root namespace "
        f"(its root is {enabled.root_namespace_id}, the id to give)"
    )


def test_the_help_says_that_without_dry_run_the_moves_start_at_once_and_index_takes_an_id():
    out = io.StringIO()
    command = load_command_class("eviction", "zoekt_move")
    command.create_parser("manage.py", "zoekt_move").print_help(out)
    text = " ".join(out.getvalue().split())
    assert "without --dry-run the first move starts at once" in text
    assert "--index INDEX_ID" in text
