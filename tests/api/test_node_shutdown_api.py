"""The node shutdown records' API: ``PUT/GET/DELETE /api/v1/nodes/:id/shutdown``.

Staff only (the operator API's authentication, tested with the other endpoints
in test_operator_api.py). A request is recorded with the operator's name and
the allowed delay (a restart) or the target node (a replace); a bad one is a 400
naming its field and writes nothing; a second live record is refused by the
database (a 409 naming ``node_id``); a drain's progress is in ``drain``; a
``DELETE`` cancels, or returns a drained node to service.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.api.helpers import ERROR_KEYS, set_app_setting
from tests.api.test_operator_api import make_user
from tests.factories import NodeFactory
from zoekt import clock
from zoekt.models import NodeShutdown

pytestmark = pytest.mark.django_db


def url(node_id: int) -> str:
    return f"/api/v1/nodes/{node_id}/shutdown"


@pytest.fixture
def api(now) -> APIClient:
    client = APIClient()
    user = make_user("ops-alice", staff=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def node(now):
    return NodeFactory(metadata={"name": "gitlab-zoekt-2"})


def records() -> list[dict]:
    return list(NodeShutdown.objects.order_by("id").values())


def assert_error(response, status: int, field: str, part: str = "") -> None:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert field in body["errors"], body
    assert part in " ".join(body["errors"][field])


# --- PUT ---------------------------------------------------------------------------------------


def test_a_restart_is_recorded_with_the_operator_and_the_default_delay(api, node, now):
    set_app_setting(zoekt_node_restart_delay_seconds=1200)

    response = api.put(url(node.id), {"type": "restart", "reason": "Zoekt upgrade"}, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["type"] == "restart"
    assert body["status"] == "in_progress"
    assert body["requested_by"] == "ops-alice"
    assert body["allowed_delay_seconds"] == 1200
    assert body["delay_seconds_left"] == 1200
    assert body["node_online"] is True
    record = NodeShutdown.objects.get()
    assert (record.node_id, record.node_name, record.reason) == (
        node.id,
        "gitlab-zoekt-2",
        "Zoekt upgrade",
    )
    assert record.delay_expires_at == now + timedelta(seconds=1200)


def test_a_restart_may_give_its_own_delay(api, node, now):
    response = api.put(
        url(node.id), {"type": "restart", "reason": "reboot", "allowed_delay": 600}, format="json"
    )

    assert response.status_code == 201, response.content
    assert NodeShutdown.objects.get().delay_expires_at == now + timedelta(seconds=600)


@pytest.mark.parametrize(
    ("body", "field", "part"),
    [
        pytest.param({"reason": "x"}, "type", "required", id="type-missing"),
        pytest.param({"type": "reboot", "reason": "x"}, "type", "", id="type-unknown"),
        pytest.param(
            {"type": "replace", "reason": "x"}, "target_node_id", "names the node", id="replace"
        ),
        pytest.param(
            {"type": "replace", "reason": "x", "target_node_id": "next"},
            "target_node_id",
            "",
            id="target-not-a-number",
        ),
        pytest.param(
            {"type": "remove", "reason": "x", "allowed_delay": 60},
            "allowed_delay",
            "only a restart",
            id="remove-with-a-delay",
        ),
        pytest.param(
            {"type": "restart", "reason": "x", "target_node_id": 1},
            "target_node_id",
            "only a replace",
            id="restart-with-a-target",
        ),
        pytest.param({"type": "restart"}, "reason", "required", id="reason-missing"),
        pytest.param({"type": "restart", "reason": "  "}, "reason", "", id="reason-blank"),
        pytest.param(
            {"type": "restart", "reason": "x", "allowed_delay": 0},
            "allowed_delay",
            "",
            id="delay-0",
        ),
        pytest.param(
            {"type": "restart", "reason": "x", "allowed_delay": -60},
            "allowed_delay",
            "",
            id="delay-negative",
        ),
        pytest.param(
            {"type": "restart", "reason": "x", "allowed_delay": "soon"},
            "allowed_delay",
            "",
            id="delay-not-a-number",
        ),
        pytest.param(
            {"type": "restart", "reason": "x", "allowed_delay": 8 * 24 * 3600},
            "allowed_delay",
            "",
            id="delay-over-a-week",
        ),
        pytest.param(
            {"type": "restart", "reason": "x", "target_node": 2},
            "target_node",
            "",
            id="unknown-key",
        ),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field_and_writes_nothing(api, node, body, field, part):
    response = api.put(url(node.id), body, format="json")

    assert_error(response, 400, field, part)
    assert records() == []


def test_a_request_for_an_unknown_node_is_a_404_and_writes_nothing(api, node):
    response = api.put(url(node.id + 1000), {"type": "restart", "reason": "x"}, format="json")

    assert_error(response, 404, "node_id", "not found")
    assert records() == []


def test_a_second_live_record_is_a_409_naming_the_node_and_the_first_stands(api, node):
    api.put(url(node.id), {"type": "restart", "reason": "first"}, format="json")
    before = records()

    response = api.put(url(node.id), {"type": "restart", "reason": "second"}, format="json")

    assert_error(response, 409, "node_id", "already has a live shutdown record")
    assert records() == before


# --- GET ---------------------------------------------------------------------------------------


def test_status_shows_the_live_record_with_the_seconds_left(api, node, now):
    api.put(url(node.id), {"type": "restart", "reason": "x", "allowed_delay": 900}, format="json")
    clock.advance(300)

    body = api.get(url(node.id)).json()

    assert body["status"] == "in_progress"
    assert body["delay_seconds_left"] == 600
    assert body["node_online"] is False  # last seen 300 s ago


def test_status_shows_the_latest_record_when_none_is_live(api, node):
    api.put(url(node.id), {"type": "restart", "reason": "x"}, format="json")
    api.delete(url(node.id))

    body = api.get(url(node.id)).json()

    assert (body["status"], body["cancelled_by"]) == ("cancelled", "ops-alice")
    assert body["delay_seconds_left"] is None


def test_status_of_a_node_without_records_is_a_404(api, node):
    assert_error(api.get(url(node.id)), 404, "node_id", "no shutdown record")


# --- DELETE ------------------------------------------------------------------------------------


def test_cancel_is_recorded_with_the_operator_and_frees_the_node_for_a_new_request(api, node, now):
    api.put(url(node.id), {"type": "restart", "reason": "x"}, format="json")
    clock.advance(60)

    response = api.delete(url(node.id))

    assert response.status_code == 200, response.content
    record = NodeShutdown.objects.get()
    assert (record.status, record.cancelled_by, record.cancelled_at) == (
        "cancelled",
        "ops-alice",
        now + timedelta(seconds=60),
    )
    again = api.put(url(node.id), {"type": "restart", "reason": "y"}, format="json")
    assert again.status_code == 201
    assert NodeShutdown.objects.count() == 2


def test_cancel_without_a_live_record_is_a_404_and_changes_nothing(api, node):
    api.put(url(node.id), {"type": "restart", "reason": "x"}, format="json")
    api.delete(url(node.id))
    before = records()

    assert_error(api.delete(url(node.id)), 404, "node_id", "no live shutdown record")
    assert records() == before


# --- remove and replace ------------------------------------------------------------------------


def test_a_remove_is_recorded_and_its_drain_progress_shown(api, node):
    response = api.put(url(node.id), {"type": "remove", "reason": "fewer nodes"}, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["type"], body["status"], body["requested_by"]) == (
        "remove",
        "in_progress",
        "ops-alice",
    )
    assert body["allowed_delay_seconds"] is None and body["delay_seconds_left"] is None
    assert body["node_out_of_service"] is True
    assert body["drain"]["indices_left"] == 0 and body["drain"]["eta_seconds"] is None
    assert api.get(url(node.id)).json()["drain"] == body["drain"]


def test_a_replace_is_recorded_with_its_target(api, node):
    target = NodeFactory(metadata={"name": "gitlab-zoekt-9"})

    response = api.put(
        url(node.id),
        {"type": "replace", "reason": "bigger volume", "target_node_id": target.id},
        format="json",
    )

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["target_node_id"], body["target_node_name"]) == (target.id, "gitlab-zoekt-9")
    assert body["drain"]["moves_done_on_target"] == 0
    assert NodeShutdown.objects.get().target_node_id == target.id


@pytest.mark.parametrize(
    ("target", "part"),
    [
        pytest.param("itself", "another node", id="itself"),
        pytest.param("restarting", "live shutdown record of its own", id="live-record"),
        pytest.param("drained", "out of service", id="drained"),
        pytest.param("not-search", "not a search node", id="not-a-search-node"),
    ],
)
def test_a_replace_whose_target_cannot_receive_is_a_400_naming_it(api, node, target, part):
    other = NodeFactory()
    if target == "restarting":
        api.put(url(other.id), {"type": "restart", "reason": "x"}, format="json")
    elif target == "drained":
        api.put(url(other.id), {"type": "remove", "reason": "x"}, format="json")
        NodeShutdown.objects.get().transition("complete", clock.now(), status_reason="node_drained")
    elif target == "not-search":
        other.services = [1]
        other.save(update_fields=["services"])
    target_id = node.id if target == "itself" else other.id
    before = records()

    response = api.put(
        url(node.id),
        {"type": "replace", "reason": "x", "target_node_id": target_id},
        format="json",
    )

    assert_error(response, 400, "target_node_id", part)
    assert records() == before


def test_a_replace_whose_target_does_not_exist_is_a_404_naming_it(api, node):
    """As an unknown node anywhere in the operator API (a move's ``to_node_id``, the
    capacity what-if's ``remove``): the request is well formed, the node is missing."""
    missing = NodeFactory().id + 1000
    before = records()

    response = api.put(
        url(node.id),
        {"type": "replace", "reason": "x", "target_node_id": missing},
        format="json",
    )

    assert_error(response, 404, "target_node_id", "not found")
    assert records() == before


def test_a_node_receiving_a_live_replace_is_a_409(api, node):
    target = NodeFactory()
    api.put(
        url(node.id),
        {"type": "replace", "reason": "x", "target_node_id": target.id},
        format="json",
    )
    before = records()

    response = api.put(url(target.id), {"type": "restart", "reason": "y"}, format="json")

    assert_error(response, 409, "node_id", "receives the data of live replace")
    assert records() == before


def test_delete_cancels_a_drain_then_returns_a_drained_node_to_service(api, node, now):
    api.put(url(node.id), {"type": "remove", "reason": "x"}, format="json")
    cancelled = api.delete(url(node.id)).json()
    assert (cancelled["status"], cancelled["cancelled_by"]) == ("cancelled", "ops-alice")
    assert cancelled["details"]["cancel"] == {
        "moves_cancelled": [],
        "moves_parked": [],
        "moves_finishing": [],
    }
    assert cancelled["node_out_of_service"] is False
    api.put(url(node.id), {"type": "remove", "reason": "again"}, format="json")
    NodeShutdown.objects.live().get().transition(
        "complete", clock.now(), status_reason="node_drained"
    )
    assert api.get(url(node.id)).json()["node_out_of_service"] is True
    clock.advance(30)

    returned = api.delete(url(node.id))

    assert returned.status_code == 200, returned.content
    body = returned.json()
    assert (body["status"], body["returned_to_service_by"]) == ("complete", "ops-alice")
    assert body["node_out_of_service"] is False
    assert NodeShutdown.objects.get(pk=body["id"]).returned_to_service_at == clock.now()
    before = records()
    assert_error(api.delete(url(node.id)), 404, "node_id", "no complete drain")
    assert records() == before
