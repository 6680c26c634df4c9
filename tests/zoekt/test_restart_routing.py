"""Search prefers other copies of each range while a node is being restarted.

A node with a live restart record within its allowed delay is asked only
where nothing else covers a range (``cover_avoiding``), and only while it is
searchable as any node must be; the query count does not grow.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.api.test_search_targets import ready_replica, search_node
from tests.factories import EnabledNamespaceFactory
from zoekt import app_settings, clock, shutdowns
from zoekt.models import Node
from zoekt.search_targets import Span, cover, cover_avoiding, search_targets

pytestmark = pytest.mark.django_db


def restart(node) -> None:
    shutdowns.do_request_node_shutdown(
        node.id, type="restart", reason="upgrade", requested_by="ops"
    )


def routed(enabled) -> list[tuple[str, int | None, int | None]]:
    answer = search_targets(enabled.root_namespace_id)
    return [
        (t.node_name, i.project_namespace_id_from, i.project_namespace_id_to)
        for t in answer.targets
        for i in t.indices
    ]


@pytest.fixture
def enabled(now):
    return EnabledNamespaceFactory()


def test_search_goes_to_the_other_replica_while_the_first_ones_node_restarts(enabled):
    first, second = search_node("zoekt-a"), search_node("zoekt-b")
    ready_replica(enabled, first)  # the lower replica id: GitLab's choice
    ready_replica(enabled, second)
    assert routed(enabled) == [("zoekt-a", None, None)]

    restart(first)

    assert routed(enabled) == [("zoekt-b", None, None)]


def test_the_restarting_node_is_asked_only_for_the_range_nothing_else_covers(enabled):
    first, second = search_node("zoekt-a"), search_node("zoekt-b")
    ready_replica(enabled, first)  # the whole range
    ready_replica(enabled, search_node("zoekt-c"), second)  # ..1000 on c, 1001.. on b
    restart(first)
    # c's node is gone from search: only b covers 1001.. besides the restarting a.
    Node.objects.filter(metadata__name="zoekt-c").update(last_seen_at=clock.EPOCH)

    assert routed(enabled) == [("zoekt-a", None, 1000), ("zoekt-b", 1001, None)]


def test_a_restarting_node_with_the_only_copy_still_serves_while_searchable(enabled):
    only = search_node("zoekt-a")
    ready_replica(enabled, only)

    restart(only)

    assert routed(enabled) == [("zoekt-a", None, None)]


def test_once_the_restart_is_cancelled_the_usual_choice_returns(enabled):
    first, second = search_node("zoekt-a"), search_node("zoekt-b")
    ready_replica(enabled, first)
    ready_replica(enabled, second)
    restart(first)

    shutdowns.do_cancel_node_shutdown(first.id, cancelled_by="ops")

    assert routed(enabled) == [("zoekt-a", None, None)]


def test_a_restart_costs_search_routing_no_extra_query(enabled):
    first, second = search_node("zoekt-a"), search_node("zoekt-b")
    ready_replica(enabled, first)
    ready_replica(enabled, second)
    app_settings.current()
    with CaptureQueriesContext(connection) as before:
        search_targets(enabled.root_namespace_id)
    restart(first)
    with CaptureQueriesContext(connection) as during:
        search_targets(enabled.root_namespace_id)
    assert len(during) == len(before)


# --- cover_avoiding, pure ----------------------------------------------------------------------


def span(index_id, replica_id, node_id, low=None, high=None) -> Span:
    return Span(index_id, replica_id, node_id, low, high)


def ids(pieces) -> list[tuple[int, int | None, int | None]]:
    return [
        (p.span.index_id, p.project_namespace_id_from, p.project_namespace_id_to) for p in pieces
    ]


@pytest.mark.parametrize(
    ("spans", "avoid", "expected"),
    [
        pytest.param(
            [span(1, 1, 10), span(2, 2, 20)], {10}, [(2, None, None)], id="another-replica"
        ),
        pytest.param(
            [span(1, 1, 10), span(2, 2, 20, 501, None)],
            {10},
            [(1, None, 500), (2, 501, None)],
            id="avoided-only-where-nothing-else",
        ),
        pytest.param(
            [span(1, 1, 10), span(2, 2, 20, None, 100), span(3, 2, 30, 300, None)],
            {10},
            [(2, None, 100), (1, 101, 299), (3, 300, None)],
            id="a-gap-in-the-middle",
        ),
        pytest.param([span(1, 1, 10)], {10}, [(1, None, None)], id="the-only-copy"),
        pytest.param(
            [span(1, 1, 10), span(2, 2, 20)], set(), [(1, None, None)], id="nothing-avoided"
        ),
    ],
)
def test_cover_avoiding_asks_avoided_nodes_only_for_what_nothing_else_covers(
    spans, avoid, expected
):
    assert ids(cover_avoiding(spans, avoid)) == expected


def test_cover_avoiding_without_a_cover_is_none():
    assert cover_avoiding([span(1, 1, 10, 5, None)], {10}) is None
    assert cover([span(1, 1, 10, 5, None)]) is None
