"""The loader tells the planner where a namespace's indices already are, and the nodes' names."""

from __future__ import annotations

import pytest
from django.db import transaction

from planner.apply import ProvisioningService
from planner.core import plan_dict
from planner.loader import load_scenario
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
from zoekt.models import Index, Replica

pytestmark = pytest.mark.django_db

GIB = 1024**3


def _node(metadata: dict):
    return NodeFactory(total_bytes=100 * GIB, used_bytes=0, indexed_bytes=0, metadata=metadata)


def _load() -> dict:
    return load_scenario(SelectionService().execute(), buffer_factor=3)


def test_existing_node_ids_list_every_index_row_of_the_namespace_in_any_state(now):
    a, b, c, d = (_node({"name": name}) for name in "abcd")
    group = GroupFactory()
    ProjectFactory(namespace=group, repository_size=1000)
    enabled = EnabledNamespaceFactory(root_namespace=group, number_of_replicas_override=3)
    replica = ReplicaFactory(zoekt_enabled_namespace=enabled, state=Replica.State.READY)
    IndexFactory(zoekt_replica=replica, zoekt_node=c, state=Index.State.READY)
    IndexFactory(zoekt_replica=replica, zoekt_node=a, state=Index.State.PENDING)
    # Evicted: the replica is gone, the row keeps its (namespace, node) slot.
    ReplicalessIndexFactory(zoekt_enabled_namespace=enabled, zoekt_node=d)
    other = EnabledNamespaceFactory()
    IndexFactory(zoekt_replica=ReplicaFactory(zoekt_enabled_namespace=other), zoekt_node=b)

    (namespace,) = [ns for ns in _load()["namespaces"] if ns["enabled_namespace_id"] == enabled.id]

    assert namespace["existing_node_ids"] == sorted([a.id, c.id, d.id])


def test_nodes_carry_their_reported_name_or_null(now):
    named, nameless, odd = _node({"name": "zoekt-7"}), _node({}), _node({"name": 42})
    group = GroupFactory()
    ProjectFactory(namespace=group, repository_size=1000)
    EnabledNamespaceFactory(root_namespace=group)

    names = {entry["id"]: entry["name"] for entry in _load()["nodes"]}

    assert names == {named.id: "zoekt-7", nameless.id: None, odd.id: None}


def test_a_rollout_never_places_a_namespace_next_to_its_evicted_index(now):
    # The evicted index still holds the slot on the roomiest node: a new
    # replica must go elsewhere, or provisioning would hit the unique index.
    roomy = NodeFactory(total_bytes=500 * GIB, used_bytes=0, indexed_bytes=0)
    other = NodeFactory(total_bytes=100 * GIB, used_bytes=0, indexed_bytes=0)
    group = GroupFactory()
    ProjectFactory(namespace=group, repository_size=1000)
    enabled = EnabledNamespaceFactory(root_namespace=group)
    ReplicalessIndexFactory(zoekt_enabled_namespace=enabled, zoekt_node=roomy)

    result = plan_dict(_load())
    (ns,) = result["create"]
    assert [i["node_id"] for i in ns["replicas"][0]["indices"]] == [other.id]
    assert [i["node_name"] for i in ns["replicas"][0]["indices"]] == [other.metadata["name"]]
    with transaction.atomic():
        ProvisioningService(result).execute()
    assert set(
        Index.objects.filter(zoekt_enabled_namespace=enabled).values_list(
            "zoekt_node_id", flat=True
        )
    ) == {roomy.id, other.id}
