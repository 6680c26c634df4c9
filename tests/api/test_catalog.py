"""The catalog bulk upsert: how a GitLab-like source of truth feeds namespaces, projects
and project statistics in (``POST /api/v1/catalog/bulk_upsert``).

A good batch is written whole, in one transaction, with a number of queries
that does not grow with its rows. A batch with any bad row is refused naming
every bad row and field, and the database is left exactly as it was: a 400 when
a row breaks the schema or the batch repeats itself (``catalog.check_rows``, no
database), a 409 when well-formed rows do not fit the stored catalog.
"""

from __future__ import annotations

import copy

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.api.helpers import ERROR_KEYS
from tests.factories import GroupFactory
from zoekt import catalog
from zoekt.models import (
    ForkNetworkMember,
    Namespace,
    NamespaceRootStorageStatistics,
    Project,
    ProjectFeature,
    ProjectStatistics,
)

pytestmark = pytest.mark.django_db

URL = "/api/v1/catalog/bulk_upsert"
GIB = 1024**3


@pytest.fixture
def api() -> APIClient:
    user = get_user_model().objects.create_user("feeder", password="pw-12345678", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


# --- rows in GitLab's shapes ---------------------------------------------------------------------


def ns(nid: int, parent: int | None = None, type: str = "Group", **extra) -> dict:
    row = {
        "id": nid,
        "name": f"Namespace {nid}",
        "path": f"ns-{nid}",
        "type": type,
        "parent_id": parent,
        "visibility_level": 20,
        "archived": False,
    }
    row.update(extra)
    return row


def project(pid: int, namespace_id: int, project_namespace_id: int, **extra) -> dict:
    row = {
        "id": pid,
        "name": f"Project {pid}",
        "path": f"project-{pid}",
        "namespace_id": namespace_id,
        "project_namespace_id": project_namespace_id,
        "visibility_level": 0,
        "archived": False,
        "repository_storage": "default",
        "repository_access_level": 20,
        "forked_from_project_id": None,
    }
    row.update(extra)
    return row


def stats(pid: int, repository_size: int, storage_size: int) -> dict:
    return {"project_id": pid, "repository_size": repository_size, "storage_size": storage_size}


def group_batch(root: int, projects: int, *, first_project: int | None = None) -> dict:
    """A root group with ``projects`` projects, each with its namespace and statistics."""
    first_project = first_project or root * 10
    namespaces = [ns(root)]
    project_rows, stat_rows = [], []
    for k in range(projects):
        pn = root + 1 + k
        pid = first_project + k
        namespaces.append(ns(pn, root, "Project"))
        project_rows.append(project(pid, root, pn))
        stat_rows.append(stats(pid, (k + 1) * GIB, (k + 2) * GIB))
    return {"namespaces": namespaces, "projects": project_rows, "project_statistics": stat_rows}


def catalog_snapshot() -> dict:
    return {
        model._meta.db_table: list(model.objects.order_by("pk").values())
        for model in (
            Namespace,
            Project,
            ProjectFeature,
            ForkNetworkMember,
            ProjectStatistics,
            NamespaceRootStorageStatistics,
        )
    }


def root_totals(root_id: int) -> tuple[int, int]:
    row = NamespaceRootStorageStatistics.objects.get(namespace_id=root_id)
    return row.repository_size, row.storage_size


def upsert(api, batch) -> dict:
    response = api.post(URL, batch, format="json")
    assert response.status_code == 200, response.content
    return response.json()


# --- writing a good batch ------------------------------------------------------------------------


def test_a_new_group_with_subgroups_and_projects_is_written_whole(api):
    batch = {
        "namespaces": [
            ns(100),
            ns(101, 100),
            ns(102, 101),
            ns(103, 102, "Project"),
            ns(104, 100, "Project"),
        ],
        "projects": [
            project(500, 102, 103, visibility_level=10, archived=True, repository_access_level=10),
            project(501, 100, 104, forked_from_project_id=500),
        ],
        "project_statistics": [stats(500, 3 * GIB, 5 * GIB), stats(501, 1 * GIB, 2 * GIB)],
    }
    reply = upsert(api, batch)
    assert reply == {
        "namespaces": {"created": 5, "updated": 0, "descendants_updated": 0},
        "projects": {"created": 2, "updated": 0},
        "project_statistics": {"created": 2, "updated": 0},
        "namespace_root_storage_statistics": {"refreshed": 1},
    }
    traversal = dict(Namespace.objects.values_list("id", "traversal_ids"))
    assert traversal == {
        100: [100],
        101: [100, 101],
        102: [100, 101, 102],
        103: [100, 101, 102, 103],
        104: [100, 104],
    }
    first = Project.objects.get(id=500)
    assert (first.namespace_id, first.project_namespace_id) == (102, 103)
    assert (first.visibility_level, first.archived, first.repository_storage) == (
        10,
        True,
        "default",
    )
    assert ProjectFeature.objects.get(project_id=500).repository_access_level == 10
    assert ForkNetworkMember.objects.get(project_id=501).forked_from_project_id == 500
    assert not ForkNetworkMember.objects.filter(project_id=500).exists()
    assert ProjectStatistics.objects.get(project_id=500).namespace_id == 102
    assert root_totals(100) == (4 * GIB, 7 * GIB)


def test_rows_may_come_in_any_order_children_before_parents(api):
    batch = {
        "namespaces": [ns(203, 202, "Project"), ns(202, 201), ns(201)],
        "projects": [project(700, 202, 203)],
        "project_statistics": [stats(700, 10, 20)],
    }
    upsert(api, batch)
    assert Namespace.objects.get(id=203).traversal_ids == [201, 202, 203]
    assert root_totals(201) == (10, 20)


def test_a_second_batch_updates_the_same_rows_and_says_so(api):
    upsert(api, group_batch(100, 2))
    batch = group_batch(100, 2)
    batch["namespaces"][0]["name"] = "Renamed"
    batch["projects"][1]["archived"] = True
    batch["project_statistics"][0]["repository_size"] = 7
    reply = upsert(api, batch)
    assert reply["namespaces"] == {"created": 0, "updated": 3, "descendants_updated": 0}
    assert reply["projects"] == {"created": 0, "updated": 2}
    assert reply["project_statistics"] == {"created": 0, "updated": 2}
    assert Namespace.objects.get(id=100).name == "Renamed"
    assert Project.objects.get(id=1001).archived is True
    assert root_totals(100) == (7 + 2 * GIB, 2 * GIB + 3 * GIB)
    assert Namespace.objects.count() == 3


def test_rows_may_refer_to_rows_already_in_the_database(api):
    upsert(api, {"namespaces": [ns(100), ns(101, 100)]})
    reply = upsert(
        api,
        {
            "namespaces": [ns(102, 101, "Project")],
            "projects": [project(500, 101, 102)],
            "project_statistics": [stats(500, 5, 6)],
        },
    )
    assert reply["namespaces"]["created"] == 1
    assert Namespace.objects.get(id=102).traversal_ids == [100, 101, 102]
    assert root_totals(100) == (5, 6)


def test_statistics_alone_update_the_root_totals(api):
    upsert(api, group_batch(100, 2))
    reply = upsert(api, {"project_statistics": [stats(1000, 100, 200)]})
    assert reply["project_statistics"] == {"created": 0, "updated": 1}
    assert reply["namespace_root_storage_statistics"] == {"refreshed": 1}
    assert root_totals(100) == (100 + 2 * GIB, 200 + 3 * GIB)


def test_moving_a_subgroup_rewrites_its_database_descendants_and_both_roots_totals(api):
    upsert(
        api,
        {
            "namespaces": [
                ns(1),
                ns(2, 1),
                ns(3, 2),
                ns(4, 3, "Project"),
                ns(9),
            ],
            "projects": [project(40, 3, 4)],
            "project_statistics": [stats(40, 11, 22)],
        },
    )
    assert root_totals(1) == (11, 22)
    reply = upsert(api, {"namespaces": [ns(2, 9)]})
    assert reply["namespaces"] == {"created": 0, "updated": 1, "descendants_updated": 2}
    traversal = dict(Namespace.objects.values_list("id", "traversal_ids"))
    assert traversal[2] == [9, 2]
    assert traversal[3] == [9, 2, 3]
    assert traversal[4] == [9, 2, 3, 4]
    assert root_totals(1) == (0, 0)
    assert root_totals(9) == (11, 22)


def test_a_root_that_gains_a_parent_loses_its_root_totals(api):
    upsert(api, group_batch(100, 1))
    upsert(api, {"namespaces": [ns(50)]})
    assert NamespaceRootStorageStatistics.objects.filter(namespace_id=100).exists()
    upsert(api, {"namespaces": [ns(100, 50)]})
    assert not NamespaceRootStorageStatistics.objects.filter(namespace_id=100).exists()
    assert root_totals(50) == (1 * GIB, 2 * GIB)
    assert Namespace.objects.get(id=101).traversal_ids == [50, 100, 101]


def test_moving_a_project_to_another_root_moves_its_statistics(api):
    upsert(api, group_batch(100, 1))
    upsert(api, {"namespaces": [ns(300)]})
    upsert(
        api,
        {"namespaces": [ns(101, 300, "Project")], "projects": [project(1000, 300, 101)]},
    )
    assert ProjectStatistics.objects.get(project_id=1000).namespace_id == 300
    assert root_totals(100) == (0, 0)
    assert root_totals(300) == (1 * GIB, 2 * GIB)


def test_a_project_sent_without_statistics_gets_no_statistics_row(api):
    upsert(
        api, {"namespaces": [ns(100), ns(101, 100, "Project")], "projects": [project(7, 100, 101)]}
    )
    assert not ProjectStatistics.objects.filter(project_id=7).exists()
    assert root_totals(100) == (0, 0)


def test_a_removal_leaves_each_root_the_totals_of_what_remains(api):
    namespaces = [ns(1), ns(2, 1), ns(3, 2, "Project"), ns(4, 1, "Project")]
    namespaces += [ns(5, 1, "Project"), ns(9), ns(10, 9, "Project")]
    projects = [project(30, 2, 3), project(40, 1, 4), project(50, 1, 5), project(90, 9, 10)]
    sizes = [stats(30, 11, 22), stats(40, 100, 200), stats(50, 1, 2), stats(90, 7, 8)]
    upsert(api, {"namespaces": namespaces, "projects": projects, "project_statistics": sizes})
    assert root_totals(1) == (112, 224)

    removed = catalog.do_remove_catalog_objects(project_ids=[40], namespace_ids=[2])

    assert removed == {
        "projects": 1,
        "namespaces": 1,
        "project_namespaces": 1,
        "namespace_root_storage_statistics": {"refreshed": 1},
    }
    assert set(Project.objects.values_list("id", flat=True)) == {50, 90}
    assert not Namespace.objects.filter(id__in=[2, 3, 4]).exists()
    assert root_totals(1) == (1, 2)  # what remains: project 50
    assert root_totals(9) == (7, 8)
    catalog.do_remove_catalog_objects(namespace_ids=[9])
    assert not NamespaceRootStorageStatistics.objects.filter(namespace_id=9).exists()


def test_a_removal_of_what_the_catalog_lacks_or_of_a_project_namespace_changes_nothing(api):
    upsert(api, group_batch(100, 2))
    before = catalog_snapshot()
    removed = catalog.do_remove_catalog_objects(project_ids=[12_345], namespace_ids=[101, 777])
    assert removed["projects"] == removed["namespaces"] == removed["project_namespaces"] == 0
    assert catalog_snapshot() == before


def test_a_project_that_is_no_longer_a_fork_loses_its_fork_source(api):
    upsert(api, group_batch(100, 2))
    batch = group_batch(100, 2)
    batch["projects"][1]["forked_from_project_id"] = 1000
    upsert(api, batch)
    assert ForkNetworkMember.objects.get(project_id=1001).forked_from_project_id == 1000
    batch["projects"][1]["forked_from_project_id"] = None
    upsert(api, batch)
    assert ForkNetworkMember.objects.get(project_id=1001).forked_from_project_id is None


def test_an_empty_batch_writes_nothing_and_says_so(api):
    before = catalog_snapshot()
    assert upsert(api, {}) == {
        "namespaces": {"created": 0, "updated": 0, "descendants_updated": 0},
        "projects": {"created": 0, "updated": 0},
        "project_statistics": {"created": 0, "updated": 0},
        "namespace_root_storage_statistics": {"refreshed": 0},
    }
    assert catalog_snapshot() == before


def test_ids_from_the_source_do_not_collide_with_rows_made_here_later(api):
    upsert(api, group_batch(5000, 1))
    group = GroupFactory()
    assert group.id > 5001


# --- rejecting a bad batch -----------------------------------------------------------------------


@pytest.fixture
def database_catalog(api):
    """Already stored: root 1 > subgroup 2 > project namespace 3 of project 30; user 8."""
    upsert(
        api,
        {
            "namespaces": [ns(1), ns(2, 1), ns(3, 2, "Project"), ns(8, type="User")],
            "projects": [project(30, 2, 3)],
            "project_statistics": [stats(30, 100, 200)],
        },
    )


def good_batch() -> dict:
    """Root 100 > subgroup 101 > project namespace 102 of project 500, with statistics."""
    return {
        "namespaces": [ns(100), ns(101, 100), ns(102, 101, "Project")],
        "projects": [project(500, 101, 102)],
        "project_statistics": [stats(500, 10, 20)],
    }


def setting(table: str, index: int, field: str, value):
    def change(batch):
        batch[table][index][field] = value

    return change


def removing(table: str, index: int, field: str):
    def change(batch):
        del batch[table][index][field]

    return change


def adding(table: str, row: dict):
    def change(batch):
        batch[table].append(row)

    return change


def both(*changes):
    def change(batch):
        for one in changes:
            one(batch)

    return change


def nesting(levels: int):
    """Groups 110, 111, ... each below the last, under subgroup 101 (itself 1 level deep)."""

    def change(batch):
        parent = 101
        for nid in range(110, 110 + levels):
            batch["namespaces"].append(ns(nid, parent))
            parent = nid

    return change


BAD_BATCHES = [
    # --- types and ranges
    pytest.param(setting("namespaces", 1, "id", "101"), "namespaces[1].id", "valid integer",
                 id="id-as-string"),
    pytest.param(setting("namespaces", 1, "id", 0), "namespaces[1].id",
                 "greater than or equal to 1", id="id-zero"),
    pytest.param(setting("namespaces", 0, "id", 2**63), "namespaces[0].id", "less than or equal to",
                 id="id-past-bigint"),
    pytest.param(removing("namespaces", 0, "name"), "namespaces[0].name", "required",
                 id="name-missing"),
    pytest.param(setting("namespaces", 0, "name", ""), "namespaces[0].name", "blank",
                 id="name-blank"),
    pytest.param(setting("namespaces", 0, "path", "p" * 256), "namespaces[0].path", "255",
                 id="path-too-long"),
    pytest.param(setting("namespaces", 0, "name", 7), "namespaces[0].name", "valid string",
                 id="name-as-number"),
    pytest.param(setting("namespaces", 0, "type", "Team"), "namespaces[0].type", "valid choice",
                 id="unknown-type"),
    pytest.param(setting("namespaces", 0, "visibility_level", 5),
                 "namespaces[0].visibility_level", "valid choice", id="visibility-5"),
    pytest.param(setting("namespaces", 0, "visibility_level", "20"),
                 "namespaces[0].visibility_level", "valid choice", id="visibility-as-string"),
    pytest.param(setting("namespaces", 0, "archived", "false"), "namespaces[0].archived",
                 "valid boolean", id="archived-as-string"),
    pytest.param(setting("namespaces", 0, "archived", 0), "namespaces[0].archived",
                 "valid boolean", id="archived-as-number"),
    pytest.param(setting("namespaces", 0, "owner_id", 3), "namespaces[0].owner_id",
                 "Unknown field", id="unknown-namespace-field"),
    pytest.param(setting("projects", 0, "repository_access_level", 30),
                 "projects[0].repository_access_level", "valid choice", id="access-level-30"),
    pytest.param(setting("projects", 0, "repository_storage", "nfs-9"),
                 "projects[0].repository_storage", "Unknown repository storage",
                 id="unknown-storage"),
    pytest.param(removing("projects", 0, "forked_from_project_id"),
                 "projects[0].forked_from_project_id", "required", id="fork-column-missing"),
    pytest.param(setting("project_statistics", 0, "repository_size", -1),
                 "project_statistics[0].repository_size", "greater than or equal to 0",
                 id="negative-size"),
    pytest.param(setting("project_statistics", 0, "repository_size", 2**50 + 1),
                 "project_statistics[0].repository_size", "less than or equal to",
                 id="size-over-a-pebibyte"),
    pytest.param(setting("project_statistics", 0, "storage_size", 1.5),
                 "project_statistics[0].storage_size", "valid integer", id="fractional-size"),
    # --- duplicates and self references
    pytest.param(adding("namespaces", ns(101, 100)), "namespaces[3].id",
                 "also in namespaces[1]", id="duplicate-namespace"),
    pytest.param(adding("projects", project(500, 101, 102)), "projects[1].id",
                 "also in projects[0]", id="duplicate-project"),
    pytest.param(adding("project_statistics", stats(500, 1, 1)), "project_statistics[1].project_id",
                 "also in project_statistics[0]", id="duplicate-statistics"),
    pytest.param(setting("namespaces", 1, "parent_id", 101), "namespaces[1].parent_id",
                 "its own parent", id="own-parent"),
    pytest.param(setting("projects", 0, "forked_from_project_id", 500),
                 "projects[0].forked_from_project_id", "forked from itself", id="own-fork"),
    # --- references
    pytest.param(setting("namespaces", 1, "parent_id", 4242), "namespaces[1].parent_id",
                 "Namespace 4242 is neither", id="unknown-parent"),
    pytest.param(both(setting("namespaces", 0, "parent_id", 101)), "namespaces[0].parent_id",
                 "loops back", id="cycle-in-batch"),
    pytest.param(adding("namespaces", ns(1, 2)), "namespaces[3].parent_id", "loops back",
                 id="cycle-through-database"),
    pytest.param(adding("namespaces", ns(9, 8)), "namespaces[3].parent_id", "must be a Group",
                 id="group-under-user"),
    pytest.param(adding("namespaces", ns(9, 3)), "namespaces[3].parent_id",
                 "cannot be a parent", id="group-under-project-namespace"),
    pytest.param(adding("namespaces", ns(9, 1, "User")), "namespaces[3].parent_id",
                 "User namespace is a root", id="user-with-parent"),
    pytest.param(setting("namespaces", 2, "parent_id", None), "namespaces[2].parent_id",
                 "needs a parent", id="project-namespace-without-parent"),
    pytest.param(adding("namespaces", ns(2, 1, "Project")), "namespaces[3].type",
                 "cannot change", id="type-change"),
    pytest.param(adding("namespaces", ns(3, 1, "Project")), "namespaces[3].parent_id",
                 "send the project in the same batch", id="project-namespace-moved-alone"),
    pytest.param(setting("projects", 0, "namespace_id", 4242), "projects[0].namespace_id",
                 "Namespace 4242 is neither", id="unknown-namespace"),
    pytest.param(setting("projects", 0, "namespace_id", 102), "projects[0].namespace_id",
                 "is a Project namespace", id="project-in-a-project-namespace"),
    pytest.param(setting("projects", 0, "project_namespace_id", 4242),
                 "projects[0].project_namespace_id", "Namespace 4242 is neither",
                 id="unknown-project-namespace"),
    pytest.param(setting("projects", 0, "project_namespace_id", 101),
                 "projects[0].project_namespace_id", "not a Project namespace",
                 id="project-namespace-is-a-group"),
    pytest.param(setting("projects", 0, "namespace_id", 100), "projects[0].project_namespace_id",
                 "not the project's namespace 100", id="project-namespace-elsewhere"),
    pytest.param(both(setting("projects", 0, "project_namespace_id", 3),
                      setting("projects", 0, "namespace_id", 2)),
                 "projects[0].project_namespace_id", "already the project namespace of project 30",
                 id="project-namespace-taken"),
    pytest.param(adding("projects", project(501, 101, 102)), "projects[1].project_namespace_id",
                 "also in projects[0]", id="project-namespace-twice"),
    pytest.param(both(adding("namespaces", ns(103, 2, "Project")),
                      adding("projects", project(30, 2, 103))),
                 "projects[1].project_namespace_id", "cannot change",
                 id="project-namespace-replaced"),
    pytest.param(setting("projects", 0, "forked_from_project_id", 4242),
                 "projects[0].forked_from_project_id", "Project 4242 is neither",
                 id="unknown-fork-source"),
    pytest.param(setting("project_statistics", 0, "project_id", 4242),
                 "project_statistics[0].project_id", "Project 4242 is neither",
                 id="statistics-of-unknown-project"),
    pytest.param(nesting(20), "namespaces[22].parent_id", "at most 20 ancestors",
                 id="group-21-levels-deep"),
]  # fmt: skip


def expected_status(batch: dict) -> int:
    """400 for a batch refused without the database (its rows' shapes, or the batch against
    itself), 409 for one refused against the stored catalog."""
    try:
        catalog.check_rows(
            batch.get("namespaces", []),
            batch.get("projects", []),
            batch.get("project_statistics", []),
        )
    except catalog.Rejected:
        return 400
    return 409


def test_both_kinds_of_refusal_are_in_the_matrix():
    statuses = set()
    for case in BAD_BATCHES:
        batch = copy.deepcopy(good_batch())
        case.values[0](batch)
        statuses.add(expected_status(batch))
    assert statuses == {400, 409}


@pytest.mark.parametrize(("change", "key", "message"), BAD_BATCHES)
def test_a_bad_row_rejects_the_whole_batch_naming_row_and_field(
    api, database_catalog, change, key, message
):
    batch = copy.deepcopy(good_batch())
    change(batch)
    before = catalog_snapshot()
    response = api.post(URL, batch, format="json")
    assert response.status_code == expected_status(batch), response.content
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert key in body["errors"], body["errors"]
    assert any(message in m for m in body["errors"][key]), body["errors"][key]
    assert body["error"].startswith(f"{next(iter(body['errors']))}: ")
    assert catalog_snapshot() == before


@pytest.mark.parametrize(("change", "key", "message"), BAD_BATCHES)
def test_the_catalogs_own_path_rejects_a_bad_row_as_the_api_does(
    api, database_catalog, change, key, message
):
    """``zoekt.catalog.bulk_upsert``, the GitLab sync's path without HTTP, names the same
    rows, fields and messages as the bulk API, and writes nothing either."""
    batch = copy.deepcopy(good_batch())
    change(batch)
    answered = api.post(URL, copy.deepcopy(batch), format="json").json()["errors"]
    before = catalog_snapshot()
    with pytest.raises(catalog.Rejected) as rejected:
        catalog.bulk_upsert(
            batch.get("namespaces", []), batch.get("projects", []), batch["project_statistics"]
        )
    assert rejected.value.errors == answered
    assert catalog_snapshot() == before


def test_the_good_batch_of_the_matrix_is_accepted(api, database_catalog):
    upsert(api, good_batch())


def test_a_group_20_levels_below_its_root_is_accepted(api, database_catalog):
    batch = good_batch()
    nesting(19)(batch)
    upsert(api, batch)
    assert len(Namespace.objects.get(id=128).traversal_ids) == 21


def test_every_bad_row_is_named_in_row_order(api, database_catalog):
    batch = good_batch()
    batch["namespaces"].append(ns(9, 4242))
    batch["projects"][0]["namespace_id"] = 4243
    batch["project_statistics"][0]["project_id"] = 4244
    batch["namespaces"][1]["parent_id"] = 4245
    before = catalog_snapshot()
    response = api.post(URL, batch, format="json")
    assert response.status_code == 409
    body = response.json()
    assert list(body["errors"]) == [
        "namespaces[1].parent_id",
        "namespaces[3].parent_id",
        "projects[0].namespace_id",
        "projects[0].project_namespace_id",
        "project_statistics[0].project_id",
    ]
    assert body["error"] == (
        "namespaces[1].parent_id: Namespace 4245 is neither in this batch nor in the database."
    )
    assert catalog_snapshot() == before


@pytest.mark.parametrize(
    ("body", "key"),
    [
        pytest.param([], "non_field_errors", id="a-list"),
        pytest.param({"namespaces": {"id": 1}}, "namespaces.non_field_errors", id="not-a-list"),
        pytest.param({"groups": []}, "groups", id="unknown-table"),
    ],
)
def test_a_body_of_the_wrong_shape_is_refused(api, body, key):
    before = catalog_snapshot()
    response = api.post(URL, body, format="json")
    assert response.status_code == 400
    assert key in response.json()["errors"]
    assert catalog_snapshot() == before


def test_a_body_that_is_not_json_is_refused(api):
    response = api.post(URL, "namespaces=1", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert set(response.json()) == ERROR_KEYS


def test_a_table_of_more_than_10000_rows_is_refused(api):
    rows = [{"project_id": k, "repository_size": 0, "storage_size": 0} for k in range(1, 10_002)]
    response = api.post(URL, {"project_statistics": rows}, format="json")
    assert response.status_code == 400
    assert "project_statistics.non_field_errors" in response.json()["errors"]


# --- the number of queries does not grow with the rows -------------------------------------------


def queries_for(api, batch) -> int:
    with CaptureQueriesContext(connection) as captured:
        upsert(api, batch)
    return len(captured)


def test_a_new_batch_of_50_rows_takes_as_many_queries_as_one_of_5(api):
    small = queries_for(api, group_batch(100, 5))
    large = queries_for(api, group_batch(1000, 50, first_project=20_000))
    assert small == large


def test_updating_and_moving_50_rows_takes_as_many_queries_as_5(api):
    upsert(api, group_batch(100, 5))
    upsert(api, group_batch(1000, 50, first_project=20_000))
    upsert(api, {"namespaces": [ns(90), ns(91)]})

    def moved(batch: dict, new_root: int) -> dict:
        batch = copy.deepcopy(batch)
        for row in batch["namespaces"][1:]:
            row["parent_id"] = new_root
        for row in batch["projects"]:
            row["namespace_id"] = new_root
        batch["namespaces"] = batch["namespaces"][1:]
        return batch

    small = queries_for(api, moved(group_batch(100, 5), 90))
    large = queries_for(api, moved(group_batch(1000, 50, first_project=20_000), 91))
    assert small == large
    assert root_totals(91) == (sum(range(1, 51)) * GIB, sum(range(2, 52)) * GIB)
    assert root_totals(1000) == (0, 0)
