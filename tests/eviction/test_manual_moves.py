"""Moving one index by hand (``eviction.manual``): ``manage.py zoekt_move --index ID --to NODE``
and ``POST /api/v1/indices/:id/move``.

Every refusal has its stable code, names its field, and writes nothing, through
the API and the command alike; the target rules are the ones ``choose_target``
applies, so a node refused by hand is never chosen by eviction either. A move
that fits starts building on the named node, or waits as a planned move while
the throttles are full, and is asked about again when it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from eviction import manual, moves
from tests.api.helpers import ERROR_KEYS
from tests.api.test_operator_api import make_user
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
from zoekt import app_settings, clock, shutdowns
from zoekt.models import Index, Move, Node, NodeShutdown, Replica, Repository, Task
from zoekt.reasons import Reason
from zoekt.scheduling.handlers import initialize_index

pytestmark = pytest.mark.django_db

PROJECTS = 4
#: The index's used bytes: four projects of 1 GiB.
INDEX_BYTES = PROJECTS * GIB


def node(name: str, used: int = GIB, **fields) -> Node:
    return NodeFactory(
        total_bytes=100 * GIB,
        used_bytes=used,
        metadata={"name": name, "concurrency": 4, **fields.pop("metadata", {})},
        **fields,
    )


def namespace_on(where: Node, projects: int = PROJECTS, size: int = GIB) -> Index:
    """A one-index namespace, ready on ``where``: ``projects`` projects of ``size`` bytes."""
    root = GroupFactory()
    enabled = EnabledNamespaceFactory(root_namespace=root)
    replica = ReplicaFactory(zoekt_enabled_namespace=enabled, state=Replica.State.READY)
    index = IndexFactory(
        zoekt_replica=replica,
        zoekt_node=where,
        state=Index.State.READY,
        used_storage_bytes=projects * size,
        reserved_storage_bytes=int(projects * size / 0.60),
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
    return index


@dataclass
class Fleet:
    src: Node
    dst: Node
    third: Node
    index: Index


@pytest.fixture
def fleet(now) -> Fleet:
    app_settings.update(zoekt_indexing_enabled=True, zoekt_search_enabled=True)
    src, dst, third = node("src", used=30 * GIB), node("dst"), node("third")
    return Fleet(src, dst, third, namespace_on(src))


def url(index_id: int) -> str:
    return f"/api/v1/indices/{index_id}/move"


def snapshot() -> dict:
    """Every row a move request could write."""
    return {
        "moves": list(Move.objects.order_by("id").values()),
        "indices": list(Index.objects.order_by("id").values()),
        "replicas": list(Replica.objects.order_by("id").values()),
        "repositories": list(Repository.objects.order_by("id").values()),
        "tasks": list(Task.objects.order_by("id").values()),
        "nodes": list(Node.objects.order_by("id").values()),
    }


def moving_elsewhere(fleet: Fleet, to: Node, used: int = GIB) -> Move:
    """Another namespace, on ``third``, with a live move building to ``to``."""
    other = namespace_on(fleet.third, projects=1, size=used)
    move = moves.start_planned_move(
        other.id, trigger="memory_pressure", target_node_id=to.id, details={}
    )
    assert move is not None and move.state == Move.State.BUILDING
    return move


def memory_planning_on(budget: int) -> None:
    app_settings.update(zoekt_node_memory_budget_bytes=budget, zoekt_memory_ratio=1)


# --- the refusals, one per rule -----------------------------------------------------------------


def _already_moving(f: Fleet):
    manual.do_move_index(f.index.id, f.third.id, requested_by="ops-bob")
    return f.index.id, f.dst.id


def _not_ready(f: Fleet):
    Index.objects.filter(pk=f.index.pk).update(state=Index.State.INITIALIZING)
    return f.index.id, f.dst.id


def _restarting(f: Fleet):
    shutdowns.do_request_node_shutdown(
        f.dst.id, type="restart", reason="kernel update", requested_by="ops-bob"
    )
    return f.index.id, f.dst.id


def _removed(f: Fleet):
    NodeShutdown.objects.create(
        node=f.dst, node_ref=f.dst.id, type="remove", reason="retire", requested_by="ops-bob"
    )
    return f.index.id, f.dst.id


def _holding(f: Fleet):
    enabled = f.index.zoekt_enabled_namespace
    IndexFactory(
        zoekt_replica=ReplicaFactory(zoekt_enabled_namespace=enabled),
        zoekt_node=f.dst,
        state=Index.State.READY,
    )
    return f.index.id, f.dst.id


def _update_dst(**fields):
    def setup(f: Fleet):
        Node.objects.filter(pk=f.dst.pk).update(**fields)
        return f.index.id, f.dst.id

    return setup


def _offline(f: Fleet):
    # Unseen for a minute: offline (30 s), far from lost.
    return _update_dst(last_seen_at=clock.now() - timedelta(minutes=1))(f)


def _cooling(f: Fleet):
    return _update_dst(eviction_cooldown_until=clock.now() + timedelta(hours=6))(f)


def _inbound_fills(f: Fleet):
    # 60 GiB used + 6 GiB heading there + the index's 4 GiB: 70 %, at the ceiling.
    Node.objects.filter(pk=f.dst.pk).update(used_bytes=60 * GIB)
    moving_elsewhere(f, f.dst, used=6 * GIB)
    return f.index.id, f.dst.id


def _over_memory_watermark(f: Fleet):
    memory_planning_on(100 * GIB)
    health = {"process_health": {"webserver": {"rss_bytes": 80 * GIB}}}
    Node.objects.filter(pk=f.dst.pk).update(metadata={"name": "dst", **health})
    return f.index.id, f.dst.id


def _no_memory_room(f: Fleet):
    memory_planning_on(5 * GIB)  # the index's 4 GiB estimate is 80 % of it
    return f.index.id, f.dst.id


@dataclass(frozen=True)
class Refusal:
    setup: object
    status: int
    field: str
    code: str


REFUSALS = [
    pytest.param(
        Refusal(lambda f: (10**9, f.dst.id), 404, "index_id", "not found"), id="unknown index"
    ),
    pytest.param(
        Refusal(lambda f: (f.index.id, 10**9), 404, "to_node_id", "not found"), id="unknown node"
    ),
    pytest.param(
        Refusal(_not_ready, 409, "index_id", Reason.MOVE_INDEX_NOT_READY), id="index not ready"
    ),
    pytest.param(
        Refusal(_already_moving, 409, "index_id", Reason.MOVE_ALREADY_MOVING),
        id="index already moving",
    ),
    pytest.param(
        Refusal(lambda f: (f.index.id, f.src.id), 400, "to_node_id", Reason.MOVE_TARGET_IS_SOURCE),
        id="the index's own node",
    ),
    pytest.param(
        Refusal(_update_dst(services=[]), 400, "to_node_id", Reason.MOVE_TARGET_NOT_SEARCH_NODE),
        id="not a search node",
    ),
    pytest.param(Refusal(_offline, 409, "to_node_id", Reason.MOVE_TARGET_OFFLINE), id="offline"),
    pytest.param(
        Refusal(_restarting, 409, "to_node_id", Reason.MOVE_TARGET_RESTARTING), id="restarting"
    ),
    pytest.param(
        Refusal(_removed, 409, "to_node_id", Reason.MOVE_TARGET_SHUTTING_DOWN),
        id="shutting down",
    ),
    pytest.param(
        Refusal(_cooling, 409, "to_node_id", Reason.MOVE_TARGET_COOLING_DOWN), id="cooling down"
    ),
    pytest.param(
        Refusal(_holding, 409, "to_node_id", Reason.MOVE_TARGET_HOLDS_NAMESPACE),
        id="holds an index of the namespace",
    ),
    pytest.param(
        Refusal(
            _update_dst(used_bytes=66 * GIB), 409, "to_node_id", Reason.MOVE_TARGET_NO_DISK_ROOM
        ),
        id="no disk room",
    ),
    pytest.param(
        Refusal(_inbound_fills, 409, "to_node_id", Reason.MOVE_TARGET_NO_DISK_ROOM),
        id="no disk room with the moves heading there",
    ),
    pytest.param(
        Refusal(_update_dst(total_bytes=0), 409, "to_node_id", Reason.MOVE_TARGET_NO_DISK_ROOM),
        id="no disk size reported",
    ),
    pytest.param(
        Refusal(
            _over_memory_watermark, 409, "to_node_id", Reason.MOVE_TARGET_OVER_MEMORY_WATERMARK
        ),
        id="over the high memory watermark",
    ),
    pytest.param(
        Refusal(_no_memory_room, 409, "to_node_id", Reason.MOVE_TARGET_NO_MEMORY_ROOM),
        id="no memory room",
    ),
]


def _assert_error(response, refusal: Refusal) -> None:
    assert response.status_code == refusal.status, response.content
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert list(body["errors"]) == [refusal.field], body
    (message,) = body["errors"][refusal.field]
    assert str(refusal.code) in message
    assert body["error"] == f"{refusal.field}: {message}"


@pytest.mark.parametrize("refusal", REFUSALS)
def test_the_api_refuses_with_the_code_names_the_field_and_writes_nothing(fleet, api, refusal):
    index_id, node_id = refusal.setup(fleet)
    before = snapshot()

    response = api.post(url(index_id), {"to_node_id": node_id, "reason": "x"}, format="json")

    _assert_error(response, refusal)
    assert snapshot() == before


@pytest.mark.parametrize("refusal", REFUSALS)
def test_the_command_refuses_with_the_code_names_the_field_and_writes_nothing(fleet, refusal):
    index_id, node_id = refusal.setup(fleet)
    before = snapshot()

    with pytest.raises(CommandError) as error:
        call_command("zoekt_move", "--index", str(index_id), "--to", str(node_id), "--by", "ops")

    assert str(error.value).startswith(f"{refusal.field}: ")
    assert str(refusal.code) in str(error.value)
    assert snapshot() == before


TARGET_REFUSALS = [
    p for p in REFUSALS if p.values[0].field == "to_node_id" and p.values[0].status != 404
]


@pytest.mark.parametrize("refusal", TARGET_REFUSALS)
def test_a_node_refused_by_hand_is_never_chosen_by_eviction_either(fleet, refusal):
    """One statement of the rules: ``choose_target`` keeps only the nodes the hand move
    would take. Every other node is put out of reach, so the refused one is the only
    candidate left."""
    refused = fleet.src if refusal.code == Reason.MOVE_TARGET_IS_SOURCE else fleet.dst
    Node.objects.exclude(pk=refused.pk).exclude(pk=fleet.src.pk).update(services=[])
    index = Index.objects.get(pk=fleet.index.pk)

    def chosen():
        target, _busy = moves.choose_target(
            index,
            INDEX_BYTES,
            ceiling=manual.ceiling(),
            settings=app_settings.current(),
            now=clock.now(),
        )
        return target

    if refused == fleet.dst:
        assert chosen() == fleet.dst  # before the rule bites, dst is the choice
    refusal.setup(fleet)

    assert chosen() is None


def test_the_sentence_gives_the_disk_figures(fleet, api):
    Node.objects.filter(pk=fleet.dst.pk).update(used_bytes=66 * GIB)

    response = api.post(url(fleet.index.id), {"to_node_id": fleet.dst.id}, format="json")

    (message,) = response.json()["errors"]["to_node_id"]
    assert message.replace("\xa0", " ") == (
        f"move_target_no_disk_room: node {fleet.dst.id} (dst) lacks disk room: 66.0 GiB used + "
        f"4.0 GiB of index {fleet.index.id} is 70% of its 100.0 GiB, at or over the 70% a "
        "move's target must stay under."
    )


def test_the_disk_ceiling_is_the_one_eviction_uses(fleet):
    """Just under it fits: 65 GiB used + the index's 4 GiB is 69 %."""
    Node.objects.filter(pk=fleet.dst.pk).update(used_bytes=65 * GIB)

    done = manual.do_move_index(fleet.index.id, fleet.dst.id, requested_by="ops")

    assert done.move.state == Move.State.BUILDING
    assert manual.ceiling() == pytest.approx(0.70)


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({}, "to_node_id", id="no node"),
        pytest.param({"to_node_id": "abc"}, "to_node_id", id="not a number"),
        pytest.param({"to_node_id": 0}, "to_node_id", id="zero"),
        pytest.param({"to_node_id": 2**63}, "to_node_id", id="past bigint"),
        pytest.param({"to_node_id": 1, "reason": "x" * 2001}, "reason", id="a reason too long"),
        pytest.param({"to_node_id": 1, "reason": None}, "reason", id="a null reason"),
        pytest.param({"to_node_id": 1, "force": True}, "force", id="an unknown key"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(fleet, api, body, field):
    before = snapshot()

    response = api.post(url(fleet.index.id), body, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]
    assert snapshot() == before


def test_only_staff_may_move_an_index(fleet):
    before = snapshot()
    anonymous = APIClient()
    assert anonymous.post(url(fleet.index.id), {"to_node_id": fleet.dst.id}).status_code == 401
    member = APIClient()
    token = Token.objects.create(user=make_user("dev", staff=False))
    member.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert member.post(url(fleet.index.id), {"to_node_id": fleet.dst.id}).status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="no mode"),
        pytest.param(["--index", "1"], id="an index and no mode"),
        pytest.param(["--to", "dst"], id="a node without an index"),
        pytest.param(["--index", "1", "--to", "dst", "--resplit", "5"], id="both modes"),
        pytest.param(["--index", "1", "--to", "dst", "--dry-run"], id="a dry run of a move"),
        pytest.param(["--resplit", "5", "--reason", "x"], id="a reason for a re-split"),
        pytest.param(["--resplit", "5", "--by", "ops"], id="an operator for a re-split"),
    ],
)
def test_the_command_refuses_a_bad_combination_and_writes_nothing(fleet, args):
    before = snapshot()

    with pytest.raises(CommandError, match="--"):
        call_command("zoekt_move", *args)

    assert snapshot() == before


# --- a move that fits --------------------------------------------------------------------------


def test_the_api_starts_the_move_on_the_named_node_and_records_who_and_why(fleet, api, now):
    response = api.post(
        url(fleet.index.id),
        {"to_node_id": fleet.dst.id, "reason": "rebalance before the resize"},
        format="json",
    )

    assert response.status_code == 201, response.content
    body = response.json()
    move = Move.objects.get()
    assert body["move_id"] == move.id
    assert (body["state"], body["trigger"], body["reason"]) == ("building", "manual", None)
    assert (body["index_id"], body["source_node_id"], body["target_node_id"]) == (
        fleet.index.id,
        fleet.src.id,
        fleet.dst.id,
    )
    assert body["requested_by"] == "ops-alice"
    assert body["requested_reason"] == "rebalance before the resize"
    assert "started" in body["message"]
    assert (move.trigger, move.state, move.target_node_id) == ("manual", "building", fleet.dst.id)
    assert move.details["planned_target_node_id"] == fleet.dst.id
    assert move.details["requested_by"] == "ops-alice"
    assert move.details["requested_reason"] == "rebalance before the resize"
    assert move.details["requested_at"] == now.isoformat()
    replacement = Index.objects.get(pk=move.replacement_index_id)
    assert (replacement.zoekt_node_id, replacement.state) == (fleet.dst.id, Index.State.PENDING)
    # The old copy is untouched and still the one in the serving replica.
    source = Index.objects.get(pk=fleet.index.pk)
    assert (source.state, source.zoekt_replica_id) == (
        Index.State.READY,
        fleet.index.zoekt_replica_id,
    )


def test_the_command_takes_a_node_by_name_and_prints_what_it_started(fleet, capsys):
    call_command(
        "zoekt_move",
        "--index",
        str(fleet.index.id),
        "--to",
        "dst",
        "--reason",
        "why",
        "--by",
        "bob",
    )

    out = capsys.readouterr().out
    move = Move.objects.get()
    assert f"Move {move.id} started" in out
    assert f"node {fleet.src.id} → node {fleet.dst.id} (dst)" in out
    assert "requested by bob: why" in out
    assert (move.target_node_id, move.details["requested_by"]) == (fleet.dst.id, "bob")


def test_the_command_prints_the_move_as_json(fleet, capsys):
    import json

    call_command("zoekt_move", "--index", str(fleet.index.id), "--to", str(fleet.dst.id), "--json")

    body = json.loads(capsys.readouterr().out)
    assert body["move_id"] == Move.objects.get().id
    assert body["state"] == "building" and body["target_node_id"] == fleet.dst.id


def test_the_operator_defaults_to_the_login_name(fleet, monkeypatch):
    monkeypatch.setattr("getpass.getuser", lambda: "carol")

    call_command("zoekt_move", "--index", str(fleet.index.id), "--to", str(fleet.dst.id))

    assert Move.objects.get().details["requested_by"] == "carol"


def test_a_resplit_still_works_beside_the_new_mode(fleet, capsys):
    """``--resplit`` is unchanged: it refuses while memory planning is off, as before."""
    root = fleet.index.namespace_id
    with pytest.raises(CommandError, match="memory planning is off"):
        call_command("zoekt_move", "--resplit", str(root))
    assert not Move.objects.exists()


# --- throttled: planned, started when a slot frees -----------------------------------------------


def _fill_the_source_slot(fleet: Fleet) -> Move:
    """Another namespace on ``src`` moving to ``third``: with one move per source, the slot."""
    app_settings.update(zoekt_move_max_per_source=1)
    other = namespace_on(fleet.src, projects=1)
    busy = moves.start_planned_move(
        other.id, trigger="memory_pressure", target_node_id=fleet.third.id, details={}
    )
    assert busy is not None and busy.state == Move.State.BUILDING
    return busy


def _swap_in(move: Move) -> None:
    """What the target does for a move: index every repository of the replacement."""
    initialize_index(move.replacement_index_id)
    Repository.objects.filter(zoekt_index_id=move.replacement_index_id).update(
        state=Repository.State.READY
    )
    Index.objects.filter(pk=move.replacement_index_id).update(state=Index.State.READY)
    assert moves.advance_move(move.id) == Move.State.DONE


def test_a_move_over_the_throttles_is_planned_and_starts_when_a_slot_frees(fleet, api):
    busy = _fill_the_source_slot(fleet)

    response = api.post(url(fleet.index.id), {"to_node_id": fleet.dst.id}, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["reason"]) == ("planned", "move_throttled")
    assert body["replacement_index_id"] is None
    assert "starts on node" in body["message"] and "when a slot frees" in body["message"]
    move = Move.objects.get(pk=body["move_id"])
    assert moves.advance_move(move.id) == Move.State.PLANNED  # the slot is still taken

    _swap_in(busy)
    assert moves.advance_move(move.id) == Move.State.BUILDING

    move.refresh_from_db()
    assert move.target_node_id == fleet.dst.id
    assert Index.objects.get(pk=move.replacement_index_id).zoekt_node_id == fleet.dst.id


def test_the_command_says_a_throttled_move_waits(fleet, capsys):
    _fill_the_source_slot(fleet)

    call_command("zoekt_move", "--index", str(fleet.index.id), "--to", "dst")

    out = capsys.readouterr().out
    assert "is planned (move_throttled)" in out and "when a slot frees" in out


def test_a_planned_move_is_asked_again_when_it_starts(fleet):
    """The node filled while the move waited: cancelled with the refusal, nothing built."""
    busy = _fill_the_source_slot(fleet)
    move = manual.do_move_index(fleet.index.id, fleet.dst.id, requested_by="ops").move
    assert move.state == Move.State.PLANNED
    Node.objects.filter(pk=fleet.dst.pk).update(used_bytes=67 * GIB)
    _swap_in(busy)
    replicas = Replica.objects.count()

    assert moves.advance_move(move.id) == Move.State.CANCELLED

    move.refresh_from_db()
    assert move.reason == Reason.MOVE_NO_TARGET
    assert move.details["refused_at_start"] == Reason.MOVE_TARGET_NO_DISK_ROOM
    assert move.replacement_index_id is None and Replica.objects.count() == replicas
    assert Index.objects.get(pk=fleet.index.pk).state == Index.State.READY
