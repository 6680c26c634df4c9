"""The dashboard's Audit page: the audit trail newest first, filtered by action, via,
outcome, who and a time range, a page at a time; a filter value it cannot read is a 400
naming the field, and lists nothing."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard.readmodels.audit import AuditFilters, audit_page
from tests.dashboard.test_pages import cell, page_text, row_html
from zoekt import audit, clock
from zoekt.audit import Action, Actor, Target
from zoekt.models import AuditEvent

pytestmark = pytest.mark.django_db

URL = "/admin/dashboard/audit/"


@pytest.fixture
def events(now):
    """Three actions an hour apart: alice's restart (admin), bob's refused move (api),
    then carol's forced delete (command)."""
    alice = audit.record(
        Actor("alice", "admin", "10.0.0.1", user_id=1),
        Action.NODE_SHUTDOWN_REQUESTED,
        target=Target("node", 7, "zoekt-7"),
        details={"type": "restart"},
    )
    clock.advance(3600)
    bob = audit.record(
        Actor("bob", "api", "10.0.0.2", user_id=2),
        Action.INDEX_MOVE_REQUESTED,
        target=Target("index", 42),
        outcome="refused",
        reason="move_target_is_source",
    )
    clock.advance(3600)
    carol = audit.record(
        Actor("carol", "command", "ops-host"),
        Action.NODE_FORCE_DELETED,
        target=Target("node", 8, "zoekt-8"),
    )
    return alice, bob, carol


def shown(response) -> list[int]:
    html = response.content.decode()
    return [int(i) for i in re.findall(r'data-audit-event-id="(\d+)"', html)]


def test_the_page_lists_every_action_newest_first_with_who_via_where_and_outcome(
    admin_client, events
):
    alice, bob, carol = events

    response = admin_client.get(URL)

    assert response.status_code == 200
    assert shown(response) == [carol.id, bob.id, alice.id]
    row = row_html(response, "data-audit-event-id", bob.id)
    assert (cell(row, "who"), cell(row, "via"), cell(row, "address")) == ("bob", "api", "10.0.0.2")
    assert cell(row, "outcome") == "refused move_target_is_source"
    assert "Audit" in page_text(response)
    assert reverse("dashboard-audit") == URL


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        pytest.param("action=node_force_deleted", ["carol"], id="action"),
        pytest.param("via=admin", ["alice"], id="via"),
        pytest.param("outcome=refused", ["bob"], id="outcome"),
        pytest.param("who=CAR", ["carol"], id="who-in-part-any-case"),
        pytest.param("since=2026-01-01", ["carol", "bob", "alice"], id="since-a-day"),
        pytest.param("until=2020-01-01", [], id="until-a-day-before-all"),
        pytest.param("via=command&who=alice", [], id="filters-combine"),
    ],
)
def test_each_filter_narrows_the_list(admin_client, events, query, expected):
    names = {event.id: event.author_name for event in events}

    response = admin_client.get(f"{URL}?{query}")

    assert response.status_code == 200
    assert [names[i] for i in shown(response)] == expected


def test_a_time_range_keeps_the_events_inside_it(admin_client, events):
    _alice, bob, _carol = events
    since = (bob.created_at - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    until = (bob.created_at + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")

    response = admin_client.get(f"{URL}?since={since}&until={until}")

    assert shown(response) == [bob.id]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        pytest.param("action=drop_everything", "action", id="unknown-action"),
        pytest.param("via=telnet", "via", id="unknown-via"),
        pytest.param("outcome=maybe", "outcome", id="unknown-outcome"),
        pytest.param("since=yesterday", "since", id="unreadable-since"),
        pytest.param("until=2026-13-45", "until", id="impossible-until"),
    ],
)
def test_a_bad_filter_value_is_a_400_naming_the_field_and_lists_nothing(
    admin_client, events, query, field
):
    response = admin_client.get(f"{URL}?{query}")

    assert response.status_code == 400
    error = page_text(response)
    assert f"The {field} " in error
    assert shown(response) == []
    assert AuditEvent.objects.count() == 3


def test_the_page_is_paginated_and_its_links_keep_the_filters(admin_client, now):
    for n in range(3):
        audit.record(Actor(f"ops-{n}", "api"), Action.NODE_DELETED)
        clock.advance(1)
    audit.record(Actor("other", "admin"), Action.NODE_DELETED)

    first = audit_page(AuditFilters(via="api"), page=1, per_page=2)
    second = audit_page(AuditFilters(via="api"), page=2, per_page=2)

    assert [e.author_name for e in first.rows] == ["ops-2", "ops-1"]
    assert [e.author_name for e in second.rows] == ["ops-0"]
    assert first.filters.query() == "via=api"


def test_the_read_model_costs_two_queries_whatever_the_number_of_events(now):
    for n in range(30):
        audit.record(Actor(f"ops-{n}", "api"), Action.NODE_DELETED)

    with CaptureQueriesContext(connection) as queries:
        audit_page(AuditFilters(action="node_deleted", who="ops"))

    assert len(queries) == 2


def test_a_non_staff_user_is_sent_to_the_login(client, events):
    response = client.get(URL)
    assert response.status_code == 302 and "login" in response["Location"]
