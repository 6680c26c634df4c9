"""Node shutdown records: one live record per node (the database's rule), a transition
table that refuses what it does not list, history kept, and ``manage.py zoekt_node``."""

from __future__ import annotations

import getpass
import json
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from django.urls import reverse

from tests.factories import NodeFactory
from zoekt import clock, shutdowns
from zoekt.models import IllegalTransition, NodeShutdown

pytestmark = pytest.mark.django_db

Status = NodeShutdown.Status


def record_for(node, **fields) -> NodeShutdown:
    now = clock.now()
    values = {
        "node": node,
        "node_ref": node.id,
        "node_name": node.name,
        "type": "restart",
        "reason": "upgrade",
        "requested_by": "ops",
        "allowed_delay_seconds": 1800,
        "delay_expires_at": now + timedelta(seconds=1800),
        **fields,
    }
    return NodeShutdown.objects.create(**values)


def rows() -> list[dict]:
    return list(NodeShutdown.objects.order_by("id").values())


# --- one live record per node ------------------------------------------------------------------


@pytest.mark.parametrize("second", [Status.IN_PROGRESS, Status.STALLED], ids=lambda s: str(s))
def test_the_database_refuses_a_second_live_record_for_a_node(now, second):
    node = NodeFactory()
    record_for(node)
    before = rows()

    with pytest.raises(IntegrityError), transaction.atomic():
        record_for(node, status=second)

    assert rows() == before


def test_finished_records_are_kept_beside_a_new_live_one(now):
    node = NodeFactory()
    record_for(node).transition(Status.COMPLETE, now, status_reason="node_returned")
    record_for(node).transition(Status.CANCELLED, now, cancelled_by="ops")

    record_for(node)

    assert sorted(NodeShutdown.objects.values_list("status", flat=True)) == [
        "cancelled",
        "complete",
        "in_progress",
    ]


def test_two_nodes_each_have_their_own_live_record(now):
    record_for(NodeFactory())
    record_for(NodeFactory())
    assert NodeShutdown.objects.live().count() == 2


# --- the transition table ----------------------------------------------------------------------


def test_a_legal_transition_writes_the_status_and_stamps_its_time(now):
    record = record_for(NodeFactory())
    clock.advance(90)

    record.transition(Status.COMPLETE, clock.now(), status_reason="node_returned")

    stored = NodeShutdown.objects.get(pk=record.pk)
    assert (stored.status, stored.status_reason) == ("complete", "node_returned")
    assert stored.completed_at == now + timedelta(seconds=90)


@pytest.mark.parametrize(
    ("first", "then"),
    [
        pytest.param(Status.COMPLETE, Status.IN_PROGRESS, id="complete-to-in-progress"),
        pytest.param(Status.COMPLETE, Status.CANCELLED, id="complete-to-cancelled"),
        pytest.param(Status.CANCELLED, Status.COMPLETE, id="cancelled-to-complete"),
    ],
)
def test_an_illegal_transition_raises_and_writes_nothing(now, first, then):
    record = record_for(NodeFactory())
    record.transition(first, now, cancelled_by="ops")
    before = rows()

    with pytest.raises(IllegalTransition):
        NodeShutdown.objects.get(pk=record.pk).transition(then, now)

    assert rows() == before


def test_a_record_outlives_its_node(now):
    node = NodeFactory()
    node_id, name = node.id, node.name
    record = record_for(node)
    record.transition(Status.COMPLETE, now, status_reason="restart_delay_expired")

    node.delete()

    stored = NodeShutdown.objects.get(pk=record.pk)
    assert (stored.node_id, stored.node_ref, stored.node_name) == (None, node_id, name)


# --- manage.py zoekt_node ----------------------------------------------------------------------


def run(*args) -> str:
    out = StringIO()
    call_command("zoekt_node", *args, stdout=out)
    return out.getvalue()


def test_the_cli_restarts_a_node_by_name_with_the_operator_and_delay(now):
    node = NodeFactory(metadata={"name": "gitlab-zoekt-1"})

    out = run("restart", "gitlab-zoekt-1", "--reason", "kernel update", "--delay", "900")

    record = NodeShutdown.objects.get()
    assert (record.node_id, record.reason, record.allowed_delay_seconds) == (
        node.id,
        "kernel update",
        900,
    )
    assert record.requested_by == getpass.getuser()
    assert "restart of node" in out and "in_progress" in out


def test_the_cli_shows_status_and_cancels_by_id_recording_the_operator(now):
    node = NodeFactory()
    run("restart", str(node.id), "--reason", "reboot", "--by", "ops-bob")

    status = run("status", str(node.id))
    assert "in_progress" in status and "requested by ops-bob" in status
    out = run("cancel", str(node.id), "--by", "ops-carol")

    record = NodeShutdown.objects.get()
    assert (record.requested_by, record.status, record.cancelled_by) == (
        "ops-bob",
        "cancelled",
        "ops-carol",
    )
    assert "cancelled by: ops-carol" in out


def test_the_cli_drains_and_replaces_with_the_target_by_name_and_shows_the_progress(now):
    drained = NodeFactory(metadata={"name": "gitlab-zoekt-3"})
    NodeFactory(metadata={"name": "gitlab-zoekt-4"})
    fresh = NodeFactory(metadata={"name": "gitlab-zoekt-5"})

    out = run("replace", "gitlab-zoekt-3", "--to", "gitlab-zoekt-5", "--reason", "bigger disk")

    record = NodeShutdown.objects.get()
    assert (record.type, record.node_id, record.target_node_id, record.reason) == (
        "replace",
        drained.id,
        fresh.id,
        "bigger disk",
    )
    assert record.allowed_delay_seconds is None and record.delay_expires_at is None
    assert f"target node: {fresh.id} (gitlab-zoekt-5)" in out
    status = run("status", "gitlab-zoekt-3")
    assert "drain: 0 indices left on the node (0 to move, 0\xa0bytes)" in status
    assert "rate: not measured yet (no move done)" in status
    as_json = json.loads(run("status", "gitlab-zoekt-3", "--json"))
    assert as_json["drain"]["indices_left"] == 0 and as_json["node_out_of_service"] is True
    run("cancel", "gitlab-zoekt-3", "--by", "ops-kim")
    out = run("remove", "gitlab-zoekt-3", "--reason", "fewer nodes", "--by", "ops-kim")
    assert "remove of node" in out and "in_progress" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("replace", "{id}", "--reason", "x", "--to", "nope"), "target_node_id"),
        pytest.param(("replace", "{id}", "--reason", "x", "--to", "{id}"), "another node"),
        pytest.param(("remove", "{id}"), "--reason"),
    ],
)
def test_the_cli_refuses_a_bad_drain_and_writes_nothing(now, args, message):
    node = NodeFactory()
    with pytest.raises(CommandError, match=message):
        run(*(arg.format(id=node.id) for arg in args))
    assert rows() == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("restart", "nope", "--reason", "x"), "not found", id="unknown-node"),
        pytest.param(("restart", "{id}", "--reason", " "), "reason", id="blank-reason"),
        pytest.param(("restart", "{id}", "--reason", "x", "--delay", "0"), "allowed_delay", id="0"),
        pytest.param(("cancel", "{id}"), "no live shutdown record", id="nothing-to-cancel"),
        pytest.param(("status", "{id}"), "no shutdown record", id="no-status"),
    ],
)
def test_the_cli_refuses_bad_requests_and_writes_nothing(now, args, message):
    node = NodeFactory()
    with pytest.raises(CommandError, match=message):
        run(*(arg.format(id=node.id) for arg in args))
    assert rows() == []


def test_the_cli_refuses_a_second_live_record(now):
    node = NodeFactory()
    run("restart", str(node.id), "--reason", "first")
    before = rows()
    with pytest.raises(CommandError, match="already has a live shutdown record"):
        run("restart", str(node.id), "--reason", "second")
    assert rows() == before


# --- the admin ---------------------------------------------------------------------------------


def test_the_admin_actions_request_and_cancel_as_the_signed_in_operator(client, now):
    user = get_user_model().objects.create_superuser("ops-dana", password="pw-12345678")
    client.force_login(user)
    node = NodeFactory()
    changelist = reverse("admin:zoekt_node_changelist")

    client.post(changelist, {"action": "request_restart", "_selected_action": [node.id]})
    record = NodeShutdown.objects.get()
    assert (record.type, record.requested_by, record.status) == (
        "restart",
        "ops-dana",
        "in_progress",
    )

    client.post(changelist, {"action": "cancel_shutdown", "_selected_action": [node.id]})
    record.refresh_from_db()
    assert (record.status, record.cancelled_by) == ("cancelled", "ops-dana")

    client.post(changelist, {"action": "request_drain", "_selected_action": [node.id]})
    drain = NodeShutdown.objects.live().get()
    assert (drain.type, drain.requested_by) == ("remove", "ops-dana")

    page = client.get(reverse("admin:zoekt_nodeshutdown_changelist"))
    assert page.status_code == 200
    assert node.name.encode() in page.content


def test_describe_gives_the_seconds_left_only_while_live(now):
    record = record_for(NodeFactory())
    clock.advance(100)
    assert shutdowns.describe(record)["delay_seconds_left"] == 1700
    record.transition(Status.CANCELLED, clock.now(), cancelled_by="ops")
    assert shutdowns.describe(record)["delay_seconds_left"] is None
