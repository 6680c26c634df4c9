"""The audit trail (``zoekt.audit``, ``AuditEvent``): append-only in the model, the
queryset and the database; and each operator action of the admin and of
``manage.py zoekt_node`` recorded with who, via, from where and the outcome, a refused
one as refused with its reason code and nothing else changed."""

from __future__ import annotations

import socket

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.urls import reverse

from tests.factories import GroupFactory, NodeFactory
from tests.zoekt.test_admin import form_data
from tests.zoekt.test_node_deletion import ready, second_replica, state
from zoekt import app_settings, audit, shutdowns
from zoekt.audit import Action, Actor
from zoekt.models import AppendOnly, AuditEvent, EnabledNamespace, Node, NodeShutdown
from zoekt.operator_errors import ObjectNotFound
from zoekt.reasons import Reason

pytestmark = pytest.mark.django_db

CLIENT_ADDRESS = "127.0.0.1"  # the test client's REMOTE_ADDR


def only_event(**filters) -> AuditEvent:
    """The one event matching ``filters`` (fails on none or several)."""
    return AuditEvent.objects.get(**filters)


def trail() -> list[tuple]:
    return list(AuditEvent.objects.order_by("id").values_list("event_name", "outcome", "via"))


@pytest.fixture
def staff(client):
    user = get_user_model().objects.create_superuser("ops-ivy", password="pw-12345678")
    client.force_login(user)
    client.user = user
    return client


def an_event() -> AuditEvent:
    return audit.record(Actor("ops", "api", "10.0.0.9"), Action.NODE_DELETED)


# --- append-only ---------------------------------------------------------------------------------


def test_a_stored_event_cannot_be_saved_again_and_keeps_its_values(now):
    event = an_event()
    event.author_name = "somebody else"

    with pytest.raises(AppendOnly):
        event.save()

    assert AuditEvent.objects.get().author_name == "ops"


def test_an_event_cannot_be_deleted_one_by_one_or_in_bulk(now):
    event = an_event()

    with pytest.raises(AppendOnly):
        event.delete()
    with pytest.raises(AppendOnly):
        AuditEvent.objects.all().delete()
    with pytest.raises(AppendOnly):
        AuditEvent.objects.update(outcome="error")

    assert list(AuditEvent.objects.values_list("id", "outcome")) == [(event.id, "ok")]


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("UPDATE audit_events SET outcome = 'error'", id="update"),
        pytest.param("DELETE FROM audit_events", id="delete"),
    ],
)
def test_the_database_refuses_an_update_or_a_delete_behind_the_model(now, statement):
    event = an_event()

    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)

    assert list(AuditEvent.objects.values_list("id", "outcome")) == [(event.id, "ok")]


def test_the_admin_shows_events_read_only_and_offers_no_delete(staff, now):
    event = an_event()
    change = reverse("admin:zoekt_auditevent_change", args=[event.id])

    page = staff.get(change)
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert staff.post(change, {"author_name": "x"}).status_code == 403
    delete = staff.post(reverse("admin:zoekt_auditevent_delete", args=[event.id]), {"post": "yes"})
    assert delete.status_code == 403
    assert AuditEvent.objects.get().author_name == "ops"


# --- the recorder --------------------------------------------------------------------------------


def test_an_action_that_fails_unexpectedly_is_recorded_as_an_error_and_the_error_goes_on(now):
    with (
        pytest.raises(ZeroDivisionError),
        audit.audited(Actor("ops", "command", "host-1"), Action.NODE_DELETED),
    ):
        1 / 0  # noqa: B018

    event = AuditEvent.objects.get()
    assert (event.outcome, event.reason, event.via) == ("error", "ZeroDivisionError", "command")


def test_secret_setting_values_never_reach_the_trail():
    changes = audit.changed_values(
        {"zoekt_api_token": "old-secret", "zoekt_trigram_max": 1},
        {"zoekt_api_token": "new-secret", "zoekt_trigram_max": 2},
    )
    assert changes == {
        "zoekt_api_token": {"old": "[hidden]", "new": "[hidden]"},
        "zoekt_trigram_max": {"old": 1, "new": 2},
    }


def test_a_command_actor_is_the_name_given_else_the_os_user_and_the_host():
    named = Actor.command("ops-kim")
    assert (named.name, named.via, named.address) == ("ops-kim", "command", socket.gethostname())
    assert Actor.command().name  # the login, or "command" without one


# --- the admin -----------------------------------------------------------------------------------


def test_changed_settings_are_recorded_with_old_and_new_values(staff, now):
    row = app_settings.load_row()
    url = reverse("admin:zoekt_applicationsetting_change", args=[row.pk])
    data = form_data(staff.get(url), zoekt_trigram_max=row.zoekt_trigram_max + 1)

    response = staff.post(url, data)

    assert response.status_code == 302, response.context["adminform"].form.errors
    event = only_event(event_name="application_settings_updated")
    assert (event.author_name, event.author_id, event.via, event.ip_address, event.outcome) == (
        "ops-ivy",
        staff.user.pk,
        "admin",
        CLIENT_ADDRESS,
        "ok",
    )
    assert event.details["changes"] == {
        "zoekt_trigram_max": {"old": row.zoekt_trigram_max, "new": row.zoekt_trigram_max + 1}
    }
    assert event.details["credential"] == "session"


def test_enabling_changing_and_disabling_a_namespace_in_the_admin_are_recorded(staff, now):
    root = GroupFactory()
    add = reverse("admin:zoekt_enablednamespace_add")
    staff.post(add, {"root_namespace": root.id, "search": "on"})
    enabled = EnabledNamespace.objects.get(root_namespace=root)
    change = reverse("admin:zoekt_enablednamespace_change", args=[enabled.id])
    staff.post(change, {"search": "", "number_of_replicas_override": "2"})
    staff.post(reverse("admin:zoekt_enablednamespace_delete", args=[enabled.id]), {"post": "yes"})

    assert not EnabledNamespace.objects.exists()
    assert trail() == [
        ("namespace_enabled", "ok", "admin"),
        ("namespace_updated", "ok", "admin"),
        ("namespace_disabled", "ok", "admin"),
    ]
    updated = only_event(event_name="namespace_updated")
    assert (updated.target_type, updated.target_id, updated.target_details) == (
        "namespace",
        root.id,
        root.path,
    )
    assert updated.details["changes"] == {
        "search": {"old": True, "new": False},
        "number_of_replicas_override": {"old": None, "new": 2},
    }


def test_a_node_edited_in_the_admin_is_recorded_with_the_field_changed(staff, now):
    node = NodeFactory(metadata={"name": "zoekt-5"})
    url = reverse("admin:zoekt_node_change", args=[node.id])
    data = form_data(staff.get(url))
    data.update(
        usable_storage_bytes_locked_until_0="2030-01-02",
        usable_storage_bytes_locked_until_1="03:04:05",
    )

    response = staff.post(url, data)

    assert response.status_code == 302
    event = only_event(event_name="node_updated")
    assert (event.via, event.author_name, event.target_id, event.target_details) == (
        "admin",
        "ops-ivy",
        node.id,
        "zoekt-5",
    )
    change = event.details["changes"]["usable_storage_bytes_locked_until"]
    assert change["old"] is None and change["new"].startswith("2030-01-02 03:04:05")


@pytest.mark.parametrize(
    ("action", "event_name", "kind"),
    [
        pytest.param("request_restart", "node_shutdown_requested", "restart", id="restart"),
        pytest.param("request_drain", "node_shutdown_requested", "remove", id="drain"),
    ],
)
def test_a_shutdown_requested_from_the_admin_is_recorded(staff, now, action, event_name, kind):
    node = NodeFactory(metadata={"name": "zoekt-7"})

    staff.post(
        reverse("admin:zoekt_node_changelist"), {"action": action, "_selected_action": [node.id]}
    )

    event = only_event(event_name=event_name)
    record = NodeShutdown.objects.get()
    assert (event.via, event.author_name, event.ip_address, event.outcome) == (
        "admin",
        "ops-ivy",
        CLIENT_ADDRESS,
        "ok",
    )
    assert (event.target_type, event.target_id, event.target_details) == (
        "node",
        node.id,
        "zoekt-7",
    )
    assert (event.details["type"], event.details["shutdown_id"]) == (kind, record.id)


def test_a_refused_admin_request_is_recorded_as_refused_and_nothing_else_changes(staff, now):
    node = NodeFactory()
    shutdowns.do_request_node_shutdown(node.id, type="restart", reason="first", requested_by="a")
    before = list(NodeShutdown.objects.values())
    changelist = reverse("admin:zoekt_node_changelist")

    staff.post(changelist, {"action": "request_drain", "_selected_action": [node.id]})

    assert list(NodeShutdown.objects.values()) == before
    refused = only_event(event_name="node_shutdown_requested", via="admin")
    assert (refused.outcome, refused.reason, refused.author_name) == (
        "refused",
        "conflict",
        "ops-ivy",
    )
    assert "already has a live shutdown record" in refused.details["message"]


def test_a_cancel_from_the_admin_is_recorded(staff, now):
    node = NodeFactory()
    shutdowns.do_request_node_shutdown(node.id, type="restart", reason="r", requested_by="a")

    staff.post(
        reverse("admin:zoekt_node_changelist"),
        {"action": "cancel_shutdown", "_selected_action": [node.id]},
    )

    event = only_event(event_name="node_shutdown_cancelled")
    assert (event.via, event.outcome, event.target_id) == ("admin", "ok", node.id)
    assert event.details["returned_to_service"] is False


def test_an_admin_delete_refused_then_forced_is_recorded_once_each(staff, now):
    node = NodeFactory(metadata={"name": "lonely"})
    ready(node)
    url = reverse("admin:zoekt_node_delete", args=[node.id])
    before = state()

    staff.post(url, {"post": "yes"})

    assert state() == before
    refused = only_event(outcome="refused")
    assert (refused.event_name, refused.reason, refused.via, refused.target_id) == (
        "node_deleted",
        Reason.NODE_HOLDS_LAST_COPY,
        "admin",
        node.id,
    )

    staff.post(url, {"post": "yes", "force": "yes"})

    assert not Node.objects.filter(pk=node.id).exists()
    forced = only_event(outcome="ok")
    assert (forced.event_name, forced.target_details, forced.author_name) == (
        "node_force_deleted",
        "lonely",
        "ops-ivy",
    )
    assert len(forced.details["dark_ranges"]) == 1


def test_a_refused_admin_bulk_delete_records_one_refusal_and_deletes_nothing(staff, now):
    safe, other, lonely = NodeFactory(), NodeFactory(), NodeFactory()
    second_replica(ready(safe), other)
    ready(lonely)
    chosen = {"action": "delete_selected", "_selected_action": [safe.id, lonely.id], "post": "yes"}
    before = state()

    staff.post(reverse("admin:zoekt_node_changelist"), chosen)

    assert state() == before
    assert trail() == [("node_deleted", "refused", "admin")]
    assert only_event().details["node_ids"] == sorted([safe.id, lonely.id])


def test_a_node_delete_with_other_copies_is_recorded_as_deleted(staff, now):
    safe, other = NodeFactory(), NodeFactory()
    second_replica(ready(safe), other)

    staff.post(reverse("admin:zoekt_node_delete", args=[safe.id]), {"post": "yes"})

    assert not Node.objects.filter(pk=safe.id).exists()
    assert trail() == [("node_deleted", "ok", "admin")]


# --- the command ---------------------------------------------------------------------------------


def test_the_command_records_a_request_and_a_cancel_with_the_name_and_the_host(now):
    node = NodeFactory(metadata={"name": "zoekt-3"})

    call_command("zoekt_node", "restart", "zoekt-3", "--reason", "kernel", "--by", "ops-kim")
    call_command("zoekt_node", "cancel", "zoekt-3", "--by", "ops-kim")

    assert trail() == [
        ("node_shutdown_requested", "ok", "command"),
        ("node_shutdown_cancelled", "ok", "command"),
    ]
    for event in AuditEvent.objects.all():
        assert (event.author_name, event.ip_address, event.target_id, event.author_id) == (
            "ops-kim",
            socket.gethostname(),
            node.id,
            None,
        )


def test_the_command_records_a_refused_then_a_forced_delete(now):
    node = NodeFactory(metadata={"name": "zoekt-4"})
    ready(node)
    before = state()

    with pytest.raises(CommandError):
        call_command("zoekt_node", "delete", "zoekt-4", "--by", "ops-kim")
    assert state() == before
    call_command("zoekt_node", "delete", "zoekt-4", "--by", "ops-kim", "--force")

    assert trail() == [
        ("node_deleted", "refused", "command"),
        ("node_force_deleted", "ok", "command"),
    ]


def test_a_cancel_with_nothing_to_cancel_is_recorded_as_not_found(now):
    node = NodeFactory()

    with pytest.raises(ObjectNotFound):
        shutdowns.do_cancel_node_shutdown(node.id, cancelled_by="ops", actor=Actor.command("ops"))

    event = only_event()
    assert (event.event_name, event.outcome, event.reason) == (
        "node_shutdown_cancelled",
        "refused",
        "not_found",
    )
    assert not NodeShutdown.objects.exists()
