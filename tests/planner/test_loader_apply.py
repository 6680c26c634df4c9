"""The database becomes a scenario (loader), and a plan becomes rows (apply, reference 5.4)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from planner.apply import ProvisioningService, index_metadata
from planner.core import plan_dict
from planner.loader import load_scenario, process_health
from planner.scenario import parse_scenario
from planner.selection import SelectionService
from tests.factories import (
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ProjectFactory,
    ReplicaFactory,
    ReplicalessIndexFactory,
)
from zoekt import buffer_factor, shutdowns
from zoekt.models import EnabledNamespace, Index, Namespace, Node, Replica

pytestmark = pytest.mark.django_db


def node(unclaimed: int, **kwargs) -> Node:
    """An online search node with ``unclaimed`` usable bytes and nothing reserved."""
    return NodeFactory(total_bytes=unclaimed, used_bytes=0, indexed_bytes=0, **kwargs)


def enabled_group(*sizes: int | None, **kwargs) -> tuple[EnabledNamespace, list]:
    """An enabled root group with one project per size (None: no statistics row)."""
    group = GroupFactory()
    namespace = EnabledNamespaceFactory(root_namespace=group, **kwargs)
    projects = [ProjectFactory(namespace=group, repository_size=size) for size in sizes]
    return namespace, projects


def scenario(**options) -> dict:
    options.setdefault("buffer_factor", 3)
    return load_scenario(SelectionService().execute(), **options)


def plan_now() -> dict:
    return plan_dict(scenario())


def rows_of(namespace: EnabledNamespace) -> tuple[int, int]:
    return (
        Replica.objects.filter(zoekt_enabled_namespace=namespace).count(),
        Index.objects.filter(zoekt_enabled_namespace=namespace).count(),
    )


# --- loader ------------------------------------------------------------------------------------


def test_the_loader_builds_the_contract_scenario_from_the_database(now):
    health = {
        "indexer": {"rss_bytes": 1},
        "webserver": {"rss_bytes": 4096, "shards_loaded": 7, "mmap_current": 3},
    }
    roomy = node(5000, metadata={"name": "a", "process_health": health})
    small = node(1000, metadata={"name": "b"})
    first, (p1, p2) = enabled_group(100, None)
    subgroup = GroupFactory(parent=first.root_namespace)
    deep = ProjectFactory(namespace=subgroup, repository_size=50)
    second, _ = enabled_group(number_of_replicas_override=2)
    pending = ReplicaFactory(zoekt_enabled_namespace=second)
    ready = ReplicaFactory(zoekt_enabled_namespace=second, state=Replica.State.READY)
    third = ReplicaFactory(zoekt_enabled_namespace=second)
    satisfied, _ = enabled_group(300)  # has its one replica: not selected
    ReplicaFactory(zoekt_enabled_namespace=satisfied)
    ProjectFactory(repository_size=999)  # a project of a group that is not enabled

    loaded = scenario()

    assert loaded == {
        "options": {
            "buffer_factor": 3,
            "max_indices_per_replica": 10,
            "strategy": "balanced",
            # The product's balanced placement: largest first, a quarter of a node per index.
            "order": "largest_first",
            "max_index_storage_fraction": 0.25,
            # Memory planning is off until the budget setting is set (docs/memory.md).
            "memory": {
                "node_memory_budget_bytes": None,
                "memory_ratio": 0.5,
                "concurrency_factor": 4,
            },
        },
        "nodes": [
            {
                "id": roomy.id,
                "name": "a",
                "unclaimed_storage_bytes": 5000,
                "total_bytes": 5000,
                "memory_budget_bytes": None,
                "process_health": {"webserver": {"rss_bytes": 4096, "shards_loaded": 7}},
            },
            {
                "id": small.id,
                "name": "b",
                "unclaimed_storage_bytes": 1000,
                "total_bytes": 1000,
                "memory_budget_bytes": None,
                "process_health": None,
            },
        ],
        "namespaces": [
            {
                "enabled_namespace_id": first.id,
                "namespace_id": first.root_namespace_id,
                "number_of_replicas": 1,
                "existing_replicas": [],
                "projects": [
                    {
                        "project_namespace_id": p1.project_namespace_id,
                        "project_id": p1.id,
                        "repository_size": 100,
                    },
                    {
                        "project_namespace_id": p2.project_namespace_id,
                        "project_id": p2.id,
                        "repository_size": None,
                    },
                    {
                        "project_namespace_id": deep.project_namespace_id,
                        "project_id": deep.id,
                        "repository_size": 50,
                    },
                ],
                "existing_node_ids": [],
            },
            {
                "enabled_namespace_id": second.id,
                "namespace_id": second.root_namespace_id,
                "number_of_replicas": 2,
                "existing_replicas": [
                    {"id": pending.id, "state": "pending"},
                    {"id": ready.id, "state": "ready"},
                    {"id": third.id, "state": "pending"},
                ],
                "projects": [],
                "existing_node_ids": [],
            },
        ],
    }
    parse_scenario(loaded)  # valid by the planner's own rules


def test_projects_are_those_whose_project_namespace_is_under_the_root(now):
    node(1000)
    namespace, (project,) = enabled_group(10)
    # A group (not a project namespace) under the root is not a project.
    GroupFactory(parent=namespace.root_namespace)
    # A project namespace that points at the root only through its parent is not enough:
    # the root must be the first traversal id.
    stray = GroupFactory(type=Namespace.Type.PROJECT, parent=None)
    stray.traversal_ids = [stray.id, namespace.root_namespace_id]
    stray.save()
    (loaded,) = scenario()["namespaces"]
    assert [p["project_id"] for p in loaded["projects"]] == [project.id]


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        pytest.param({}, None, id="never-reported"),
        pytest.param({"process_health": None}, None, id="reported-null"),
        pytest.param({"process_health": {"indexer": {"rss_bytes": 3}}}, {}, id="no-webserver"),
        pytest.param(
            {"process_health": {"webserver": {"rss_bytes": -1, "shards_loaded": "x"}}},
            {"webserver": {"rss_bytes": None, "shards_loaded": None}},
            id="values-the-planner-would-refuse-become-null",
        ),
    ],
)
def test_process_health_keeps_only_what_the_planner_reads(metadata, expected):
    assert process_health(metadata) == expected


def test_the_buffer_factor_is_the_global_one_and_may_be_fractional(now):
    node(10_000)
    enabled_group(101)
    cache.set(buffer_factor.CACHE_KEY, {"value": 2.5}, 60)
    loaded = load_scenario(SelectionService().execute())
    assert loaded["options"]["buffer_factor"] == 2.5
    (created,) = plan_dict(loaded)["create"]
    # 101 × 2.5 = 252.5, rounded up to whole bytes.
    assert created["namespace_required_storage_bytes"] == 253


def test_without_observations_the_buffer_factor_is_gitlabs_3_as_an_integer(now):
    node(10_000)
    enabled_group(10)
    assert load_scenario(SelectionService().execute())["options"]["buffer_factor"] == 3


def test_the_loader_query_count_does_not_grow_with_projects_or_namespaces(now):
    node(10**12)
    buffer_factor.global_buffer_factor()  # warm the cache: its queries are not the loader's
    namespace, _ = enabled_group(*range(1, 11))
    counts = {}
    for label in ("10 projects, 1 namespace", "100 projects, 1 namespace", "100+, 6 namespaces"):
        if label.startswith("100 projects"):
            for size in range(90):
                ProjectFactory(namespace=namespace.root_namespace, repository_size=size)
        if label.startswith("100+"):
            for _ in range(5):
                enabled_group(1, 2, 3)
        pool = SelectionService().execute()
        with CaptureQueriesContext(connection) as queries:
            loaded = load_scenario(pool)
        counts[label] = len(queries)
        assert sum(len(ns["projects"]) for ns in loaded["namespaces"]) >= 10
    assert sum(len(ns["projects"]) for ns in loaded["namespaces"]) == 115
    # One for the existing replicas, one for the nodes holding their indices,
    # one (a server-side cursor) for every project.
    assert set(counts.values()) == {3}, counts


def test_the_loader_reports_progress_per_namespace(now):
    node(10**6)
    for _ in range(3):
        enabled_group(1, 2)
    seen = []
    load_scenario(
        SelectionService().execute(),
        buffer_factor=3,
        chunk_size=1,
        progress=lambda done, total, projects: seen.append((done, total, projects)),
    )
    assert seen[-1] == (3, 3, 6)
    assert [done for done, _, _ in seen] == sorted(done for done, _, _ in seen)


# --- apply: creates ----------------------------------------------------------------------------


def test_a_plan_becomes_replicas_and_indices_with_ranges_and_reservations(now):
    first_node = node(600)
    second_node = node(500)
    namespace, (_, p2, _) = enabled_group(100, 100, 100)

    result = ProvisioningService(plan_now()).execute()

    (replica,) = Replica.objects.filter(zoekt_enabled_namespace=namespace)
    assert replica.state == Replica.State.PENDING
    assert replica.namespace_id == namespace.root_namespace_id
    indices = list(Index.objects.filter(zoekt_replica=replica).order_by("id"))
    assert [
        (i.zoekt_node_id, i.reserved_storage_bytes, i.metadata, i.state, i.namespace_id)
        for i in indices
    ] == [
        (
            first_node.id,
            600,
            {"project_namespace_id_to": p2.project_namespace_id},
            Index.State.PENDING,
            namespace.root_namespace_id,
        ),
        (
            second_node.id,
            300,
            {"project_namespace_id_from": p2.project_namespace_id + 1},
            Index.State.PENDING,
            namespace.root_namespace_id,
        ),
    ]
    assert all(i.zoekt_enabled_namespace_id == namespace.id for i in indices)
    assert result.successes == [
        {"namespace_id": namespace.root_namespace_id, "replica_id": replica.id}
    ]
    assert result.errors == [] and result.failed_namespace_ids == []
    # The reservations are the node's claims now.
    assert (
        Node.objects.with_unclaimed_storage_bytes().get(pk=first_node.pk).unclaimed_storage_bytes
        == 0
    )


@pytest.mark.parametrize(
    ("projects", "expected"),
    [
        pytest.param(
            {"project_namespace_id_from": None, "project_namespace_id_to": None}, {}, id="whole"
        ),
        pytest.param(
            {"project_namespace_id_from": 5, "project_namespace_id_to": None},
            {"project_namespace_id_from": 5},
            id="open-end",
        ),
        pytest.param(
            {"project_namespace_id_from": 5, "project_namespace_id_to": 9},
            {"project_namespace_id_from": 5, "project_namespace_id_to": 9},
            id="closed",
        ),
    ],
)
def test_index_metadata_leaves_out_open_ends(projects, expected):
    assert index_metadata(projects) == expected


def test_an_empty_namespace_gets_one_empty_index(now):
    target = node(1000)
    namespace, _ = enabled_group()
    ProvisioningService(plan_now()).execute()
    (index,) = Index.objects.filter(zoekt_enabled_namespace=namespace)
    assert (index.zoekt_node_id, index.reserved_storage_bytes, index.metadata) == (target.id, 0, {})


def test_a_successful_apply_clears_an_old_rollout_failure(now):
    node(1000)
    namespace, _ = enabled_group(10, last_rollout_failed_at=now - timedelta(days=2))
    ProvisioningService(plan_now()).execute()
    namespace.refresh_from_db()
    assert namespace.last_rollout_failed_at is None


def test_plan_failures_are_stamped_and_write_nothing(now):
    node(1000)
    namespace, _ = enabled_group(100, 400)  # 300 bytes fit; 1,200 fit no node
    plan = plan_now()
    assert [f["namespace_id"] for f in plan["failures"]] == [namespace.root_namespace_id]

    result = ProvisioningService(plan).execute()

    namespace.refresh_from_db()
    assert namespace.last_rollout_failed_at == now
    assert namespace.metadata["rollout_required_storage_bytes"] == 300
    assert rows_of(namespace) == (0, 0)
    assert result.failed_namespace_ids == [namespace.root_namespace_id]
    assert result.successes == [] and result.errors == []


def unclaimed(target: Node) -> int:
    return Node.objects.with_unclaimed_storage_bytes().get(pk=target.pk).unclaimed_storage_bytes


def fleet_rows() -> dict:
    """Every row an apply may write, to show what it left alone."""
    return {
        "replicas": set(
            Replica.objects.values_list("id", "zoekt_enabled_namespace_id", "namespace_id")
        ),
        "indices": set(
            Index.objects.values_list(
                "id", "zoekt_enabled_namespace_id", "zoekt_replica_id", "zoekt_node_id"
            )
        ),
        "enabled": {
            row.id: (row.last_rollout_failed_at, row.metadata)
            for row in EnabledNamespace.objects.all()
        },
    }


def hand_written_create(namespace: EnabledNamespace, *replicas: list[tuple[int, int]]) -> dict:
    """A ``create`` plan entry: per replica, its indices as (node id, required bytes)."""
    return {
        "namespace_id": namespace.root_namespace_id,
        "enabled_namespace_id": namespace.id,
        "action": "create",
        "namespace_required_storage_bytes": sum(b for replica in replicas for _, b in replica),
        "replicas": [
            {
                "indices": [
                    {
                        "node_id": node_id,
                        "projects": {
                            "project_namespace_id_from": None,
                            "project_namespace_id_to": None,
                        },
                        "required_storage_bytes": required,
                        "max_storage_bytes": 10_000,
                    }
                    for node_id, required in replica
                ]
            }
            for replica in replicas
        ],
        "errors": [],
        "warnings": [],
    }


def hand_written_plan(*creates: dict, destroy: tuple = ()) -> dict:
    return {
        "create": list(creates),
        "destroy": list(destroy),
        "unchanged": [],
        "failures": [],
        "nodes": [],
        "total_required_storage_bytes": sum(c["namespace_required_storage_bytes"] for c in creates),
    }


def test_a_plan_that_no_longer_fits_is_refused_and_the_others_are_applied(now):
    """Between plan and apply another index claims most of a node: the re-check refuses."""
    shrinking = node(1000, metadata={"name": "zoekt-a"})
    other = node(900)
    refused, _ = enabled_group(200)  # 600 bytes, first fit: the 1,000-byte node
    applied, _ = enabled_group(150)  # 450 bytes: only the 900-byte node has room left
    plan = plan_now()
    assert [
        i["node_id"] for ns in plan["create"] for r in ns["replicas"] for i in r["indices"]
    ] == [
        shrinking.id,
        other.id,
    ]
    # Meanwhile: a reservation elsewhere leaves the node 500 unclaimed bytes.
    IndexFactory(zoekt_node=shrinking, reserved_storage_bytes=500)

    result = ProvisioningService(plan).execute()

    assert rows_of(refused) == (0, 0)
    refused.refresh_from_db()
    assert refused.last_rollout_failed_at == now
    assert refused.metadata["rollout_required_storage_bytes"] == 600
    assert result.errors == [
        {
            "type": "node_capacity_exceeded",
            "message": f"Node {shrinking.id} (zoekt-a) has 500 unclaimed bytes; "
            "the index needs 600",
            "failed_namespace_id": refused.root_namespace_id,
            "node_id": shrinking.id,
            "node_name": "zoekt-a",
            "replica_idx": 0,
        }
    ]
    assert rows_of(applied) == (1, 1)
    assert result.failed_namespace_ids == [refused.root_namespace_id]
    assert unclaimed(shrinking) == 500


@pytest.mark.parametrize("type_", ["restart", "remove"])
def test_a_node_taken_out_of_service_after_the_plan_is_refused_at_apply(now, type_):
    """Between plan and apply an operator requests a restart or a drain of a planned node
    (the request locks the node row, as the apply does): the re-check refuses its replica."""
    leaving = node(1000, metadata={"name": "zoekt-a"})
    staying = node(900)
    refused, _ = enabled_group(200)  # 600 bytes, first fit: the 1,000-byte node
    applied, _ = enabled_group(150)  # 450 bytes: the 900-byte node
    plan = plan_now()
    shutdowns.do_request_node_shutdown(
        leaving.id, type=type_, reason="kernel upgrade", requested_by="ops", now=now
    )

    result = ProvisioningService(plan).execute()

    assert rows_of(refused) == (0, 0)
    assert [(e["type"], e["node_id"], e["failed_namespace_id"]) for e in result.errors] == [
        ("node_shutting_down", leaving.id, refused.root_namespace_id)
    ]
    assert rows_of(applied) == (1, 1)
    assert Index.objects.get(zoekt_enabled_namespace=applied).zoekt_node_id == staying.id


@pytest.mark.parametrize("failing_idx", [0, 1], ids=["first-replica-fails", "second-fails"])
def test_a_replica_that_no_longer_fits_fails_alone_and_the_others_are_written(now, failing_idx):
    """GitLab's provisioning is atomic per replica: the namespace keeps what could be written."""
    a, b = node(1000, metadata={"name": "zoekt-a"}), node(900, metadata={"name": "zoekt-b"})
    namespace, _ = enabled_group(
        100, number_of_replicas_override=2, last_rollout_failed_at=now - timedelta(days=2)
    )
    plan = plan_now()
    assert [r["indices"][0]["node_id"] for r in plan["create"][0]["replicas"]] == [a.id, b.id]
    failing, kept = (a, b) if failing_idx == 0 else (b, a)
    Node.objects.filter(pk=failing.pk).update(usable_storage_bytes=100)
    name = failing.metadata["name"]

    result = ProvisioningService(plan).execute()

    (replica,) = Replica.objects.filter(zoekt_enabled_namespace=namespace)
    (index,) = Index.objects.filter(zoekt_enabled_namespace=namespace)
    assert (index.zoekt_replica_id, index.zoekt_node_id) == (replica.id, kept.id)
    assert result.successes == [
        {"namespace_id": namespace.root_namespace_id, "replica_id": replica.id}
    ]
    assert result.errors == [
        {
            "type": "node_capacity_exceeded",
            "message": f"Node {failing.id} ({name}) has 100 unclaimed bytes; the index needs 300",
            "failed_namespace_id": namespace.root_namespace_id,
            "node_id": failing.id,
            "node_name": name,
            "replica_idx": failing_idx,
        }
    ]
    # Something of it was written: not stamped failed, and the old failure is cleared.
    namespace.refresh_from_db()
    assert namespace.last_rollout_failed_at is None
    assert "rollout_required_storage_bytes" not in namespace.metadata
    assert result.failed_namespace_ids == []
    # The refused replica reserved nothing.
    assert unclaimed(failing) == 100
    assert unclaimed(kept) == (1000 if kept == a else 900) - 300


def test_a_namespace_is_stamped_failed_only_when_none_of_its_replicas_could_be_written(now):
    a, b = node(1000), node(900)
    namespace, _ = enabled_group(100, number_of_replicas_override=2)
    plan = plan_now()
    Node.objects.filter(pk__in=[a.pk, b.pk]).update(usable_storage_bytes=100)

    result = ProvisioningService(plan).execute()

    assert rows_of(namespace) == (0, 0)
    assert [(e["type"], e["replica_idx"]) for e in result.errors] == [
        ("node_capacity_exceeded", 0),
        ("node_capacity_exceeded", 1),
    ]
    namespace.refresh_from_db()
    assert namespace.last_rollout_failed_at == now
    assert namespace.metadata["rollout_required_storage_bytes"] == 600
    assert result.failed_namespace_ids == [namespace.root_namespace_id]
    assert result.successes == []


def test_capacity_taken_by_an_earlier_namespace_of_the_same_apply_counts(now):
    target = node(1000, metadata={})
    first, _ = enabled_group(100)
    second, _ = enabled_group(100)
    plan = plan_now()  # both on the node: 300 + 300 of 1,000
    Node.objects.filter(pk=target.pk).update(usable_storage_bytes=500)

    result = ProvisioningService(plan).execute()

    assert rows_of(first) == (1, 1)
    assert rows_of(second) == (0, 0)
    # An unnamed node is named by its id alone.
    assert result.errors[0]["message"] == (
        f"Node {target.id} has 200 unclaimed bytes; the index needs 300"
    )
    assert result.errors[0]["node_name"] is None


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda n: n.delete(), id="node-deleted"),
        pytest.param(
            lambda n: Node.objects.filter(pk=n.pk).update(services=[]), id="no-longer-for-search"
        ),
    ],
)
def test_a_node_that_is_gone_refuses_the_namespace(now, change):
    target = node(1000, metadata={"name": "zoekt-a"})
    target_id = target.id
    namespace, _ = enabled_group(10)
    plan = plan_now()
    change(target)
    result = ProvisioningService(plan).execute()
    assert rows_of(namespace) == (0, 0)
    assert [(e["type"], e["node_id"]) for e in result.errors] == [("node_not_found", target_id)]
    namespace.refresh_from_db()
    assert namespace.last_rollout_failed_at == now


def test_a_deleted_node_is_named_from_the_plan(now):
    target = node(1000)
    target_id = target.id
    namespace, _ = enabled_group(10)
    plan = plan_now()
    # The plan's own names (the planner copies each node's name into it).
    plan["create"][0]["replicas"][0]["indices"][0]["node_name"] = "zoekt-gone"
    target.delete()
    result = ProvisioningService(plan).execute()
    (error,) = result.errors
    assert (error["type"], error["node_id"], error["node_name"]) == (
        "node_not_found",
        target_id,
        "zoekt-gone",
    )
    assert error["message"] == (
        f"Node {target_id} (zoekt-gone) not found (deleted or no longer a search node)"
    )
    assert rows_of(namespace) == (0, 0)


def test_a_namespace_already_on_the_node_is_refused_before_the_unique_index_would(now):
    """Reference 10.6: an evicted index keeps its enabled namespace and blocks its node."""
    target = node(1000)
    namespace, _ = enabled_group(10)
    plan = plan_now()
    ReplicalessIndexFactory(
        zoekt_enabled_namespace=namespace,
        zoekt_node=target,
        reserved_storage_bytes=0,
        state=Index.State.EVICTED,
    )
    result = ProvisioningService(plan).execute()
    assert [(e["type"], e["node_id"]) for e in result.errors] == [
        ("namespace_already_on_node", target.id)
    ]
    assert Replica.objects.filter(zoekt_enabled_namespace=namespace).count() == 0


def test_a_hand_written_plan_reusing_a_node_in_a_namespace_keeps_the_first_replica(now):
    """Two replicas of one namespace on one node: the second is refused before any insert."""
    a, b = node(10_000), node(10_000)
    good, _ = enabled_group()
    reused, _ = enabled_group()
    within, _ = enabled_group()
    plan = hand_written_plan(
        hand_written_create(good, [(a.id, 10)]),
        hand_written_create(reused, [(b.id, 10)], [(b.id, 10)]),
        hand_written_create(within, [(a.id, 10), (a.id, 10)]),
    )

    result = ProvisioningService(plan).execute()

    assert rows_of(good) == (1, 1)
    assert rows_of(reused) == (1, 1)
    assert rows_of(within) == (0, 0)
    assert [(e["type"], e["failed_namespace_id"], e["replica_idx"]) for e in result.errors] == [
        ("namespace_already_on_node", reused.root_namespace_id, 1),
        ("namespace_already_on_node", within.root_namespace_id, 0),
    ]
    assert result.failed_namespace_ids == [within.root_namespace_id]


def test_what_the_database_refuses_rolls_back_only_that_replica(now, monkeypatch):
    """Should the re-check miss a conflict, the database's refusal costs one replica only."""
    a, b = node(10_000, metadata={"name": "zoekt-a"}), node(10_000)
    good, _ = enabled_group()
    half, _ = enabled_group()
    ReplicalessIndexFactory(
        zoekt_enabled_namespace=half,
        zoekt_node=b,
        reserved_storage_bytes=0,
        state=Index.State.EVICTED,
    )
    plan = hand_written_plan(
        hand_written_create(good, [(a.id, 10)]),
        hand_written_create(half, [(a.id, 10)], [(b.id, 10)]),
    )
    # A re-check that knows of no existing index: only the unique index stands in the way.
    monkeypatch.setattr(ProvisioningService, "_existing_placements", lambda self, creates: set())

    result = ProvisioningService(plan).execute()

    assert rows_of(good) == (1, 1)
    (replica,) = Replica.objects.filter(zoekt_enabled_namespace=half)
    assert list(
        Index.objects.filter(zoekt_replica=replica).values_list("zoekt_node_id", flat=True)
    ) == [a.id]
    assert rows_of(half) == (1, 2)  # the written replica's index and the evicted one
    (error,) = result.errors
    assert (error["type"], error["failed_namespace_id"], error["node_id"]) == (
        "namespace_already_on_node",
        half.root_namespace_id,
        b.id,
    )
    assert error["replica_idx"] == 1
    assert [s["namespace_id"] for s in result.successes] == [
        good.root_namespace_id,
        half.root_namespace_id,
    ]
    assert result.failed_namespace_ids == []


def test_a_namespace_disabled_since_planning_is_reported_and_the_rest_applied(now):
    node(10_000)
    gone, _ = enabled_group(10)
    kept, _ = enabled_group(10)
    plan = plan_now()
    root = gone.root_namespace_id
    gone.delete()
    result = ProvisioningService(plan).execute()
    assert [(e["type"], e["failed_namespace_id"]) for e in result.errors] == [
        ("missing_enabled_namespace", root)
    ]
    assert rows_of(kept) == (1, 1)
    assert not Replica.objects.filter(namespace_id=root).exists()


# --- apply: unexpected errors ------------------------------------------------------------------


def test_an_unexpected_error_checking_one_namespace_is_recorded_and_the_batch_goes_on(now):
    target = node(10_000)
    before, _ = enabled_group()
    broken, _ = enabled_group()
    after, _ = enabled_group()
    bad = hand_written_create(broken, [(target.id, 10)])
    bad["replicas"][0]["indices"][0]["required_storage_bytes"] = None  # a malformed plan
    plan = hand_written_plan(
        hand_written_create(before, [(target.id, 10)]),
        bad,
        hand_written_create(after, [(target.id, 10)]),
    )

    result = ProvisioningService(plan).execute()

    assert rows_of(before) == (1, 1) and rows_of(after) == (1, 1)
    assert rows_of(broken) == (0, 0)
    (error,) = result.errors
    assert (error["type"], error["failed_namespace_id"]) == (
        "provisioning_failed",
        broken.root_namespace_id,
    )
    assert "TypeError" in error["message"]
    broken.refresh_from_db()
    assert broken.last_rollout_failed_at == now
    assert broken.metadata["rollout_required_storage_bytes"] == 10
    assert result.failed_namespace_ids == [broken.root_namespace_id]
    # Its index reserved nothing: the two others' 20 bytes are all that is claimed.
    assert unclaimed(target) == 10_000 - 20


def test_an_unexpected_error_writing_one_namespace_is_recorded_and_the_batch_goes_on(
    now, monkeypatch
):
    a = node(10_000, metadata={"name": "zoekt-a"})
    ok, _ = enabled_group(10)
    broken, _ = enabled_group(10)
    later, _ = enabled_group(10)
    plan = plan_now()
    real_bulk_create = Index.objects.bulk_create

    def bulk_create(indices, *args, **kwargs):
        if any(index.namespace_id == broken.root_namespace_id for index in indices):
            raise RuntimeError("disk on fire")
        return real_bulk_create(indices, *args, **kwargs)

    monkeypatch.setattr(Index.objects, "bulk_create", bulk_create)

    result = ProvisioningService(plan).execute()

    assert rows_of(ok) == (1, 1) and rows_of(later) == (1, 1)
    assert rows_of(broken) == (0, 0)  # its replica row was rolled back with it
    assert result.errors == [
        {
            "type": "provisioning_failed",
            "message": "RuntimeError: disk on fire",
            "failed_namespace_id": broken.root_namespace_id,
            "node_id": a.id,
            "node_name": "zoekt-a",
            "replica_idx": 0,
        }
    ]
    broken.refresh_from_db()
    assert broken.last_rollout_failed_at == now
    assert result.failed_namespace_ids == [broken.root_namespace_id]
    assert unclaimed(a) == 10_000 - 60


def test_apply_statements_do_not_grow_with_projects_or_with_namespaces_in_a_chunk(now):
    node(10**12)
    counts = []
    for projects, namespaces in ((1, 1), (40, 1), (5, 8)):
        EnabledNamespace.objects.all().delete()
        for _ in range(namespaces):
            enabled_group(*range(1, projects + 1))
        plan = plan_now()
        with CaptureQueriesContext(connection) as queries:
            ProvisioningService(plan).execute()
        counts.append(len(queries))
    assert len(set(counts)) == 1, counts
    # Savepoint, two locks, the existing placements, a chunk (savepoint, two inserts,
    # release), the stamp of successes, release.
    assert counts[0] <= 10, counts


# --- apply: destroys ---------------------------------------------------------------------------


def test_a_destroy_plan_removes_the_chosen_replicas_of_that_namespace_only(now):
    node(1000)
    namespace, _ = enabled_group(10)
    keep = ReplicaFactory(zoekt_enabled_namespace=namespace, state=Replica.State.READY)
    drop = ReplicaFactory(zoekt_enabled_namespace=namespace)
    IndexFactory(zoekt_replica=keep)
    index = IndexFactory(zoekt_replica=drop)
    elsewhere = ReplicaFactory()
    plan = plan_now()
    (destroy,) = plan["destroy"]
    assert destroy["replicas_to_destroy"] == [drop.id]
    destroy["replicas_to_destroy"].append(elsewhere.id)  # not this namespace's: left alone

    result = ProvisioningService(plan).execute()

    assert set(Replica.objects.values_list("id", flat=True)) == {keep.id, elsewhere.id}
    index.refresh_from_db()
    assert index.zoekt_replica_id is None  # detached, to be orphaned and deleted later
    assert result.successes == [
        {"namespace_id": namespace.root_namespace_id, "replicas_destroyed": 1}
    ]


def test_a_destroy_that_removes_nothing_adds_no_success_entry(now):
    node(1000)
    namespace, _ = enabled_group(10)
    ReplicaFactory(zoekt_enabled_namespace=namespace, state=Replica.State.READY)
    drop = ReplicaFactory(zoekt_enabled_namespace=namespace)
    plan = plan_now()
    assert plan["destroy"][0]["replicas_to_destroy"] == [drop.id]
    drop.delete()  # removed since planning (by another run, or by hand)
    rows = fleet_rows()

    result = ProvisioningService(plan).execute()

    assert (result.successes, result.errors, result.failed_namespace_ids) == ([], [], [])
    assert fleet_rows() == rows


def test_a_destroy_for_an_enabled_namespace_that_no_longer_exists_is_an_error(now):
    node(1000)
    gone, _ = enabled_group(10)
    other, _ = enabled_group(10)
    for namespace in (gone, other):
        for _ in range(2):
            ReplicaFactory(zoekt_enabled_namespace=namespace)
    plan = plan_now()
    assert len(plan["destroy"]) == 2
    root = gone.root_namespace_id
    gone.delete()
    rows = fleet_rows()
    (dropped,) = plan["destroy"][1]["replicas_to_destroy"]

    result = ProvisioningService(plan).execute()

    assert result.errors == [
        {
            "type": "missing_enabled_namespace",
            "message": f"Enabled namespace {plan['destroy'][0]['enabled_namespace_id']} for "
            f"namespace {root} not found",
            "failed_namespace_id": root,
            "node_id": None,
            "node_name": None,
            "replica_idx": None,
        }
    ]
    assert result.successes == [{"namespace_id": other.root_namespace_id, "replicas_destroyed": 1}]
    assert result.failed_namespace_ids == []
    rows["replicas"] = {r for r in rows["replicas"] if r[0] != dropped}
    assert fleet_rows() == rows


def test_an_unexpected_error_in_one_destroy_is_recorded_and_the_other_destroys_go_on(now):
    node(1000)
    broken, _ = enabled_group(10)
    fine, _ = enabled_group(10)
    for namespace in (broken, fine):
        for _ in range(2):
            ReplicaFactory(zoekt_enabled_namespace=namespace)
    plan = plan_now()
    plan["destroy"][0]["replicas_to_destroy"] = ["not-an-id"]  # a malformed plan
    (dropped,) = plan["destroy"][1]["replicas_to_destroy"]

    result = ProvisioningService(plan).execute()

    (error,) = result.errors
    assert (error["type"], error["failed_namespace_id"]) == (
        "provisioning_failed",
        broken.root_namespace_id,
    )
    assert result.successes == [{"namespace_id": fine.root_namespace_id, "replicas_destroyed": 1}]
    assert Replica.objects.filter(zoekt_enabled_namespace=broken).count() == 2
    assert not Replica.objects.filter(pk=dropped).exists()
    assert Replica.objects.filter(zoekt_enabled_namespace=fine).count() == 1


# --- apply: a lookup that fails ----------------------------------------------------------------


@pytest.mark.parametrize("part", ["destroy", "create", "failures"])
def test_a_lookup_error_on_one_namespace_fails_that_namespace_and_the_batch_goes_on(now, part):
    """GitLab looks each namespace up on its own and reports ``{message, failed_namespace_id}``."""
    target = node(10_000)
    created, _ = enabled_group(10)
    shrunk, _ = enabled_group(10)
    broken, _ = enabled_group(10)
    for namespace in (shrunk, broken) if part == "destroy" else (shrunk,):
        for _ in range(2):
            ReplicaFactory(zoekt_enabled_namespace=namespace)
    plan = plan_now()
    (entry,) = [
        ns_plan
        for ns_plan in plan["create"] + plan["destroy"]
        if ns_plan["namespace_id"] == broken.root_namespace_id
    ]
    if part == "failures":  # a namespace that failed to plan: only stamped
        plan["create"].remove(entry)
        plan["failures"].append(entry)
    entry["enabled_namespace_id"] = "not-an-id"  # its lookup raises
    broken_rows = rows_of(broken)
    (dropped,) = next(
        d["replicas_to_destroy"] for d in plan["destroy"] if d["enabled_namespace_id"] == shrunk.id
    )

    result = ProvisioningService(plan).execute()

    assert result.errors == [
        {
            "type": "provisioning_failed",
            "message": "ValueError: Field 'id' expected a number but got 'not-an-id'.",
            "failed_namespace_id": broken.root_namespace_id,
            "node_id": None,
            "node_name": None,
            "replica_idx": None,
        }
    ]
    # The others of the batch are provisioned.
    assert rows_of(created) == (1, 1)
    assert not Replica.objects.filter(pk=dropped).exists()
    assert Replica.objects.filter(zoekt_enabled_namespace=shrunk).count() == 1
    assert sorted(s["namespace_id"] for s in result.successes) == sorted(
        [created.root_namespace_id, shrunk.root_namespace_id]
    )
    # The one whose lookup failed is left as it was: no row written, none removed, no stamp.
    assert rows_of(broken) == broken_rows
    broken.refresh_from_db()
    assert broken.last_rollout_failed_at is None
    assert result.failed_namespace_ids == []
    assert unclaimed(target) == 10_000 - 30  # the one create that was written


def test_a_lookup_error_on_one_node_fails_the_replicas_on_it_and_the_batch_goes_on(now):
    target = node(10_000, metadata={"name": "zoekt-a"})
    good, _ = enabled_group()
    broken, _ = enabled_group()
    bad = hand_written_create(broken, [(target.id, 10)])
    bad["replicas"][0]["indices"][0]["node_id"] = "node-a"  # its lookup raises
    plan = hand_written_plan(hand_written_create(good, [(target.id, 10)]), bad)

    result = ProvisioningService(plan).execute()

    assert rows_of(good) == (1, 1)
    assert rows_of(broken) == (0, 0)
    (error,) = result.errors
    assert error == {
        "type": "provisioning_failed",
        "message": "ValueError: Field 'id' expected a number but got 'node-a'.",
        "failed_namespace_id": broken.root_namespace_id,
        "node_id": "node-a",
        "node_name": None,
        "replica_idx": 0,
    }
    broken.refresh_from_db()
    assert broken.last_rollout_failed_at == now  # nothing of it could be written
    assert result.failed_namespace_ids == [broken.root_namespace_id]
    assert unclaimed(target) == 10_000 - 10
