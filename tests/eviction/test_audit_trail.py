"""Eviction's operator actions in the audit trail: a move by hand (the API and
``zoekt_move --to``) and a re-split (the admin's action and ``zoekt_move --resplit``),
each recorded with who, via, from where and the outcome; a refusal with its stable code
and nothing else written."""

from __future__ import annotations

import socket

import pytest
from django.core.management import CommandError, call_command

from tests.eviction.test_manual_moves import fleet, snapshot, url  # noqa: F401
from tests.eviction.test_resplit import fleet as resplit_fleet  # noqa: F401
from zoekt.models import AuditEvent, Move
from zoekt.reasons import Reason

pytestmark = pytest.mark.django_db


def test_a_move_through_the_api_is_recorded(fleet, api):  # noqa: F811
    response = api.post(url(fleet.index.id), {"to_node_id": fleet.dst.id}, format="json")

    assert response.status_code == 201
    event = AuditEvent.objects.get()
    assert (event.event_name, event.via, event.author_name, event.ip_address, event.outcome) == (
        "index_move_requested",
        "api",
        "ops-alice",
        "127.0.0.1",
        "ok",
    )
    assert (event.target_type, event.target_id) == ("index", fleet.index.id)
    assert (event.details["move_id"], event.details["to_node_id"]) == (
        response.json()["move_id"],
        fleet.dst.id,
    )


def test_a_refused_move_through_the_api_is_recorded_with_its_code_and_writes_nothing(
    fleet,  # noqa: F811
    api,
):
    before = snapshot()

    response = api.post(url(fleet.index.id), {"to_node_id": fleet.src.id}, format="json")

    assert response.status_code == 400
    assert snapshot() == before
    event = AuditEvent.objects.get()
    assert (event.event_name, event.outcome, event.reason) == (
        "index_move_requested",
        "refused",
        Reason.MOVE_TARGET_IS_SOURCE,
    )


def test_a_move_by_the_command_is_recorded_with_the_name_and_the_host(fleet):  # noqa: F811
    call_command("zoekt_move", "--index", str(fleet.index.id), "--to", "dst", "--by", "ops-kim")

    event = AuditEvent.objects.get()
    assert (event.event_name, event.via, event.author_name, event.ip_address, event.outcome) == (
        "index_move_requested",
        "command",
        "ops-kim",
        socket.gethostname(),
        "ok",
    )


def test_a_resplit_by_the_command_is_recorded(resplit_fleet):  # noqa: F811
    _hot, _cold, enabled, index = resplit_fleet

    call_command("zoekt_move", "--resplit", str(enabled.root_namespace_id))

    event = AuditEvent.objects.get()
    assert (event.event_name, event.via, event.outcome) == (
        "namespace_resplit_started",
        "command",
        "ok",
    )
    assert (event.target_id, event.details["source_index_id"]) == (
        enabled.root_namespace_id,
        index.id,
    )
    assert event.details["move_id"] == Move.objects.get().id


def test_a_refused_resplit_by_the_command_is_recorded_and_starts_nothing(resplit_fleet):  # noqa: F811
    with pytest.raises(CommandError):
        call_command("zoekt_move", "--resplit", "123456789")

    assert not Move.objects.exists()
    event = AuditEvent.objects.get()
    assert (event.event_name, event.outcome, event.reason, event.target_id) == (
        "namespace_resplit_started",
        "refused",
        "resplit_refused",
        123456789,
    )
    assert "no namespace has this id" in event.details["message"]


def test_a_resplit_from_the_admin_is_recorded(resplit_fleet, admin_client):  # noqa: F811
    _hot, _cold, enabled, _index = resplit_fleet

    admin_client.post(
        "/admin/zoekt/enablednamespace/",
        {"action": "resplit_with_moves", "_selected_action": [enabled.pk]},
    )

    event = AuditEvent.objects.get()
    assert (event.event_name, event.via, event.author_name, event.ip_address, event.outcome) == (
        "namespace_resplit_started",
        "admin",
        "admin",
        "127.0.0.1",
        "ok",
    )
    assert Move.objects.live().count() == 1
