"""The operator API: GitLab's Zoekt admin endpoints (reference 3.5) and the OpenAPI schema.

Staff only, by session or DRF token. PUT and PATCH need
``zoekt_indexing_enabled`` (else 400); the DELETE does not. Missing ids are
404s, as in GitLab. Every refused request leaves the tables as they were.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import get_resolver
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from api import operator_urls
from tests.api.helpers import ERROR_KEYS, set_app_setting
from tests.factories import (
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ProjectFactory,
    ReplicaFactory,
    RepositoryFactory,
)
from zoekt.models import EnabledNamespace, Index, Namespace, Replica, Repository
from zoekt.scheduling.tasks import index_project_task

pytestmark = pytest.mark.django_db

ADMIN = "/api/v4/admin/zoekt"
INDEXING_DISABLED = "application setting zoekt_indexing_enabled is not enabled"
ENTITY_KEYS = {
    "id",
    "zoekt_shard_id",
    "zoekt_node_id",
    "namespace_id",
    "search",
    "number_of_replicas_override",
}


# --- clients -----------------------------------------------------------------------------------


def make_user(username: str, *, staff: bool):
    return get_user_model().objects.create_user(username, password="pw-12345678", is_staff=staff)


@pytest.fixture
def staff_user():
    return make_user("operator", staff=True)


@pytest.fixture
def api(staff_user) -> APIClient:
    """A staff user signed in with a DRF token."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=staff_user).key}")
    return client


@pytest.fixture
def indexing_enabled():
    set_app_setting(zoekt_indexing_enabled=True)


def assert_error(response, status: int, field: str, message_part: str = "") -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert field in body["errors"], body
    assert message_part in " ".join(body["errors"][field])
    return body


def snapshot() -> dict:
    return {
        "enabled_namespaces": list(EnabledNamespace.objects.order_by("id").values()),
        "replicas": list(Replica.objects.order_by("id").values()),
        "indices": list(Index.objects.order_by("id").values()),
        "repositories": list(Repository.objects.order_by("id").values()),
    }


# --- authentication and permission ---------------------------------------------------------------

ENDPOINTS = [
    pytest.param("put", f"{ADMIN}/projects/1/index", id="index-project"),
    pytest.param("patch", f"{ADMIN}/namespaces/1", id="update-namespace"),
    pytest.param("get", f"{ADMIN}/shards", id="list-nodes"),
    pytest.param("get", f"{ADMIN}/shards/1/indexed_namespaces", id="list-indexed-namespaces"),
    pytest.param("put", f"{ADMIN}/shards/1/indexed_namespaces/1", id="enable-namespace"),
    pytest.param("delete", f"{ADMIN}/shards/1/indexed_namespaces/1", id="disable-namespace"),
    pytest.param("post", "/api/v1/catalog/bulk_upsert", id="catalog-bulk-upsert"),
    pytest.param("put", "/api/v1/nodes/1/shutdown", id="request-node-shutdown"),
    pytest.param("get", "/api/v1/nodes/1/shutdown", id="node-shutdown-status"),
    pytest.param("delete", "/api/v1/nodes/1/shutdown", id="cancel-node-shutdown"),
]


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
def test_a_request_without_credentials_is_a_401_asking_for_a_token(method, url):
    response = getattr(APIClient(), method)(url, {}, format="json")
    assert_error(response, 401, "authorization", "credentials were not provided")
    assert response["WWW-Authenticate"] == "Token"


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
def test_a_wrong_token_is_a_401(method, url):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    response = getattr(client, method)(url, {}, format="json")
    assert_error(response, 401, "authorization", "Invalid token")


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
@pytest.mark.parametrize("how", ["session", "token"])
def test_a_user_who_is_not_staff_is_refused_with_403(method, url, how):
    user = make_user("developer", staff=False)
    client = APIClient()
    if how == "session":
        client.force_login(user)
    else:
        client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    before = snapshot()
    response = getattr(client, method)(url, {}, format="json")
    assert_error(response, 403, "request", "permission")
    assert snapshot() == before


@pytest.mark.parametrize("how", ["session", "token"])
def test_a_staff_user_is_let_in_by_session_or_by_token(how, staff_user):
    NodeFactory()
    client = APIClient()
    if how == "session":
        client.force_login(staff_user)
    else:
        client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=staff_user).key}")
    response = client.get(f"{ADMIN}/shards")
    assert response.status_code == 200
    assert len(response.json()) == 1


def test_a_session_write_still_needs_its_csrf_token(staff_user, indexing_enabled):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(staff_user)
    namespace = GroupFactory()
    response = client.put(f"{ADMIN}/shards/0/indexed_namespaces/{namespace.id}")
    assert_error(response, 403, "request", "CSRF")
    assert not EnabledNamespace.objects.exists()


# --- PUT /admin/zoekt/projects/:project_id/index ----------------------------------------------


@pytest.fixture
def enqueued(monkeypatch) -> list[dict]:
    """Calls to the index job's ``apply_async`` (nothing reaches the broker)."""
    calls: list[dict] = []
    monkeypatch.setattr(
        index_project_task, "apply_async", lambda *args, **kwargs: calls.append(kwargs)
    )
    return calls


def test_indexing_a_project_queues_one_job_after_commit_and_returns_its_id(
    api, indexing_enabled, enqueued, django_capture_on_commit_callbacks
):
    project = ProjectFactory()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api.put(f"{ADMIN}/projects/{project.id}/index")
        assert enqueued == []  # not before the commit
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"job_id"}
    assert len(callbacks) == 1
    callbacks[0]()
    assert enqueued == [{"task_id": body["job_id"]}]


def test_the_queued_job_names_the_project_and_the_celery_task(
    api, indexing_enabled, monkeypatch, django_capture_on_commit_callbacks
):
    project = ProjectFactory()
    seen = []
    monkeypatch.setattr(
        index_project_task, "apply_async", lambda *args, **kwargs: seen.append((args, kwargs))
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = api.put(f"{ADMIN}/projects/{project.id}/index")
    ((args, kwargs),) = seen
    assert args == ((project.id,),)
    assert kwargs == {"task_id": response.json()["job_id"]}
    assert index_project_task.name == "zoekt.index_project"


@pytest.mark.parametrize("project_id", [987654, 2**70])
def test_indexing_a_missing_project_is_a_404_and_queues_nothing(
    api, indexing_enabled, enqueued, django_capture_on_commit_callbacks, project_id
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = api.put(f"{ADMIN}/projects/{project_id}/index")
    assert_error(response, 404, "project_id", str(project_id))
    assert callbacks == []
    assert enqueued == []


def test_indexing_a_project_needs_indexing_enabled_checked_before_the_project(
    api, enqueued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = api.put(f"{ADMIN}/projects/987654/index")
    body = assert_error(response, 400, "zoekt_indexing_enabled", INDEXING_DISABLED)
    assert body["error"] == f"zoekt_indexing_enabled: {INDEXING_DISABLED}"
    assert callbacks == []


# --- PATCH /admin/zoekt/namespaces/:id -----------------------------------------------------------


@pytest.fixture
def enabled_root():
    return EnabledNamespaceFactory()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param({"number_of_replicas_override": 3}, 3, id="gitlab-name"),
        pytest.param({"number_of_replicas": 2}, 2, id="short-name"),
        pytest.param({"number_of_replicas_override": 1}, 1, id="one-is-allowed"),
    ],
)
def test_patch_sets_the_replica_override_of_the_enabled_namespace(
    api, indexing_enabled, enabled_root, body, expected
):
    response = api.patch(f"{ADMIN}/namespaces/{enabled_root.root_namespace_id}", body, "json")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "id": enabled_root.id,
        "zoekt_shard_id": None,
        "zoekt_node_id": None,
        "namespace_id": enabled_root.root_namespace_id,
        "search": True,
        "number_of_replicas_override": expected,
    }
    enabled_root.refresh_from_db()
    assert enabled_root.number_of_replicas_override == expected


def test_patch_with_null_clears_the_override(api, indexing_enabled):
    enabled = EnabledNamespaceFactory(number_of_replicas_override=4)
    response = api.patch(
        f"{ADMIN}/namespaces/{enabled.root_namespace_id}",
        {"number_of_replicas_override": None},
        "json",
    )
    assert response.status_code == 200
    assert response.json()["number_of_replicas_override"] is None
    enabled.refresh_from_db()
    assert enabled.number_of_replicas_override is None


def test_patch_without_a_value_changes_nothing_as_in_gitlab(api, indexing_enabled):
    enabled = EnabledNamespaceFactory(number_of_replicas_override=2)
    response = api.patch(f"{ADMIN}/namespaces/{enabled.root_namespace_id}", {}, "json")
    assert response.status_code == 200
    assert response.json()["number_of_replicas_override"] == 2


def test_patch_on_a_subgroup_updates_its_roots_enabled_namespace(api, indexing_enabled):
    enabled = EnabledNamespaceFactory()
    subgroup = GroupFactory(parent=enabled.root_namespace)
    response = api.patch(f"{ADMIN}/namespaces/{subgroup.id}", {"number_of_replicas": 2}, "json")
    assert response.status_code == 200
    assert response.json()["namespace_id"] == enabled.root_namespace_id
    enabled.refresh_from_db()
    assert enabled.number_of_replicas_override == 2


def test_patch_finds_the_namespace_by_its_url_encoded_full_path(api, indexing_enabled):
    root = GroupFactory(path="gitlab-org")
    enabled = EnabledNamespaceFactory(root_namespace=root)
    GroupFactory(path="security", parent=root)
    response = api.patch(
        f"{ADMIN}/namespaces/gitlab-org%2FSecurity", {"number_of_replicas": 2}, "json"
    )
    assert response.status_code == 200, response.content
    enabled.refresh_from_db()
    assert enabled.number_of_replicas_override == 2


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        pytest.param(
            {"number_of_replicas_override": 0},
            "number_of_replicas_override",
            "greater than or equal to 1",
        ),
        pytest.param(
            {"number_of_replicas_override": -2},
            "number_of_replicas_override",
            "greater than or equal to 1",
        ),
        pytest.param({"number_of_replicas": "many"}, "number_of_replicas", "valid integer"),
        pytest.param(
            {"number_of_replicas_override": 2, "number_of_replicas": 3},
            "number_of_replicas",
            "not both",
        ),
        pytest.param({"replicas": 2}, "replicas", "Unknown field"),
    ],
)
def test_patch_refuses_a_bad_value_naming_the_field(
    api, indexing_enabled, enabled_root, body, field, message
):
    before = snapshot()
    response = api.patch(f"{ADMIN}/namespaces/{enabled_root.root_namespace_id}", body, "json")
    assert_error(response, 400, field, message)
    assert snapshot() == before


def test_patch_on_a_namespace_that_is_not_enabled_is_a_404(api, indexing_enabled):
    namespace = GroupFactory()
    response = api.patch(f"{ADMIN}/namespaces/{namespace.id}", {"number_of_replicas": 2}, "json")
    assert_error(response, 404, "id", "not enabled")


@pytest.mark.parametrize("ref", ["987654", "no-such-group", "no-such-group%2Fsub"])
def test_patch_on_a_missing_namespace_is_a_404(api, indexing_enabled, ref):
    response = api.patch(f"{ADMIN}/namespaces/{ref}", {"number_of_replicas": 2}, "json")
    assert_error(response, 404, "id", "not found")


def test_patch_needs_indexing_enabled(api, enabled_root):
    before = snapshot()
    response = api.patch(
        f"{ADMIN}/namespaces/{enabled_root.root_namespace_id}", {"number_of_replicas": 2}, "json"
    )
    assert_error(response, 400, "zoekt_indexing_enabled", INDEXING_DISABLED)
    assert snapshot() == before


# --- GET /admin/zoekt/shards --------------------------------------------------------------------


def test_listing_nodes_gives_id_and_both_urls_of_every_node(api):
    first = NodeFactory(index_base_url="http://zoekt-0:6065", search_base_url="http://zoekt-0:6070")
    second = NodeFactory(
        index_base_url="http://111.111.111.111/", search_base_url="http://111.111.111.112/"
    )
    response = api.get(f"{ADMIN}/shards")
    assert response.status_code == 200
    assert response.json() == [
        {
            "id": first.id,
            "index_base_url": "http://zoekt-0:6065",
            "search_base_url": "http://zoekt-0:6070",
        },
        {
            "id": second.id,
            "index_base_url": "http://111.111.111.111/",
            "search_base_url": "http://111.111.111.112/",
        },
    ]


def test_listing_nodes_of_an_empty_fleet_is_an_empty_list(api):
    assert api.get(f"{ADMIN}/shards").json() == []


# --- GET /admin/zoekt/shards/:node_id/indexed_namespaces ----------------------------------------


def test_indexed_namespaces_of_a_node_are_those_with_an_index_on_it_newest_first(api):
    node, other_node = NodeFactory(), NodeFactory()
    older = IndexFactory(zoekt_node=node).zoekt_enabled_namespace
    IndexFactory(zoekt_node=other_node)  # another node's namespace
    newer = IndexFactory(zoekt_node=node).zoekt_enabled_namespace
    response = api.get(f"{ADMIN}/shards/{node.id}/indexed_namespaces")
    assert response.status_code == 200
    body = response.json()
    assert [row["id"] for row in body] == [newer.id, older.id]
    assert body[1] == {
        "id": older.id,
        "zoekt_shard_id": node.id,
        "zoekt_node_id": node.id,
        "namespace_id": older.root_namespace_id,
        "search": True,
        "number_of_replicas_override": None,
    }


def test_indexed_namespaces_of_a_node_are_at_most_the_20_most_recent(api):
    node = NodeFactory()
    enabled = [IndexFactory(zoekt_node=node).zoekt_enabled_namespace for _ in range(21)]
    body = api.get(f"{ADMIN}/shards/{node.id}/indexed_namespaces").json()
    assert [row["id"] for row in body] == [e.id for e in reversed(enabled)][:20]


def test_indexed_namespaces_of_a_missing_node_is_a_404(api):
    assert_error(api.get(f"{ADMIN}/shards/987654/indexed_namespaces"), 404, "node_id", "987654")


# --- PUT /admin/zoekt/shards/:node_id/indexed_namespaces/:namespace_id ---------------------------


def test_enabling_on_a_node_creates_the_enabled_namespace_a_replica_and_a_ready_index(
    api, indexing_enabled
):
    node, namespace = NodeFactory(), GroupFactory()
    response = api.put(f"{ADMIN}/shards/{node.id}/indexed_namespaces/{namespace.id}")
    assert response.status_code == 200, response.content
    enabled = EnabledNamespace.objects.get(root_namespace=namespace)
    assert response.json() == {
        "id": enabled.id,
        "zoekt_shard_id": node.id,
        "zoekt_node_id": node.id,
        "namespace_id": namespace.id,
        "search": True,
        "number_of_replicas_override": None,
    }
    replica = Replica.objects.get(zoekt_enabled_namespace=enabled)
    index = Index.objects.get(zoekt_enabled_namespace=enabled)
    assert index.zoekt_node_id == node.id
    assert index.state == Index.State.READY
    assert index.zoekt_replica_id == replica.id
    assert index.namespace_id == namespace.id
    assert replica.namespace_id == namespace.id


def test_enabling_twice_finds_the_same_rows(api, indexing_enabled):
    node, namespace = NodeFactory(), GroupFactory()
    url = f"{ADMIN}/shards/{node.id}/indexed_namespaces/{namespace.id}"
    first = api.put(url).json()
    before = snapshot()
    second = api.put(url).json()
    assert first == second
    assert snapshot() == before


def test_enabling_attaches_the_index_to_the_namespaces_first_existing_replica(
    api, indexing_enabled
):
    enabled = EnabledNamespaceFactory()
    first = ReplicaFactory(zoekt_enabled_namespace=enabled)
    ReplicaFactory(zoekt_enabled_namespace=enabled)
    node = NodeFactory()
    response = api.put(f"{ADMIN}/shards/{node.id}/indexed_namespaces/{enabled.root_namespace_id}")
    assert response.json()["id"] == enabled.id
    assert Index.objects.get(zoekt_node=node).zoekt_replica_id == first.id
    assert Replica.objects.filter(zoekt_enabled_namespace=enabled).count() == 2


@pytest.mark.parametrize(
    ("query", "body", "expected"),
    [
        pytest.param("?search=false", None, False, id="query-false"),
        pytest.param("?search=true", None, True, id="query-true"),
        pytest.param("", {"search": False}, False, id="body-false"),
        pytest.param("", None, True, id="absent-means-default"),
    ],
)
def test_enabling_sets_search_from_the_query_or_the_body(
    api, indexing_enabled, query, body, expected
):
    namespace = GroupFactory()
    response = api.put(
        f"{ADMIN}/shards/0/indexed_namespaces/{namespace.id}{query}", body, format="json"
    )
    assert response.status_code == 200
    assert response.json()["search"] is expected
    assert EnabledNamespace.objects.get(root_namespace=namespace).search is expected


@pytest.mark.parametrize(
    ("stored", "query", "expected"),
    [
        pytest.param(False, "", False, id="absent-leaves-false"),
        pytest.param(False, "?search=true", True, id="true-turns-it-on"),
        pytest.param(True, "?search=false", False, id="false-turns-it-off"),
    ],
)
def test_enabling_an_enabled_namespace_changes_search_only_when_asked(
    api, indexing_enabled, stored, query, expected
):
    enabled = EnabledNamespaceFactory(search=stored)
    response = api.put(f"{ADMIN}/shards/0/indexed_namespaces/{enabled.root_namespace_id}{query}")
    assert response.json()["id"] == enabled.id
    enabled.refresh_from_db()
    assert enabled.search is expected


def test_enabling_with_node_0_creates_only_the_enabled_namespace(api, indexing_enabled):
    namespace = GroupFactory()
    response = api.put(f"{ADMIN}/shards/0/indexed_namespaces/{namespace.id}")
    assert response.status_code == 200
    assert response.json()["zoekt_node_id"] is None
    assert EnabledNamespace.objects.filter(root_namespace=namespace).count() == 1
    assert not Index.objects.exists()
    assert not Replica.objects.exists()


def test_enabling_a_namespace_that_is_not_a_root_is_a_400_naming_namespace_id(
    api, indexing_enabled
):
    subgroup = GroupFactory(parent=GroupFactory())
    node = NodeFactory()
    response = api.put(f"{ADMIN}/shards/{node.id}/indexed_namespaces/{subgroup.id}")
    assert_error(response, 400, "namespace_id", "not a root namespace")
    assert not EnabledNamespace.objects.exists()
    assert not Index.objects.exists()


@pytest.mark.parametrize(
    ("node_id", "namespace_id", "field"),
    [
        pytest.param(987654, None, "node_id", id="missing-node"),
        pytest.param(None, 987654, "namespace_id", id="missing-namespace"),
    ],
)
def test_enabling_with_a_missing_id_is_a_404(api, indexing_enabled, node_id, namespace_id, field):
    node_id = node_id or NodeFactory().id
    namespace_id = namespace_id or GroupFactory().id
    response = api.put(f"{ADMIN}/shards/{node_id}/indexed_namespaces/{namespace_id}")
    assert_error(response, 404, field, "not found")
    assert not EnabledNamespace.objects.exists()


def test_enabling_refuses_a_search_value_that_is_not_a_boolean(api, indexing_enabled):
    namespace = GroupFactory()
    response = api.put(f"{ADMIN}/shards/0/indexed_namespaces/{namespace.id}?search=maybe")
    assert_error(response, 400, "search", "valid boolean")
    assert not EnabledNamespace.objects.exists()


def test_enabling_needs_indexing_enabled(api):
    node, namespace = NodeFactory(), GroupFactory()
    response = api.put(f"{ADMIN}/shards/{node.id}/indexed_namespaces/{namespace.id}")
    assert_error(response, 400, "zoekt_indexing_enabled", INDEXING_DISABLED)
    assert not EnabledNamespace.objects.exists()


# --- DELETE /admin/zoekt/shards/:node_id/indexed_namespaces/:namespace_id ------------------------


@pytest.fixture
def two_node_namespace():
    """An enabled namespace with one replica made of an index on each of two nodes."""
    replica = ReplicaFactory()
    first = IndexFactory(zoekt_replica=replica, state=Index.State.READY)
    second = IndexFactory(zoekt_replica=replica, state=Index.State.READY)
    return replica.zoekt_enabled_namespace, first, second


def test_deleting_on_a_node_removes_that_nodes_index_and_the_enabled_namespace(
    api, two_node_namespace
):
    enabled, first, second = two_node_namespace
    url = f"{ADMIN}/shards/{first.zoekt_node_id}/indexed_namespaces/{enabled.root_namespace_id}"
    response = api.delete(url)
    assert response.status_code == 204
    assert response.content == b""
    assert not Index.objects.filter(id=first.id).exists()
    assert not EnabledNamespace.objects.filter(id=enabled.id).exists()
    assert not Replica.objects.exists()
    # The other node's index lost its namespace and replica: the orphan check takes it from here.
    second.refresh_from_db()
    assert (second.zoekt_enabled_namespace_id, second.zoekt_replica_id) == (None, None)


def test_deleting_with_node_0_removes_the_indices_on_every_node(api, two_node_namespace):
    enabled, first, second = two_node_namespace
    response = api.delete(f"{ADMIN}/shards/0/indexed_namespaces/{enabled.root_namespace_id}")
    assert response.status_code == 204
    assert not Index.objects.filter(id__in=[first.id, second.id]).exists()
    assert not EnabledNamespace.objects.exists()


def test_deleting_an_index_that_holds_repositories_leaves_it_to_the_deletion_pipeline(
    api, two_node_namespace
):
    enabled, first, second = two_node_namespace
    repository = RepositoryFactory(zoekt_index=first, state=Repository.State.READY)
    response = api.delete(f"{ADMIN}/shards/0/indexed_namespaces/{enabled.root_namespace_id}")
    assert response.status_code == 204
    first.refresh_from_db()
    assert first.state == Index.State.PENDING_DELETION
    assert (first.zoekt_enabled_namespace_id, first.zoekt_replica_id) == (None, None)
    assert Repository.objects.get(id=repository.id).zoekt_index_id == first.id
    assert not Index.objects.filter(id=second.id).exists()
    assert not EnabledNamespace.objects.exists()


def test_deleting_a_namespace_that_is_not_enabled_is_a_204_that_changes_nothing(api):
    IndexFactory()
    namespace = GroupFactory()
    before = snapshot()
    response = api.delete(f"{ADMIN}/shards/0/indexed_namespaces/{namespace.id}")
    assert response.status_code == 204
    assert snapshot() == before


def test_deleting_needs_no_indexing_enabled_setting(api, two_node_namespace):
    enabled, _, _ = two_node_namespace
    response = api.delete(f"{ADMIN}/shards/0/indexed_namespaces/{enabled.root_namespace_id}")
    assert response.status_code == 204
    assert not EnabledNamespace.objects.exists()


@pytest.mark.parametrize(
    ("missing", "field"),
    [pytest.param("node", "node_id", id="missing-node"), pytest.param("ns", "namespace_id")],
)
def test_deleting_with_a_missing_id_is_a_404_that_changes_nothing(
    api, two_node_namespace, missing, field
):
    enabled, first, _ = two_node_namespace
    node_id = 987654 if missing == "node" else first.zoekt_node_id
    namespace_id = 987654 if missing == "ns" else enabled.root_namespace_id
    before = snapshot()
    response = api.delete(f"{ADMIN}/shards/{node_id}/indexed_namespaces/{namespace_id}")
    assert_error(response, 404, field, "not found")
    assert snapshot() == before


# --- the OpenAPI schema --------------------------------------------------------------------------

OPERATOR_PATHS = {
    "/api/v4/admin/zoekt/projects/{project_id}/index": {"put"},
    "/api/v4/admin/zoekt/namespaces/{namespace_ref}": {"patch"},
    "/api/v4/admin/zoekt/shards": {"get"},
    "/api/v4/admin/zoekt/shards/{node_id}/indexed_namespaces": {"get"},
    "/api/v4/admin/zoekt/shards/{node_id}/indexed_namespaces/{namespace_id}": {"put", "delete"},
    "/api/v1/catalog/bulk_upsert": {"post"},
    "/api/v1/nodes/{node_id}/shutdown": {"put", "get", "delete"},
    "/api/v1/nodes/{node_id}": {"patch"},
    "/api/v1/zones/{zone}/shutdown": {"put", "get", "delete"},
}
REQUEST_BODIES = {
    ("/api/v4/admin/zoekt/namespaces/{namespace_ref}", "patch"),
    ("/api/v4/admin/zoekt/shards/{node_id}/indexed_namespaces/{namespace_id}", "put"),
    ("/api/v1/catalog/bulk_upsert", "post"),
    ("/api/v1/nodes/{node_id}/shutdown", "put"),
    ("/api/v1/nodes/{node_id}", "patch"),
    ("/api/v1/zones/{zone}/shutdown", "put"),
}


def test_the_schema_is_served_to_an_operator_and_is_valid_openapi(api):
    response = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    validate_schema(schema)
    for path, methods in OPERATOR_PATHS.items():
        assert methods <= set(schema["paths"][path]), path
        for method in methods:
            operation = schema["paths"][path][method]
            assert {"tokenAuth": []} in operation["security"]
            assert {"cookieAuth": []} in operation["security"]
    for path, method in REQUEST_BODIES:
        body = schema["paths"][path][method]["requestBody"]["content"]["application/json"]
        assert body["examples"], (path, method)


def test_the_catalog_example_is_a_batch_the_endpoint_accepts(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    examples = schema["paths"]["/api/v1/catalog/bulk_upsert"]["post"]["requestBody"]["content"][
        "application/json"
    ]["examples"]
    response = api.post(
        "/api/v1/catalog/bulk_upsert", examples["AGroupWithOneProject"]["value"], format="json"
    )
    assert response.status_code == 200, response.content
    assert Namespace.objects.get(id=13083).traversal_ids == [9970, 13083]


def test_the_operator_endpoints_document_themselves_without_a_single_warning():
    GENERATOR_STATS.reset()
    generator = SchemaGenerator(patterns=operator_urls.urlpatterns)
    schema = generator.get_schema(request=None, public=True)
    validate_schema(schema)
    assert not GENERATOR_STATS._warn_cache, dict(GENERATOR_STATS._warn_cache)
    assert not GENERATOR_STATS._error_cache, dict(GENERATOR_STATS._error_cache)
    assert set(schema["paths"]) == set(OPERATOR_PATHS)


def test_the_operator_routes_are_mounted_at_gitlabs_paths():
    names = {
        name
        for name in get_resolver().reverse_dict
        if isinstance(name, str) and name.startswith(("zoekt-admin", "catalog"))
    }
    assert names == {
        "zoekt-admin-index-project",
        "zoekt-admin-namespace",
        "zoekt-admin-shards",
        "zoekt-admin-indexed-namespaces",
        "zoekt-admin-indexed-namespace",
        "catalog-bulk-upsert",
    }
