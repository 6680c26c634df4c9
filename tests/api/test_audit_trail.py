"""The operator API's actions in the audit trail: each recorded once, ``via`` api, with the
token's user, the client address and the outcome; a refused one as refused with nothing
else changed. The operator tokens' creation and revocation, through the admin's token page
and ``manage.py zoekt_token``, recorded without the key."""

from __future__ import annotations

import socket

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.api.helpers import set_app_setting
from tests.api.test_operator_api import make_user
from tests.factories import EnabledNamespaceFactory, GroupFactory, NodeFactory, ProjectFactory
from zoekt.models import AuditEvent, EnabledNamespace, NodeShutdown

pytestmark = pytest.mark.django_db

ADMIN = "/api/v4/admin/zoekt"
CLIENT_ADDRESS = "127.0.0.1"


@pytest.fixture
def operator():
    return make_user("ops-alice", staff=True)


@pytest.fixture
def api(operator, now) -> APIClient:
    set_app_setting(zoekt_indexing_enabled=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=operator).key}")
    return client


def the_event(operator, event_name: str, outcome: str = "ok") -> AuditEvent:
    """The one event of that action, checked for the API's who, via and address."""
    event = AuditEvent.objects.get(event_name=event_name)
    assert (event.author_name, event.author_id, event.via, event.ip_address, event.outcome) == (
        "ops-alice",
        operator.pk,
        "api",
        CLIENT_ADDRESS,
        outcome,
    )
    assert event.details["credential"] == "token"
    return event


def test_indexing_a_project_is_recorded_with_its_job_id(api, operator):
    project = ProjectFactory()

    response = api.put(f"{ADMIN}/projects/{project.id}/index")

    assert response.status_code == 200
    event = the_event(operator, "project_index_requested")
    assert (event.target_type, event.target_id) == ("project", project.id)
    assert event.details["job_id"] == response.json()["job_id"]


def test_enabling_updating_and_disabling_a_namespace_are_recorded(api, operator):
    root = GroupFactory()

    assert api.put(f"{ADMIN}/shards/0/indexed_namespaces/{root.id}").status_code == 200
    assert api.put(f"{ADMIN}/shards/0/indexed_namespaces/{root.id}?search=false").status_code == 200
    patched = api.patch(
        f"{ADMIN}/namespaces/{root.id}", {"number_of_replicas_override": 3}, format="json"
    )
    assert patched.status_code == 200, patched.content
    assert api.delete(f"{ADMIN}/shards/0/indexed_namespaces/{root.id}").status_code == 204

    assert list(AuditEvent.objects.order_by("id").values_list("event_name", flat=True)) == [
        "namespace_enabled",
        "namespace_updated",
        "namespace_updated",
        "namespace_disabled",
    ]
    enabled = the_event(operator, "namespace_enabled")
    assert (enabled.target_type, enabled.target_id, enabled.target_details) == (
        "namespace",
        root.id,
        root.path,
    )
    assert enabled.details["enabled_namespace_created"] is True
    search_off, override = AuditEvent.objects.filter(event_name="namespace_updated").order_by("id")
    assert search_off.details["changes"] == {"search": {"old": True, "new": False}}
    assert override.details["changes"] == {"number_of_replicas_override": {"old": None, "new": 3}}
    the_event(operator, "namespace_disabled")


def test_enabling_an_unknown_namespace_is_recorded_as_refused_and_writes_nothing(api, operator):
    response = api.put(f"{ADMIN}/shards/0/indexed_namespaces/987654")

    assert response.status_code == 404
    assert not EnabledNamespace.objects.exists()
    event = the_event(operator, "namespace_enabled", outcome="refused")
    assert (event.reason, event.target_id) == ("not_found", 987654)


def test_a_shutdown_request_and_its_cancel_are_recorded(api, operator):
    node = NodeFactory(metadata={"name": "zoekt-9"})

    put = api.put(
        f"/api/v1/nodes/{node.id}/shutdown", {"type": "restart", "reason": "kernel"}, format="json"
    )
    assert put.status_code == 201
    assert api.delete(f"/api/v1/nodes/{node.id}/shutdown").status_code == 200

    requested = the_event(operator, "node_shutdown_requested")
    assert (requested.target_id, requested.target_details) == (node.id, "zoekt-9")
    assert requested.details["request_reason"] == "kernel"
    cancelled = the_event(operator, "node_shutdown_cancelled")
    assert cancelled.details["shutdown_id"] == put.json()["id"]


def test_a_second_request_is_recorded_as_refused_and_the_first_stands(api, operator):
    node = NodeFactory()
    body = {"type": "remove", "reason": "decommission"}
    api.put(f"/api/v1/nodes/{node.id}/shutdown", body, format="json")
    before = list(NodeShutdown.objects.values())

    response = api.put(f"/api/v1/nodes/{node.id}/shutdown", body, format="json")

    assert response.status_code == 409
    assert list(NodeShutdown.objects.values()) == before
    refused = AuditEvent.objects.get(outcome="refused")
    assert (refused.event_name, refused.reason, refused.via) == (
        "node_shutdown_requested",
        "conflict",
        "api",
    )


# --- operator tokens -----------------------------------------------------------------------------


@pytest.fixture
def staff(client):
    user = get_user_model().objects.create_superuser("ops-ivy", password="pw-12345678")
    client.force_login(user)
    return client


def test_a_token_created_and_revoked_in_the_admin_is_recorded_without_its_key(staff, now):
    dev = make_user("deploy-bot", staff=True)

    staff.post(reverse("admin:authtoken_tokenproxy_add"), {"user": dev.pk})
    key = Token.objects.get(user=dev).key
    staff.post(reverse("admin:authtoken_tokenproxy_delete", args=[dev.pk]), {"post": "yes"})

    assert not Token.objects.filter(user=dev).exists()
    created, revoked = AuditEvent.objects.order_by("id")
    assert (created.event_name, revoked.event_name) == (
        "operator_token_created",
        "operator_token_revoked",
    )
    for event in (created, revoked):
        assert (event.via, event.author_name, event.outcome, event.ip_address) == (
            "admin",
            "ops-ivy",
            "ok",
            CLIENT_ADDRESS,
        )
        assert (event.target_type, event.target_id, event.target_details) == (
            "user",
            dev.pk,
            "deploy-bot",
        )
        assert key not in str(event.details)


def test_the_token_command_creates_and_revokes_and_records_both(now, capsys):
    dev = make_user("deploy-bot", staff=True)

    call_command("zoekt_token", "create", "deploy-bot", "--by", "ops-kim")
    key = capsys.readouterr().out.strip()
    assert Token.objects.get(user=dev).key == key
    call_command("zoekt_token", "revoke", "deploy-bot", "--by", "ops-kim")

    assert not Token.objects.exists()
    events = list(AuditEvent.objects.order_by("id"))
    assert [(e.event_name, e.outcome, e.via) for e in events] == [
        ("operator_token_created", "ok", "command"),
        ("operator_token_revoked", "ok", "command"),
    ]
    assert {(e.author_name, e.ip_address) for e in events} == {("ops-kim", socket.gethostname())}
    assert all(key not in str(e.details) for e in events)


def test_a_second_token_for_a_user_is_refused_recorded_and_the_first_kept(now):
    dev = make_user("deploy-bot", staff=True)
    first = Token.objects.create(user=dev)

    with pytest.raises(CommandError, match="has a token already"):
        call_command("zoekt_token", "create", "deploy-bot", "--by", "ops-kim")

    assert list(Token.objects.values_list("key", flat=True)) == [first.key]
    event = AuditEvent.objects.get()
    assert (event.event_name, event.outcome, event.reason) == (
        "operator_token_created",
        "refused",
        "rejected",
    )


def test_an_enabled_namespace_elsewhere_is_left_alone_by_a_disable(api, operator):
    other = EnabledNamespaceFactory()
    root = GroupFactory()
    api.put(f"{ADMIN}/shards/0/indexed_namespaces/{root.id}")

    api.delete(f"{ADMIN}/shards/0/indexed_namespaces/{root.id}")

    assert list(EnabledNamespace.objects.values_list("id", flat=True)) == [other.id]
    assert the_event(operator, "namespace_disabled").target_id == root.id
