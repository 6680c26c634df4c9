"""GET /api/v1/namespaces/<root_namespace_id>/search_targets: where a search fans out to.

Staff only; routed by coverage: ready indices on searchable nodes that
cover every project, exactly one for each id (the lowest-id replica that
covers alone first); an empty list and a reason code when there is none.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token

from tests.conftest import NOW
from tests.factories import (
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ReplicaFactory,
)
from zoekt import app_settings
from zoekt.models import EnabledNamespace, Index, Node, Replica
from zoekt.search_targets import dark_namespaces, search_targets, search_targets_many

pytestmark = pytest.mark.django_db

READY = Index.State.READY


def targets_url(namespace_id) -> str:
    return f"/api/v1/namespaces/{namespace_id}/search_targets"


WEBSERVER_SEEN = NOW - timedelta(seconds=5)


def process_metrics() -> dict:
    return {"restarts_15m": 0, "mmap_current": 10, "mmap_max": 1000}


def healthy_metadata(name: str, **changes) -> dict:
    """A 1.16 node whose processes are fine."""
    return {
        "name": name,
        "version": "v1.16.2",
        "process_health": {"indexer": process_metrics(), "webserver": process_metrics()},
        **changes,
    }


def search_node(name: str, **kwargs) -> Node:
    """A healthy search node whose webserver reported 5 s ago."""
    kwargs.setdefault("webserver_last_seen_at", WEBSERVER_SEEN)
    return NodeFactory(
        metadata=healthy_metadata(name),
        search_base_url=f"http://{name}:6070",
        **kwargs,
    )


def mmap_exhausted_node(name: str) -> Node:
    node = search_node(name)
    node.metadata["process_health"]["webserver"].update(mmap_current=1000, mmap_max=1000)
    node.save()
    return node


def ready_replica(enabled: EnabledNamespace, *nodes: Node, state=Replica.State.READY) -> Replica:
    """A replica with one ready index per node, splitting ids 1..1000 and 1001.. between them."""
    replica = ReplicaFactory(zoekt_enabled_namespace=enabled, state=state)
    for position, node in enumerate(nodes):
        ranges = {}
        if len(nodes) > 1:
            ranges = {
                "project_namespace_id_from": None if position == 0 else position * 1000 + 1,
                "project_namespace_id_to": None if position == len(nodes) - 1 else 1000,
            }
        IndexFactory(zoekt_replica=replica, zoekt_node=node, state=READY, metadata=ranges)
    return replica


def get(client, namespace_id) -> dict:
    response = client.get(targets_url(namespace_id))
    assert response.status_code == 200, response.content
    return response.json()


def assert_no_targets(body: dict, namespace_id: int, reason: str) -> None:
    assert body == {
        "namespace_id": namespace_id,
        "search_enabled": False,
        "targets": [],
        "reason": reason,
    }


@pytest.fixture
def enabled(now) -> EnabledNamespace:
    return EnabledNamespaceFactory()


# --- authentication ----------------------------------------------------------------------------


def test_anonymous_callers_are_refused(enabled):
    response = Client().get(targets_url(enabled.root_namespace_id))
    assert response.status_code in (401, 403)
    assert "targets" not in response.json()
    assert set(response.json()) == {"error", "errors"}


def test_users_who_are_not_staff_are_refused(enabled, django_user_model):
    user = django_user_model.objects.create_user("dev", password="x")
    client = Client()
    client.force_login(user)
    response = client.get(targets_url(enabled.root_namespace_id))
    assert response.status_code == 403
    assert "targets" not in response.json()


def test_a_staff_token_is_accepted(enabled, django_user_model):
    staff = django_user_model.objects.create_user("ops", password="x", is_staff=True)
    token = Token.objects.create(user=staff)
    response = Client().get(
        targets_url(enabled.root_namespace_id), HTTP_AUTHORIZATION=f"Token {token.key}"
    )
    assert response.status_code == 200
    assert response.json()["reason"] == "no_ready_replica"


def test_a_token_of_a_user_who_is_not_staff_is_refused(enabled, django_user_model):
    user = django_user_model.objects.create_user("dev", password="x")
    token = Token.objects.create(user=user)
    response = Client().get(
        targets_url(enabled.root_namespace_id), HTTP_AUTHORIZATION=f"Token {token.key}"
    )
    assert response.status_code == 403


# --- the happy path ----------------------------------------------------------------------------


def test_a_two_index_replica_lists_both_nodes_and_their_ranges(admin_client, enabled):
    first, second = search_node("zoekt-a"), search_node("zoekt-b")
    replica = ready_replica(enabled, first, second)
    index_a, index_b = replica.indices.order_by("zoekt_node_id")

    body = get(admin_client, enabled.root_namespace_id)

    assert body == {
        "namespace_id": enabled.root_namespace_id,
        "search_enabled": True,
        "targets": [
            {
                "node_id": first.id,
                "node_name": "zoekt-a",
                "search_base_url": "http://zoekt-a:6070",
                "replica_id": replica.id,
                "indices": [
                    {
                        "index_id": index_a.id,
                        "project_namespace_id_from": None,
                        "project_namespace_id_to": 1000,
                    }
                ],
            },
            {
                "node_id": second.id,
                "node_name": "zoekt-b",
                "search_base_url": "http://zoekt-b:6070",
                "replica_id": replica.id,
                "indices": [
                    {
                        "index_id": index_b.id,
                        "project_namespace_id_from": 1001,
                        "project_namespace_id_to": None,
                    }
                ],
            },
        ],
        "reason": None,
    }


def test_an_index_covering_the_whole_namespace_has_open_ranges(admin_client, enabled):
    ready_replica(enabled, search_node("zoekt-a"))
    (target,) = get(admin_client, enabled.root_namespace_id)["targets"]
    assert target["indices"][0]["project_namespace_id_from"] is None
    assert target["indices"][0]["project_namespace_id_to"] is None


def test_of_two_good_replicas_the_lowest_id_is_chosen(admin_client, enabled):
    first = ready_replica(enabled, search_node("zoekt-a"))
    ready_replica(enabled, search_node("zoekt-b"))
    body = get(admin_client, enabled.root_namespace_id)
    assert [t["replica_id"] for t in body["targets"]] == [first.id]


def test_a_replica_with_a_non_ready_index_is_not_chosen(admin_client, enabled):
    half_ready = ready_replica(enabled, search_node("zoekt-a"), search_node("zoekt-b"))
    Index.objects.filter(zoekt_replica=half_ready, zoekt_node__metadata__name="zoekt-b").update(
        state=Index.State.INITIALIZING
    )
    complete = ready_replica(enabled, search_node("zoekt-c"))

    body = get(admin_client, enabled.root_namespace_id)

    assert body["reason"] is None
    assert {t["replica_id"] for t in body["targets"]} == {complete.id}
    assert [t["node_name"] for t in body["targets"]] == ["zoekt-c"]


def test_the_second_replica_is_chosen_when_the_first_has_an_unsearchable_node(
    admin_client, enabled
):
    first = ready_replica(enabled, search_node("zoekt-a"), mmap_exhausted_node("zoekt-b"))
    second = ready_replica(enabled, search_node("zoekt-c"), search_node("zoekt-d"))
    assert first.id < second.id

    body = get(admin_client, enabled.root_namespace_id)

    assert body["search_enabled"] is True
    assert {t["replica_id"] for t in body["targets"]} == {second.id}
    assert [t["node_name"] for t in body["targets"]] == ["zoekt-c", "zoekt-d"]


def test_an_unhealthy_node_still_serves_while_an_online_node_runs_an_old_version(
    admin_client, enabled
):
    replica = ready_replica(enabled, mmap_exhausted_node("zoekt-a"))
    NodeFactory(
        metadata=healthy_metadata("zoekt-old", version="v1.15.9"),
        webserver_last_seen_at=WEBSERVER_SEEN,
    )
    body = get(admin_client, enabled.root_namespace_id)
    assert {t["replica_id"] for t in body["targets"]} == {replica.id}


# --- every reason -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "namespace_id",
    [
        pytest.param(987_654_321, id="unknown-id"),
        pytest.param(2**70, id="beyond-bigint"),
    ],
)
def test_an_unknown_namespace_is_not_enabled(admin_client, now, namespace_id):
    assert_no_targets(get(admin_client, namespace_id), namespace_id, "namespace_not_enabled")


def test_a_namespace_that_exists_but_is_not_enabled_is_not_enabled(admin_client, now):
    group = GroupFactory()
    assert_no_targets(get(admin_client, group.id), group.id, "namespace_not_enabled")


def test_a_namespace_with_search_off_is_search_disabled(admin_client, enabled):
    ready_replica(enabled, search_node("zoekt-a"))
    EnabledNamespace.objects.filter(pk=enabled.pk).update(search=False)
    assert_no_targets(
        get(admin_client, enabled.root_namespace_id), enabled.root_namespace_id, "search_disabled"
    )


def test_a_namespace_without_replicas_has_no_ready_replica(admin_client, enabled):
    assert_no_targets(
        get(admin_client, enabled.root_namespace_id), enabled.root_namespace_id, "no_ready_replica"
    )


def test_a_pending_replica_whose_indices_are_all_ready_serves(admin_client, enabled):
    # Coverage, not the replica's state: GitLab's ReplicaStateService lags behind its
    # indices, and a pending replica whose every index is ready covers everything.
    replica = ready_replica(enabled, search_node("zoekt-a"), state=Replica.State.PENDING)
    body = get(admin_client, enabled.root_namespace_id)
    assert [t["replica_id"] for t in body["targets"]] == [replica.id]


def test_a_pending_replica_with_an_index_not_ready_is_not_ready(admin_client, enabled):
    replica = ready_replica(
        enabled, search_node("zoekt-a"), search_node("zoekt-b"), state=Replica.State.PENDING
    )
    Index.objects.filter(pk=replica.indices.order_by("id").first().pk).update(
        state=Index.State.INITIALIZING
    )
    assert_no_targets(
        get(admin_client, enabled.root_namespace_id), enabled.root_namespace_id, "no_ready_replica"
    )


def test_a_ready_replica_with_a_non_ready_index_is_not_ready(admin_client, enabled):
    replica = ready_replica(enabled, search_node("zoekt-a"), search_node("zoekt-b"))
    Index.objects.filter(pk=replica.indices.order_by("id").last().pk).update(
        state=Index.State.PENDING_EVICTION
    )
    assert_no_targets(
        get(admin_client, enabled.root_namespace_id), enabled.root_namespace_id, "no_ready_replica"
    )


def test_a_ready_replica_without_indices_is_not_ready(admin_client, enabled):
    ReplicaFactory(zoekt_enabled_namespace=enabled, state=Replica.State.READY)
    assert_no_targets(
        get(admin_client, enabled.root_namespace_id), enabled.root_namespace_id, "no_ready_replica"
    )


@pytest.mark.parametrize(
    "trouble",
    [
        pytest.param("offline", id="offline"),
        pytest.param("not_for_search", id="not-a-search-node"),
        pytest.param("restarts", id="restarts-exceeded"),
        pytest.param("mmap", id="mmap-near-limit"),
        pytest.param("stale", id="webserver-stale"),
        pytest.param("never_seen", id="webserver-never-seen"),
    ],
)
def test_ready_replicas_on_unsearchable_nodes_have_no_searchable_replica(
    admin_client, enabled, trouble
):
    bad = search_node("zoekt-bad")
    if trouble == "offline":
        bad.last_seen_at = NOW - timedelta(seconds=30)
    elif trouble == "not_for_search":
        bad.services = [7]
    elif trouble == "restarts":
        bad.metadata["process_health"]["indexer"]["restarts_15m"] = 2
    elif trouble == "mmap":
        bad.metadata["process_health"]["indexer"].update(mmap_current=950, mmap_max=1000)
    elif trouble == "stale":
        bad.webserver_last_seen_at = NOW - timedelta(seconds=31)
    elif trouble == "never_seen":
        bad.webserver_last_seen_at = None
    bad.save()
    ready_replica(enabled, search_node("zoekt-a"), bad)
    ready_replica(enabled, mmap_exhausted_node("zoekt-c"))

    assert_no_targets(
        get(admin_client, enabled.root_namespace_id),
        enabled.root_namespace_id,
        "no_searchable_replica",
    )


@pytest.mark.parametrize(
    ("seconds_ago", "reason"),
    [
        pytest.param(30, None, id="webserver-seen-exactly-30s-ago-serves"),
        pytest.param(31, "no_searchable_replica", id="webserver-seen-31s-ago-does-not"),
    ],
)
def test_the_webserver_threshold_is_30_seconds(admin_client, enabled, seconds_ago, reason):
    ready_replica(
        enabled, search_node("zoekt-a", webserver_last_seen_at=NOW - timedelta(seconds=seconds_ago))
    )
    assert get(admin_client, enabled.root_namespace_id)["reason"] == reason


def test_raising_max_restarts_brings_a_restarting_node_back(admin_client, enabled):
    node = search_node("zoekt-a")
    node.metadata["process_health"]["webserver"]["restarts_15m"] = 7
    node.save()
    ready_replica(enabled, node)
    assert get(admin_client, enabled.root_namespace_id)["reason"] == "no_searchable_replica"

    row = app_settings.load_row()
    row.zoekt_max_restarts_15m = 7
    row.save()

    assert get(admin_client, enabled.root_namespace_id)["reason"] is None


# --- the URL and the cost -----------------------------------------------------------------------


@pytest.mark.parametrize("namespace_id", ["abc", "-1", "1.5"])
def test_a_namespace_id_that_is_not_a_whole_number_is_404(admin_client, namespace_id):
    response = admin_client.get(targets_url(namespace_id))
    assert response.status_code == 404
    # The JSON error shape of every API answer, naming the path; not Django's HTML page.
    assert response["Content-Type"] == "application/json"
    assert set(response.json()["errors"]) == {"path"}


def test_a_page_that_is_not_under_the_api_keeps_the_html_404(admin_client):
    response = admin_client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_the_reply_does_not_write(admin_client, enabled):
    ready_replica(enabled, search_node("zoekt-a"))
    app_settings.load_row()  # the first read of the settings creates their row
    with CaptureQueriesContext(connection) as queries:
        get(admin_client, enabled.root_namespace_id)
    statements = [q["sql"].lstrip().split(None, 1)[0].upper() for q in queries]
    assert {"INSERT", "UPDATE", "DELETE"}.isdisjoint(statements), statements


def count_queries(client, namespace_id) -> int:
    with CaptureQueriesContext(connection) as queries:
        get(client, namespace_id)
    return len(queries)


def test_the_query_count_does_not_grow_with_replicas_or_nodes(admin_client, enabled):
    app_settings.current()  # cached for both measurements
    ready_replica(enabled, mmap_exhausted_node("zoekt-0"))
    ready_replica(enabled, search_node("zoekt-1"))
    small = count_queries(admin_client, enabled.root_namespace_id)

    for i in range(4):
        ready_replica(
            enabled,
            mmap_exhausted_node(f"zoekt-x{i}"),
            *(search_node(f"zoekt-y{i}{j}") for j in range(3)),
        )
    for i in range(10):
        search_node(f"spare-{i}")
    large = count_queries(admin_client, enabled.root_namespace_id)

    assert small == large


def test_many_namespaces_are_answered_in_four_queries_each_as_alone(now):
    app_settings.current()  # cached, as in the count above
    good, split, off, waiting, dark, covered = (EnabledNamespaceFactory() for _ in range(6))
    off.search = False
    off.save()
    first = search_node("zoekt-0")
    ready_replica(good, first)
    ready_replica(good, search_node("zoekt-1"))  # a second, higher-id replica
    ready_replica(split, first, search_node("zoekt-2"))
    ready_replica(dark, mmap_exhausted_node("zoekt-3"))
    pending = ReplicaFactory(zoekt_enabled_namespace=waiting, state=Replica.State.PENDING)
    IndexFactory(zoekt_replica=pending, zoekt_node=first, state=Index.State.PENDING)
    mixed = ready_replica(covered, first, mmap_exhausted_node("zoekt-4"))  # upper half dark
    ready_replica(covered, mmap_exhausted_node("zoekt-5"), search_node("zoekt-6"))
    unknown = GroupFactory().id
    ids = [e.root_namespace_id for e in (good, split, off, waiting, dark, covered)] + [unknown]

    with CaptureQueriesContext(connection) as queries:
        answers = search_targets_many(ids + ids[:2])  # repeats are answered once
    assert len(queries) == 4
    assert sorted(answers) == sorted(ids)
    assert answers == {namespace_id: search_targets(namespace_id) for namespace_id in ids}
    reasons = {namespace_id: answers[namespace_id].reason for namespace_id in ids}
    assert reasons == {
        good.root_namespace_id: None,
        split.root_namespace_id: None,
        off.root_namespace_id: "search_disabled",
        waiting.root_namespace_id: "no_ready_replica",
        dark.root_namespace_id: "no_searchable_replica",
        covered.root_namespace_id: None,
        unknown: "namespace_not_enabled",
    }
    assert [t.node_name for t in answers[split.root_namespace_id].targets] == [
        "zoekt-0",
        "zoekt-2",
    ]
    # The lowest-id ready replica serves, as for one namespace.
    good_targets = answers[good.root_namespace_id].targets
    assert [t.node_name for t in good_targets] == ["zoekt-0"]
    # Each replica lost one half; together they cover it.
    covering = answers[covered.root_namespace_id].targets
    assert [(t.node_name, t.replica_id) for t in covering] == [
        ("zoekt-0", mixed.id),
        ("zoekt-6", mixed.id + 1),
    ]


def test_dark_namespaces_are_those_search_targets_finds_no_target_for_by_reason(now):
    app_settings.current()  # cached, as in the counts above
    namespaces = [EnabledNamespaceFactory() for _ in range(8)]
    good, off, waiting, gap, offline, dark_ns, never_placed, covered = namespaces
    off.search = False
    off.save()
    first = search_node("zoekt-0")
    ready_replica(good, first)
    ready_replica(off, mmap_exhausted_node("zoekt-1"))  # search off: not dark, whatever it holds
    pending = ReplicaFactory(zoekt_enabled_namespace=waiting, state=Replica.State.PENDING)
    IndexFactory(zoekt_replica=pending, zoekt_node=first, state=Index.State.PENDING)
    upper = search_node("zoekt-2")
    holed = ready_replica(gap, first, upper)
    Index.objects.filter(zoekt_replica=holed, zoekt_node=upper).update(
        state=Index.State.PENDING
    )  # ids 1001.. have no ready index
    ready_replica(offline, search_node("zoekt-3", last_seen_at=now - timedelta(hours=1)))
    ready_replica(dark_ns, mmap_exhausted_node("zoekt-4"))
    # Each replica lost one half, on a different node: together they still cover.
    ready_replica(covered, first, mmap_exhausted_node("zoekt-5"))
    ready_replica(covered, mmap_exhausted_node("zoekt-6"), search_node("zoekt-7"))
    answers = search_targets_many(e.root_namespace_id for e in namespaces)

    with CaptureQueriesContext(connection) as queries:
        dark = dark_namespaces(now)
    assert len(queries) == 4
    assert dark == {
        "no_ready_replica": sorted(e.root_namespace_id for e in (waiting, gap, never_placed)),
        "no_searchable_replica": sorted(e.root_namespace_id for e in (offline, dark_ns)),
    }
    assert dark == {
        reason: sorted(root_id for root_id, answer in answers.items() if answer.reason == reason)
        for reason in ("no_ready_replica", "no_searchable_replica")
    }


def test_a_fleet_whose_searches_all_have_a_target_has_no_dark_namespace(now):
    enabled = EnabledNamespaceFactory()
    ready_replica(enabled, search_node("zoekt-0"), search_node("zoekt-1"))
    before = list(Index.objects.values_list("id", "state").order_by("id"))
    assert dark_namespaces(now) == {"no_ready_replica": [], "no_searchable_replica": []}
    assert list(Index.objects.values_list("id", "state").order_by("id")) == before


def test_dark_namespaces_costs_four_queries_whatever_the_fleet(now):
    app_settings.current()

    def cost() -> int:
        with CaptureQueriesContext(connection) as queries:
            dark_namespaces(now)
        return len(queries)

    ready_replica(EnabledNamespaceFactory(), search_node("zoekt-0"))
    small = cost()
    for i in range(10):
        ready_replica(
            EnabledNamespaceFactory(),
            search_node(f"zoekt-a{i}"),
            mmap_exhausted_node(f"zoekt-b{i}"),
        )
    assert small == cost() == 4


def test_no_namespace_no_query():
    with CaptureQueriesContext(connection) as queries:
        assert search_targets_many([]) == {}
    assert len(queries) == 0  # an empty IN never reaches the database


def test_the_openapi_schema_describes_the_endpoint(admin_client):
    response = admin_client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    text = response.content.decode()
    assert "/api/v1/namespaces/{root_namespace_id}/search_targets" in text
    assert "no_searchable_replica" in text


# --- coverage: ranges drawn from several replicas ---------------------------------------------


def ranged_index(replica: Replica, node: Node, low, high, state=READY) -> Index:
    return IndexFactory(
        zoekt_replica=replica,
        zoekt_node=node,
        state=state,
        metadata={"project_namespace_id_from": low, "project_namespace_id_to": high},
    )


def served(body: dict) -> list[tuple[str, int | None, int | None]]:
    return [
        (t["node_name"], i["project_namespace_id_from"], i["project_namespace_id_to"])
        for t in body["targets"]
        for i in t["indices"]
    ]


def test_replicas_that_each_lost_a_node_cover_together_without_a_result_twice(
    admin_client, enabled
):
    # Replica 1: [..1000] on a, [1001..] on a dark node. Replica 2: one index on c,
    # whole. The cover asks c only for what a does not serve.
    first = ReplicaFactory(zoekt_enabled_namespace=enabled, state=Replica.State.READY)
    ranged_index(first, search_node("zoekt-a"), None, 1000)
    ranged_index(first, mmap_exhausted_node("zoekt-b"), 1001, None)
    second = ReplicaFactory(zoekt_enabled_namespace=enabled, state=Replica.State.PENDING)
    ranged_index(second, search_node("zoekt-c"), None, None)

    body = get(admin_client, enabled.root_namespace_id)

    # Replica 1 does not cover alone; replica 2 does, even though it is pending.
    assert served(body) == [("zoekt-c", None, None)]


def test_a_narrow_index_is_asked_only_for_the_range_nothing_wider_serves(admin_client, enabled):
    # No replica covers alone: 1's outer indices and 2's upper one are dark. At each
    # point the index reaching furthest serves: c up to 1500, then b (whose range
    # starts at 1001) only for 1501..2000, then e.
    first = ReplicaFactory(zoekt_enabled_namespace=enabled)
    ranged_index(first, mmap_exhausted_node("zoekt-a"), None, 1000)
    ranged_index(first, search_node("zoekt-b"), 1001, 2000)
    ranged_index(first, mmap_exhausted_node("zoekt-x"), 2001, None)
    second = ReplicaFactory(zoekt_enabled_namespace=enabled)
    ranged_index(second, search_node("zoekt-c"), None, 1500)
    ranged_index(second, mmap_exhausted_node("zoekt-d"), 1501, None)
    third = ReplicaFactory(zoekt_enabled_namespace=enabled)
    ranged_index(third, search_node("zoekt-e"), 2001, None)

    body = get(admin_client, enabled.root_namespace_id)

    assert served(body) == [
        ("zoekt-b", 1501, 2000),
        ("zoekt-c", None, 1500),
        ("zoekt-e", 2001, None),
    ]
    assert [t["replica_id"] for t in body["targets"]] == [first.id, second.id, third.id]


def test_a_gap_no_index_covers_is_no_ready_replica(admin_client, enabled):
    replica = ReplicaFactory(zoekt_enabled_namespace=enabled)
    ranged_index(replica, search_node("zoekt-a"), None, 1000)
    ranged_index(replica, search_node("zoekt-b"), 1001, 2000, state=Index.State.PENDING)
    ranged_index(replica, search_node("zoekt-c"), 2001, None)
    assert get(admin_client, enabled.root_namespace_id)["reason"] == "no_ready_replica"


def test_a_live_moves_build_replica_is_never_a_target(admin_client, enabled):
    from zoekt.models import Move

    serving = ReplicaFactory(zoekt_enabled_namespace=enabled)
    source = ranged_index(serving, mmap_exhausted_node("zoekt-a"), None, None)
    build = ReplicaFactory(zoekt_enabled_namespace=enabled, state=Replica.State.PENDING)
    replacement = ranged_index(build, search_node("zoekt-b"), None, None)
    Move.objects.create(
        trigger="node_level",
        state=Move.State.BUILDING,
        zoekt_enabled_namespace=enabled,
        namespace_id=enabled.root_namespace_id,
        source_node=source.zoekt_node,
        source_index=source,
        source_index_ref=source.id,
        source_replica_id=serving.id,
        source_replica_ref=serving.id,
        target_node=replacement.zoekt_node,
        replacement_index=replacement,
        replacement_replica=build,
        bytes=1,
        created_at=NOW,
        updated_at=NOW,
    )
    # Ready and searchable, but a partial copy until its swap.
    assert get(admin_client, enabled.root_namespace_id)["reason"] == "no_searchable_replica"
