"""A node's zone, as the operator sets it (the admin, ``PATCH /api/v1/nodes/:id``, the CLI),
and the operations on a whole zone: a restart or a drain of every node in it, one
shutdown record per node (``PUT/GET/DELETE /api/v1/zones/:zone/shutdown``,
``manage.py zoekt_node ... --zone``). A bad zone is a 400 naming ``zone`` and changes
nothing; a zone drain with nowhere to go is refused; a zone request that collides with a
node's live record writes nothing at all."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from eviction import drain
from planner.loader import load_scenario
from planner.selection import SelectionService
from tests.api.helpers import ERROR_KEYS
from tests.api.test_operator_api import make_user
from tests.eviction.conftest import beat
from tests.factories import GIB, EnabledNamespaceFactory, GroupFactory, NodeFactory
from tests.zoekt.test_admin import form_data, url
from zoekt import app_settings, shutdowns
from zoekt.models import AuditEvent, Index, Move, Node, NodeShutdown, Replica

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(now) -> APIClient:
    client = APIClient()
    user = make_user("ops-alice", staff=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def zoned(name: str, zone: str | None, **fields) -> Node:
    node = NodeFactory(metadata={"name": name}, **fields)
    Node.objects.filter(pk=node.pk).update(zone=zone)
    node.refresh_from_db()
    return node


def zones() -> dict[int, str | None]:
    return dict(Node.objects.values_list("id", "zone"))


def records() -> list[tuple[int, str, str]]:
    return list(NodeShutdown.objects.order_by("id").values_list("node_id", "type", "status"))


def assert_error(response, status: int, field: str, part: str = "") -> None:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert field in body["errors"], body
    assert part in " ".join(body["errors"][field])


# --- the column ----------------------------------------------------------------------------------


def test_the_database_refuses_a_zone_that_is_not_a_label(now):
    node = zoned("zoekt-1", None)
    for bad in ("", " a", "a b", "-a", "z" * 64):
        with pytest.raises(IntegrityError), transaction.atomic():
            Node.objects.filter(pk=node.pk).update(zone=bad)
    assert zones() == {node.id: None}


def test_saving_a_node_stores_an_empty_zone_as_none(now):
    node = zoned("zoekt-1", "a")
    node.zone = "  "
    node.save()
    assert zones() == {node.id: None}


# --- the admin -----------------------------------------------------------------------------------


def test_the_admin_sets_and_clears_a_node_s_zone(admin_client, now):
    node = zoned("zoekt-1", None)
    page = admin_client.get(url(Node, "change", node.pk))
    assert 'name="zone"' in page.content.decode()

    response = admin_client.post(url(Node, "change", node.pk), form_data(page, zone="eu-1a"))
    assert response.status_code == 302
    assert zones() == {node.id: "eu-1a"}
    event = AuditEvent.objects.filter(event_name="node_updated").latest("id")
    assert event.target_id == node.id

    page = admin_client.get(url(Node, "change", node.pk))
    response = admin_client.post(url(Node, "change", node.pk), form_data(page, zone=""))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert zones() == {node.id: None}


def test_the_admin_refuses_a_bad_zone_and_changes_nothing(admin_client, now):
    node = zoned("zoekt-1", "eu-1a")
    page = admin_client.get(url(Node, "change", node.pk))

    response = admin_client.post(url(Node, "change", node.pk), form_data(page, zone="eu 1a!"))

    assert response.status_code == 200
    assert "zone" in response.context["adminform"].form.errors
    assert zones() == {node.id: "eu-1a"}


# --- PATCH /api/v1/nodes/:id ---------------------------------------------------------------------


def test_the_api_sets_a_zone_and_records_it(api, now):
    node = zoned("zoekt-1", None)

    response = api.patch(f"/api/v1/nodes/{node.id}", {"zone": "eu-1a"}, format="json")

    assert response.status_code == 200, response.content
    assert response.json() == {"id": node.id, "name": "zoekt-1", "zone": "eu-1a"}
    assert zones() == {node.id: "eu-1a"}
    event = AuditEvent.objects.filter(event_name="node_updated").latest("id")
    assert event.details["changes"] == {"zone": [None, "eu-1a"]}
    assert event.author_name == "ops-alice"


@pytest.mark.parametrize("cleared", [None, "", "   "], ids=["null", "empty", "blank"])
def test_the_api_clears_a_zone(api, now, cleared):
    node = zoned("zoekt-1", "eu-1a")

    response = api.patch(f"/api/v1/nodes/{node.id}", {"zone": cleared}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["zone"] is None
    assert zones() == {node.id: None}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"zone": "eu 1a"}, id="a space"),
        pytest.param({"zone": "-eu"}, id="a leading dash"),
        pytest.param({"zone": "z" * 64}, id="too long"),
        pytest.param({"zone": 7}, id="a number"),
        pytest.param({"zone": ["a"]}, id="a list"),
    ],
)
def test_a_bad_zone_is_a_400_naming_zone_and_changes_nothing(api, now, body):
    node = zoned("zoekt-1", "eu-1a")

    response = api.patch(f"/api/v1/nodes/{node.id}", body, format="json")

    assert_error(response, 400, "zone")
    assert zones() == {node.id: "eu-1a"}


def test_a_patch_without_a_zone_changes_nothing(api, now):
    node = zoned("zoekt-1", "eu-1a")

    response = api.patch(f"/api/v1/nodes/{node.id}", {}, format="json")

    assert response.status_code == 200, response.content
    assert response.json() == {"id": node.id, "name": node.name, "zone": "eu-1a"}
    assert zones() == {node.id: "eu-1a"}
    assert_error(api.patch("/api/v1/nodes/999999", {}, format="json"), 404, "node_id")


def test_an_unknown_field_or_node_is_refused(api, now):
    node = zoned("zoekt-1", "eu-1a")

    assert_error(api.patch(f"/api/v1/nodes/{node.id}", {"rack": "r1"}, format="json"), 400, "rack")
    assert_error(api.patch("/api/v1/nodes/999999", {"zone": "b"}, format="json"), 404, "node_id")
    assert zones() == {node.id: "eu-1a"}


def test_the_zone_needs_a_staff_operator(now):
    node = zoned("zoekt-1", None)
    client = APIClient()
    user = make_user("viewer", staff=False)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")

    assert client.patch(f"/api/v1/nodes/{node.id}", {"zone": "a"}, format="json").status_code in (
        401,
        403,
    )
    assert zones() == {node.id: None}


# --- the scenario --------------------------------------------------------------------------------


def test_the_scenario_carries_the_zones_only_when_some_node_has_one(now):
    app_settings.update(zoekt_indexing_enabled=True)
    a = zoned("zoekt-a", "a", total_bytes=100 * GIB, used_bytes=GIB)
    b = zoned("zoekt-b", None, total_bytes=100 * GIB, used_bytes=GIB)
    enabled = EnabledNamespaceFactory(root_namespace=GroupFactory())
    pool = SelectionService(now=now).execute()
    entries = {entry["id"]: entry for entry in load_scenario(pool)["nodes"]}
    assert entries[a.id]["zone"] == "a"
    assert "zone" not in entries[b.id]

    Node.objects.update(zone=None)
    pool = SelectionService(now=now).execute()
    scenario = load_scenario(pool)
    assert all("zone" not in entry for entry in scenario["nodes"])
    assert all("existing_zones" not in ns for ns in scenario["namespaces"])
    assert enabled.id in {ns["enabled_namespace_id"] for ns in scenario["namespaces"]}


# --- a whole zone --------------------------------------------------------------------------------


@pytest.fixture
def fleet(now):
    """Zone a: two nodes; zone b: one node; one node without a zone."""
    return {
        "a1": zoned("zoekt-a1", "a"),
        "a2": zoned("zoekt-a2", "a"),
        "b1": zoned("zoekt-b1", "b"),
        "free": zoned("zoekt-free", None),
    }


def zone_url(zone: str) -> str:
    return f"/api/v1/zones/{zone}/shutdown"


@pytest.mark.parametrize("kind", ["restart", "remove"])
def test_a_zone_request_records_one_shutdown_per_node_of_the_zone(api, fleet, kind):
    response = api.put(zone_url("a"), {"type": kind, "reason": "zone maintenance"}, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert [record["node_id"] for record in body] == [fleet["a1"].id, fleet["a2"].id]
    assert records() == [
        (fleet["a1"].id, kind, "in_progress"),
        (fleet["a2"].id, kind, "in_progress"),
    ]
    assert all(record["requested_by"] == "ops-alice" for record in body)
    event = AuditEvent.objects.filter(event_name="node_shutdown_requested").latest("id")
    assert (event.target_type, event.target_details) == ("zone", "a")
    assert event.details["node_ids"] == [fleet["a1"].id, fleet["a2"].id]


def test_a_zone_request_that_meets_a_live_record_writes_nothing(api, fleet):
    shutdowns.do_request_node_shutdown(
        fleet["a2"].id, type="restart", reason="earlier", requested_by="ops"
    )
    before = records()

    response = api.put(zone_url("a"), {"type": "remove", "reason": "retire"}, format="json")

    assert_error(response, 409, "zone", f"node {fleet['a2'].id}")
    assert records() == before


def test_a_zone_drain_with_nowhere_to_go_is_refused(api, fleet):
    for other in ("b1", "free"):
        shutdowns.do_request_node_shutdown(
            fleet[other].id, type="remove", reason="also going", requested_by="ops"
        )
    before = records()

    response = api.put(zone_url("a"), {"type": "remove", "reason": "retire"}, format="json")

    assert_error(response, 400, "zone", "nowhere to move")
    assert records() == before
    # A restart keeps the data on the nodes: it needs nowhere to go.
    assert api.put(
        zone_url("a"), {"type": "restart", "reason": "r"}, format="json"
    ).status_code == (201)


@pytest.mark.parametrize(
    ("zone", "body", "status", "field"),
    [
        pytest.param("a", {"type": "replace", "reason": "r"}, 400, "type", id="a replace"),
        pytest.param("a", {"type": "remove"}, 400, "reason", id="no reason"),
        pytest.param("a", {"type": "remove", "reason": "r", "x": 1}, 400, "x", id="unknown key"),
        pytest.param("nowhere", {"type": "remove", "reason": "r"}, 404, "zone", id="no node"),
        pytest.param("bad!zone", {"type": "remove", "reason": "r"}, 400, "zone", id="bad label"),
        pytest.param(
            "a",
            {"type": "remove", "reason": "r", "allowed_delay": 60},
            400,
            "allowed_delay",
            id="a delay on a drain",
        ),
    ],
)
def test_a_bad_zone_request_names_its_field_and_writes_nothing(
    api, fleet, zone, body, status, field
):
    response = api.put(zone_url(zone), body, format="json")

    assert_error(response, status, field)
    assert records() == []


def test_a_zone_s_records_are_shown_and_cancelled_together(api, fleet):
    api.put(zone_url("a"), {"type": "restart", "reason": "kernel"}, format="json")

    shown = api.get(zone_url("a"))
    assert shown.status_code == 200
    assert [record["status"] for record in shown.json()] == ["in_progress", "in_progress"]

    cancelled = api.delete(zone_url("a"))
    assert cancelled.status_code == 200, cancelled.content
    assert [record["status"] for record in cancelled.json()] == ["cancelled", "cancelled"]
    assert {status for _node, _type, status in records()} == {"cancelled"}
    assert_error(api.delete(zone_url("a")), 404, "zone")
    assert_error(api.get(zone_url("b")), 404, "zone")


def test_a_zone_drain_moves_every_index_out_of_the_zone(now):
    app_settings.update(
        zoekt_node_level_eviction_enabled=True,
        zoekt_indexing_enabled=True,
        zoekt_search_enabled=True,
        zoekt_eviction_moves=True,
    )
    a1 = beat(
        zoned("zoekt-a1", "a", total_bytes=100 * GIB, used_bytes=10 * GIB), 10 * GIB, seconds=0
    )
    a2 = beat(
        zoned("zoekt-a2", "a", total_bytes=100 * GIB, used_bytes=10 * GIB), 10 * GIB, seconds=0
    )
    b1 = beat(zoned("zoekt-b1", "b", total_bytes=500 * GIB, used_bytes=GIB), GIB, seconds=0)
    for where in (a1, a2):
        enabled = EnabledNamespaceFactory(root_namespace=GroupFactory())
        replica = Replica.objects.create(
            zoekt_enabled_namespace=enabled,
            namespace_id=enabled.root_namespace_id,
            state=Replica.State.READY,
        )
        Index.objects.create(
            zoekt_enabled_namespace=enabled,
            zoekt_replica=replica,
            zoekt_node=where,
            namespace_id=enabled.root_namespace_id,
            state=Index.State.READY,
            used_storage_bytes=2 * GIB,
            reserved_storage_bytes=4 * GIB,
        )

    shutdowns.do_request_zone_shutdown("a", type="remove", reason="retire", requested_by="ops")
    drain.run_drains()

    moved = list(
        Move.objects.order_by("source_node_id").values_list("source_node_id", "target_node_id")
    )
    assert moved == [(a1.id, b1.id), (a2.id, b1.id)]


# --- manage.py zoekt_node ... --zone -------------------------------------------------------------


def run(*args) -> str:
    out = StringIO()
    call_command("zoekt_node", *args, stdout=out)
    return out.getvalue()


def test_the_cli_drains_shows_and_cancels_a_zone(fleet):
    out = run("remove", "--zone", "a", "--reason", "retire zone a", "--by", "ops-bob")

    assert out.startswith("zone a: 2 node(s)")
    assert records() == [
        (fleet["a1"].id, "remove", "in_progress"),
        (fleet["a2"].id, "remove", "in_progress"),
    ]
    assert set(NodeShutdown.objects.values_list("requested_by", flat=True)) == {"ops-bob"}
    assert "zoekt-a2" in run("status", "--zone", "a")
    run("cancel", "--zone", "a", "--by", "ops-bob")
    assert {status for _node, _type, status in records()} == {"cancelled"}


def test_the_cli_refuses_a_zone_and_a_node_together_or_neither(fleet):
    with pytest.raises(CommandError, match="not both"):
        run("restart", "zoekt-a1", "--zone", "a", "--reason", "r")
    with pytest.raises(CommandError, match="--zone"):
        run("restart", "--reason", "r")
    with pytest.raises(CommandError, match="zone"):
        run("remove", "--zone", "nowhere", "--reason", "r")
    assert records() == []


def test_the_cli_shows_sets_and_clears_a_node_s_zone(fleet):
    node = fleet["free"]
    assert "zone (none)" in run("zone", "zoekt-free")
    assert "zone eu-2" in run("zone", "zoekt-free", "eu-2", "--by", "ops-bob")
    assert zones()[node.id] == "eu-2"
    with pytest.raises(CommandError, match="zone"):
        run("zone", "zoekt-free", "bad zone")
    assert zones()[node.id] == "eu-2"
    run("zone", "zoekt-free", "--clear")
    assert zones()[node.id] is None


def test_a_holder_that_is_not_a_candidate_gives_its_zone_in_existing_zones(now):
    app_settings.update(zoekt_indexing_enabled=True)
    zoned("zoekt-a", "a", total_bytes=100 * GIB, used_bytes=GIB)
    away = zoned("zoekt-away", "c", total_bytes=100 * GIB, used_bytes=GIB)
    Node.objects.filter(pk=away.pk).update(last_seen_at=now - timedelta(days=2))
    enabled = EnabledNamespaceFactory(root_namespace=GroupFactory())
    Index.objects.create(
        zoekt_enabled_namespace=enabled,
        zoekt_node=away,
        namespace_id=enabled.root_namespace_id,
        state=Index.State.EVICTED,
    )

    scenario = load_scenario(SelectionService(now=now).execute())

    assert away.id not in {entry["id"] for entry in scenario["nodes"]}
    (entry,) = [ns for ns in scenario["namespaces"] if ns["enabled_namespace_id"] == enabled.id]
    assert entry["existing_node_ids"] == [away.id]
    assert entry["existing_zones"] == ["c"]
