"""POST /api/v1/namespaces/<root_namespace_id>/search_request: GitLab's search request.

The fixtures are GitLab's own, stored as they are: tests/fixtures/gitlab_search_group_repo_ids.json
is ee/spec/fixtures/search/zoekt/search_group_repo_ids.json and
tests/fixtures/gitlab_search_group_meta_project_id.json is
ee/spec/fixtures/search/zoekt/search_group_meta_project_id.json of GitLab's repository.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

from tests.api.helpers import db_snapshot
from tests.api.test_search_targets import (  # noqa: F401
    enabled,
    mmap_exhausted_node,
    ready_replica,
    search_node,
)
from tests.factories import GroupFactory, ProjectFactory, RepositoryFactory
from zoekt.models import Namespace, Repository

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).parents[1] / "fixtures"
GITLAB_REPO_IDS = json.loads((FIXTURES / "gitlab_search_group_repo_ids.json").read_text())
GITLAB_META = json.loads((FIXTURES / "gitlab_search_group_meta_project_id.json").read_text())
QUERY = {"query_string": {"query": "case:no test"}}
BODY_KEYS = {
    "version",
    "timeout",
    "num_context_lines",
    "max_file_match_window",
    "max_file_match_results",
    "max_line_match_window",
    "max_line_match_results",
    "max_line_match_results_per_file",
    "forward_to",
}


def request_url(namespace_id) -> str:
    return f"/api/v1/namespaces/{namespace_id}/search_request"


def post(client, namespace_id, body, **headers):
    return client.post(
        request_url(namespace_id), data=json.dumps(body), content_type="application/json", **headers
    )


def ok(client, namespace_id, body) -> dict:
    response = post(client, namespace_id, body)
    assert response.status_code == 200, response.content
    return response.json()


def repository(
    index, project_namespace_id: int, *, project_id: int | None = None, state=Repository.State.READY
):
    """A searchable repository in ``index`` of a project whose project namespace has this id."""
    group = GroupFactory()
    own = GroupFactory(id=project_namespace_id, type=Namespace.Type.PROJECT, parent=group)
    extra = {} if project_id is None else {"id": project_id}
    project = ProjectFactory(namespace=group, project_namespace=own, **extra)
    return RepositoryFactory(zoekt_index=index, project=project, state=state).project_id


def shape(value):
    """The keys at every level and the type of every value: what "key for key" compares."""
    if isinstance(value, dict):
        return {key: shape(child) for key, child in value.items()}
    if isinstance(value, list):
        return [shape(child) for child in value]
    return type(value).__name__


def nodes_with(tree, predicate) -> list:
    """Every object of a JSON tree for which ``predicate`` holds."""
    found = []
    if isinstance(tree, dict):
        if predicate(tree):
            found.append(tree)
        children = tree.values()
    elif isinstance(tree, list):
        children = tree
    else:
        return found
    for child in children:
        found.extend(nodes_with(child, predicate))
    return found


def repo_filter(entry: dict) -> dict:
    _query_node, filter_node = entry["query"]["and"]["children"]
    return filter_node


def ids_of(entry: dict) -> list[int]:
    node = repo_filter(entry)
    if "repo_ids" in node:
        return node["repo_ids"]
    return [int(pid) for pid in node["meta"]["value"][2:-2].split("|")]


@pytest.fixture
def split(enabled):  # noqa: F811
    """Two nodes of one replica: zoekt-a serves project namespaces up to 1000, zoekt-b above."""
    first, second = search_node("zoekt-a"), search_node("zoekt-b")
    replica = ready_replica(enabled, first, second)
    index_a, index_b = replica.indices.order_by("zoekt_node_id")
    return first, second, index_a, index_b


# --- GitLab's shape ---------------------------------------------------------------------------


def test_an_entrys_query_is_gitlabs_repo_ids_fixture_key_for_key(admin_client, enabled):  # noqa: F811
    index = ready_replica(enabled, search_node("zoekt-a")).indices.get()
    for k in range(1, 7):
        repository(index, 500 + k, project_id=k)

    body = ok(
        admin_client, enabled.root_namespace_id, {"query": QUERY, "project_ids": [*range(1, 7)]}
    )

    (entry,) = body["request"]["forward_to"]
    assert entry["query"] == GITLAB_REPO_IDS
    assert shape(entry["query"]) == shape(GITLAB_REPO_IDS)
    assert list(entry) == ["query", "endpoint"] and entry["endpoint"] == "http://zoekt-a:6070"


def test_ids_above_32_bits_use_gitlabs_meta_project_id_form(admin_client, enabled):  # noqa: F811
    index = ready_replica(enabled, search_node("zoekt-a")).indices.get()
    large = [2**32, 2**32 + 1, 2**32 + 2]
    for k, pid in enumerate(reversed(large)):
        repository(index, 600 + k, project_id=pid)

    body = ok(admin_client, enabled.root_namespace_id, {"query": QUERY, "project_ids": large})

    (entry,) = body["request"]["forward_to"]
    query_node, filter_node = entry["query"]["and"]["children"]
    assert query_node == QUERY
    gitlabs = nodes_with(GITLAB_META, lambda n: n.get("meta", {}).get("key") == "project_id")
    assert gitlabs and all(node == filter_node for node in gitlabs)
    assert shape(filter_node) == shape(gitlabs[0])
    assert filter_node == {
        "meta": {"key": "project_id", "value": "^(4294967296|4294967297|4294967298)$"}
    }


def test_one_large_id_turns_only_its_entry_to_the_meta_form(admin_client, enabled, split):  # noqa: F811
    _first, _second, index_a, index_b = split
    small = repository(index_a, 510)
    big = repository(index_b, 1510, project_id=2**32 - 1)
    bigger = repository(index_b, 1520, project_id=2**40)

    body = ok(
        admin_client,
        enabled.root_namespace_id,
        {"query": QUERY, "project_ids": [bigger, small, big]},
    )

    a, b = body["request"]["forward_to"]
    assert repo_filter(a) == {"repo_ids": [small]}
    assert repo_filter(b) == {"meta": {"key": "project_id", "value": f"^({2**32 - 1}|{2**40})$"}}


def test_the_body_is_gitlabs_v2_request_with_its_defaults_and_nothing_else(
    admin_client,
    enabled,  # noqa: F811
    split,
):
    _first, _second, index_a, index_b = split
    low = [repository(index_a, pn) for pn in (510, 520)]
    high = [repository(index_b, pn) for pn in (1500, 1600, 1700)]

    body = ok(admin_client, enabled.root_namespace_id, {"query": QUERY, "project_ids": low + high})

    assert set(body) == {
        "namespace_id",
        "search_enabled",
        "reason",
        "proxy",
        "request",
        "unrouted_project_ids",
    }
    assert body["search_enabled"] is True and body["reason"] is None
    assert body["namespace_id"] == enabled.root_namespace_id
    assert body["unrouted_project_ids"] == []
    request = body["request"]
    assert set(request) == BODY_KEYS
    assert {key: value for key, value in request.items() if key != "forward_to"} == {
        "version": 2,
        "timeout": "120s",
        "num_context_lines": 1,
        "max_file_match_window": 0,
        "max_file_match_results": 0,
        "max_line_match_window": 5000,
        "max_line_match_results": 5000,
        "max_line_match_results_per_file": 500,
    }
    assert request["forward_to"] == [
        {
            "query": {"and": {"children": [QUERY, {"repo_ids": sorted(low)}]}},
            "endpoint": "http://zoekt-a:6070",
        },
        {
            "query": {"and": {"children": [QUERY, {"repo_ids": sorted(high)}]}},
            "endpoint": "http://zoekt-b:6070",
        },
    ]
    # Nothing of ours anywhere inside GitLab's body.
    text = json.dumps(request)
    for ours in ("node_id", "node_name", "replica_id", "projects", "project_namespace_id"):
        assert f'"{ours}' not in text


def test_a_plain_string_is_a_query_string_node_and_options_are_sent_as_given(
    admin_client,
    enabled,  # noqa: F811
):
    index = ready_replica(enabled, search_node("zoekt-a")).indices.get()
    pid = repository(index, 501)
    options = {
        "timeout": "30s",
        "num_context_lines": 3,
        "max_file_match_window": 40,
        "max_file_match_results": 20,
        "max_line_match_window": 100,
        "max_line_match_results": 50,
        "max_line_match_results_per_file": 7,
        "file_match_offset": 20,
    }

    body = ok(
        admin_client,
        enabled.root_namespace_id,
        {"query": "case:no test", "project_ids": [pid], "options": options},
    )

    request = body["request"]
    assert set(request) == BODY_KEYS | {"file_match_offset"}
    assert {k: request[k] for k in options} == options
    assert request["forward_to"][0]["query"]["and"]["children"][0] == QUERY


def test_file_match_offset_zero_is_not_sent(admin_client, enabled):  # noqa: F811
    index = ready_replica(enabled, search_node("zoekt-a")).indices.get()
    pid = repository(index, 501)
    body = ok(
        admin_client,
        enabled.root_namespace_id,
        {"query": QUERY, "project_ids": [pid], "options": {"file_match_offset": 0}},
    )
    assert "file_match_offset" not in body["request"]


# --- each project once ------------------------------------------------------------------------


def test_each_project_is_given_once_and_a_nodes_leftover_never(admin_client, enabled, split):  # noqa: F811
    _first, _second, index_a, index_b = split
    low = [repository(index_a, pn) for pn in (510, 520)]
    high = [repository(index_b, pn) for pn in (1500, 1600)]
    # zoekt-a still holds a copy of a project zoekt-b's range now serves (a move's
    # leftover): asked for on zoekt-b only.
    twice = repository(index_b, 1800)
    RepositoryFactory(
        zoekt_index=index_a,
        project_id=twice,
        project_identifier=twice,
        state=Repository.State.READY,
    )
    # A leftover alone (the index now serving its range has not indexed it yet): unrouted.
    stray = repository(index_a, 1900)

    ids = low + high + [twice, stray, twice, low[0]]
    body = ok(admin_client, enabled.root_namespace_id, {"query": QUERY, "project_ids": ids})

    entries = body["request"]["forward_to"]
    given = [pid for entry in entries for pid in ids_of(entry)]
    assert sorted(given) == sorted(set(ids) - {stray})
    assert len(given) == len(set(given))
    assert ids_of(entries[0]) == sorted(low)
    assert ids_of(entries[1]) == sorted([*high, twice])
    assert body["unrouted_project_ids"] == [stray]


def test_a_project_not_served_is_unrouted_and_a_node_serving_none_has_no_entry(
    admin_client,
    enabled,  # noqa: F811
    split,
):
    _first, second, index_a, index_b = split
    served = repository(index_b, 1500)
    pending = repository(index_b, 1600, state=Repository.State.PENDING)
    elsewhere = ProjectFactory().id  # in the catalog, in no index
    unknown = 987654321  # not even in the catalog
    repository(index_a, 510)  # zoekt-a serves a project nobody asked for

    body = ok(
        admin_client,
        enabled.root_namespace_id,
        {"query": QUERY, "project_ids": [unknown, pending, served, elsewhere]},
    )

    assert [entry["endpoint"] for entry in body["request"]["forward_to"]] == ["http://zoekt-b:6070"]
    assert ids_of(body["request"]["forward_to"][0]) == [served]
    assert body["unrouted_project_ids"] == sorted([unknown, pending, elsewhere])
    assert body["proxy"]["node_id"] == second.id


def test_no_requested_project_served_is_no_route(admin_client, enabled, split):  # noqa: F811
    repository(split[2], 510)
    body = ok(admin_client, enabled.root_namespace_id, {"query": QUERY, "project_ids": [424242]})
    assert body == {
        "namespace_id": enabled.root_namespace_id,
        "search_enabled": False,
        "reason": "no_requested_project_served",
        "proxy": None,
        "request": None,
        "unrouted_project_ids": [424242],
    }


def test_a_namespace_not_enabled_is_no_route_with_search_targets_reason(admin_client):
    body = ok(admin_client, 424242, {"query": QUERY, "project_ids": [3, 1, 3]})
    assert body == {
        "namespace_id": 424242,
        "search_enabled": False,
        "reason": "namespace_not_enabled",
        "proxy": None,
        "request": None,
        "unrouted_project_ids": [1, 3],
    }


def test_no_searchable_node_is_no_route(admin_client, enabled):  # noqa: F811
    index = ready_replica(enabled, mmap_exhausted_node("zoekt-a")).indices.get()
    pid = repository(index, 501)
    body = ok(
        admin_client,
        enabled.root_namespace_id,
        {"query": QUERY, "project_ids": [pid], "options": {"node_id": index.zoekt_node_id}},
    )
    assert body["reason"] == "no_searchable_replica"
    assert body["request"] is None and body["proxy"] is None
    assert body["unrouted_project_ids"] == [pid]


# --- the proxy --------------------------------------------------------------------------------


def test_the_proxy_is_the_node_with_the_most_projects(admin_client, enabled, split):  # noqa: F811
    first, second, index_a, index_b = split
    low = [repository(index_a, pn) for pn in (510, 520, 530)]
    high = [repository(index_b, pn) for pn in (1500, 1600)]

    body = ok(admin_client, enabled.root_namespace_id, {"query": QUERY, "project_ids": low + high})
    assert body["proxy"] == {
        "node_id": first.id,
        "node_name": "zoekt-a",
        "search_base_url": "http://zoekt-a:6070",
        "url": "http://zoekt-a:6070/webserver/api/v2/search",
    }
    # Only what is requested counts: asking for more of zoekt-b's projects moves it.
    body = ok(admin_client, enabled.root_namespace_id, {"query": QUERY, "project_ids": high})
    assert body["proxy"]["node_id"] == second.id


def test_a_tie_goes_to_the_lowest_node_id(admin_client, enabled, split):  # noqa: F811
    first, second, index_a, index_b = split
    ids = [repository(index_a, 510), repository(index_b, 1500)]
    body = ok(admin_client, enabled.root_namespace_id, {"query": QUERY, "project_ids": ids})
    assert first.id < second.id
    assert body["proxy"]["node_id"] == first.id


def test_the_node_id_option_chooses_the_proxy(admin_client, enabled, split):  # noqa: F811
    _first, second, index_a, index_b = split
    ids = [repository(index_a, pn) for pn in (510, 520)] + [repository(index_b, 1500)]
    body = ok(
        admin_client,
        enabled.root_namespace_id,
        {"query": QUERY, "project_ids": ids, "options": {"node_id": second.id}},
    )
    assert body["proxy"]["node_id"] == second.id
    assert body["proxy"]["url"] == "http://zoekt-b:6070/webserver/api/v2/search"
    assert "node_id" not in body["request"]


def test_a_node_id_that_is_not_one_of_the_requests_nodes_is_refused(admin_client, enabled, split):  # noqa: F811
    _first, second, index_a, _index_b = split
    ids = [repository(index_a, 510)]  # zoekt-b serves none of them
    before = db_snapshot()
    response = post(
        admin_client,
        enabled.root_namespace_id,
        {"query": QUERY, "project_ids": ids, "options": {"node_id": second.id}},
    )
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["options.node_id"]
    assert db_snapshot() == before


# --- GitLab's limit and bad input -------------------------------------------------------------


def test_above_30000_projects_is_gitlabs_error_naming_project_ids(admin_client, enabled):  # noqa: F811
    index = ready_replica(enabled, search_node("zoekt-a")).indices.get()
    repository(index, 501, project_id=1)
    before = db_snapshot()

    response = post(
        admin_client,
        enabled.root_namespace_id,
        {"query": QUERY, "project_ids": list(range(1, 30_002))},
    )

    assert response.status_code == 400, response.content
    body = response.json()
    assert list(body["errors"]) == ["project_ids"]
    assert "30,000" in body["errors"]["project_ids"][0]
    assert db_snapshot() == before


def test_exactly_30000_projects_and_duplicates_are_accepted(admin_client, enabled):  # noqa: F811
    index = ready_replica(enabled, search_node("zoekt-a")).indices.get()
    pid = repository(index, 501)
    ids = sorted({pid, *range(10**9, 10**9 + 29_999)})
    body = ok(
        admin_client, enabled.root_namespace_id, {"query": QUERY, "project_ids": ids + ids[:100]}
    )
    assert ids_of(body["request"]["forward_to"][0]) == [pid]
    assert len(body["unrouted_project_ids"]) == 29_999


BAD = [
    pytest.param({"project_ids": [1]}, "query", id="missing-query"),
    pytest.param({"query": "", "project_ids": [1]}, "query", id="blank-query"),
    pytest.param({"query": {}, "project_ids": [1]}, "query", id="empty-query-object"),
    pytest.param({"query": [QUERY], "project_ids": [1]}, "query", id="query-a-list"),
    pytest.param({"query": 7, "project_ids": [1]}, "query", id="query-a-number"),
    pytest.param({"query": QUERY}, "project_ids", id="missing-project-ids"),
    pytest.param({"query": QUERY, "project_ids": []}, "project_ids", id="empty-project-ids"),
    pytest.param({"query": QUERY, "project_ids": 5}, "project_ids", id="project-ids-not-a-list"),
    pytest.param({"query": QUERY, "project_ids": ["1"]}, "project_ids[0]", id="id-a-string"),
    pytest.param({"query": QUERY, "project_ids": [1, 2.5]}, "project_ids[1]", id="id-a-float"),
    pytest.param({"query": QUERY, "project_ids": [True]}, "project_ids[0]", id="id-a-boolean"),
    pytest.param({"query": QUERY, "project_ids": [0]}, "project_ids[0]", id="id-zero"),
    pytest.param({"query": QUERY, "project_ids": [-4]}, "project_ids[0]", id="id-negative"),
    pytest.param({"query": QUERY, "project_ids": [2**63]}, "project_ids[0]", id="id-over-bigint"),
    pytest.param({"query": QUERY, "project_ids": [1], "scope": "x"}, "scope", id="unknown-key"),
    pytest.param(
        {"query": QUERY, "project_ids": [1], "options": {"max_results": 3}},
        "options.max_results",
        id="unknown-option-key",
    ),
    pytest.param(
        {"query": QUERY, "project_ids": [1], "options": {"timeout": "2 minutes"}},
        "options.timeout",
        id="bad-timeout",
    ),
    pytest.param(
        {"query": QUERY, "project_ids": [1], "options": {"timeout": 120}},
        "options.timeout",
        id="timeout-a-number",
    ),
    pytest.param(
        {"query": QUERY, "project_ids": [1], "options": {"timeout": "0s"}},
        "options.timeout",
        id="zero-timeout",
    ),
    pytest.param(
        {"query": QUERY, "project_ids": [1], "options": {"num_context_lines": -1}},
        "options.num_context_lines",
        id="negative-context-lines",
    ),
    pytest.param(
        {"query": QUERY, "project_ids": [1], "options": {"max_line_match_window": "5000"}},
        "options.max_line_match_window",
        id="limit-a-string",
    ),
    pytest.param(
        {"query": QUERY, "project_ids": [1], "options": {"node_id": 0}},
        "options.node_id",
        id="node-id-zero",
    ),
    pytest.param(
        {"query": QUERY, "project_ids": [1], "options": []},
        "options",
        id="options-a-list",
    ),
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_bad_input_is_a_400_naming_the_field(admin_client, enabled, body, field):  # noqa: F811
    before = db_snapshot()
    response = post(admin_client, enabled.root_namespace_id, body)
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert any(key == field or key.startswith(f"{field}.") for key in errors), errors
    assert db_snapshot() == before


def test_a_query_nested_too_deep_is_a_400_not_a_500(admin_client, enabled):  # noqa: F811
    query: dict = {"query_string": {"query": "x"}}
    for _ in range(200):
        query = {"and": {"children": [query]}}
    response = post(admin_client, enabled.root_namespace_id, {"query": query, "project_ids": [1]})
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["query"]


def test_a_body_that_is_not_json_is_refused(admin_client, enabled):  # noqa: F811
    response = admin_client.post(
        request_url(enabled.root_namespace_id), data={"query": "x", "project_ids": "1"}
    )
    assert response.status_code == 415
    assert set(response.json()) == {"error", "errors"}
    response = admin_client.post(
        request_url(enabled.root_namespace_id), data="{", content_type="application/json"
    )
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["body"]


def test_a_body_over_4_mib_is_refused_before_it_is_read(admin_client, enabled):  # noqa: F811
    query = {"query_string": {"query": "x" * (4 * 1024 * 1024)}}
    before = db_snapshot()
    response = post(admin_client, enabled.root_namespace_id, {"query": query, "project_ids": [1]})
    assert response.status_code == 413
    assert list(response.json()["errors"]) == ["body"]
    assert db_snapshot() == before


def test_get_is_not_allowed(admin_client, enabled):  # noqa: F811
    assert admin_client.get(request_url(enabled.root_namespace_id)).status_code == 405


# --- authentication, as search_targets ----------------------------------------------------------

VALID = {"query": QUERY, "project_ids": [1]}


def test_anonymous_callers_are_refused(enabled):  # noqa: F811
    response = post(Client(), enabled.root_namespace_id, VALID)
    assert response.status_code == 401
    assert set(response.json()) == {"error", "errors"}


def test_users_who_are_not_staff_are_refused(enabled, django_user_model):  # noqa: F811
    user = django_user_model.objects.create_user("dev", password="x")
    client = Client()
    client.force_login(user)
    assert post(client, enabled.root_namespace_id, VALID).status_code == 403
    token = Token.objects.create(user=user)
    response = post(
        Client(), enabled.root_namespace_id, VALID, HTTP_AUTHORIZATION=f"Token {token.key}"
    )
    assert response.status_code == 403


def test_a_staff_token_is_accepted(enabled, django_user_model):  # noqa: F811
    staff = django_user_model.objects.create_user("ops", password="x", is_staff=True)
    token = Token.objects.create(user=staff)
    response = post(
        Client(), enabled.root_namespace_id, VALID, HTTP_AUTHORIZATION=f"Token {token.key}"
    )
    assert response.status_code == 200
    assert response.json()["reason"] == "no_ready_replica"
