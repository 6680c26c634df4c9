"""Lost nodes (6.7, 2.6) and the auto-index of top-level namespaces (6.3)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.factories import (
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ReplicaFactory,
    RepositoryFactory,
    TaskFactory,
)
from tests.scheduling import builders
from tests.scheduling.conftest import set_setting
from zoekt.models import EnabledNamespace, Index, Namespace, Node, Replica, Repository, Task
from zoekt.reasons import Reason
from zoekt.scheduling import handlers

pytestmark = pytest.mark.django_db

TWELVE_HOURS = timedelta(hours=12)


def lost_node(now, **fields) -> Node:
    return NodeFactory(last_seen_at=now - TWELVE_HOURS - timedelta(seconds=1), **fields)


# --- lost_nodes_check ---------------------------------------------------------------------


def test_one_lost_node_is_dispatched_while_another_is_online(service, dispatched, now):
    first = lost_node(now)
    lost_node(now)
    NodeFactory()  # online

    result = service().execute("lost_nodes_check")

    assert dispatched == [("delete_lost_node", (first.id,))]
    assert result["lost_node_id"] == first.id


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        pytest.param("disabled", Reason.LOST_NODE_HANDLING_DISABLED, id="threshold-0-disables"),
        pytest.param("no-online", Reason.NO_ONLINE_NODES, id="no-other-node-online"),
        pytest.param("not-lost-yet", Reason.NO_LOST_NODES, id="exactly-12h-is-not-lost"),
        pytest.param("not-for-search", Reason.NO_LOST_NODES, id="lost-node-not-for-search"),
    ],
)
def test_no_lost_node_is_dispatched_unless_every_condition_holds(
    service, dispatched, now, setup, reason
):
    if setup == "disabled":
        set_setting(zoekt_lost_node_threshold="0")
        lost_node(now)
        NodeFactory()
    elif setup == "no-online":
        lost_node(now)
        NodeFactory(last_seen_at=now - timedelta(seconds=30))  # offline, not lost
    elif setup == "not-lost-yet":
        NodeFactory(last_seen_at=now - TWELVE_HOURS)
        NodeFactory()
    else:
        lost_node(now, services=[7])
        NodeFactory()

    result = service().execute("lost_nodes_check")

    assert result["skipped"] == reason
    assert dispatched == []


def test_the_threshold_setting_decides_what_is_lost(service, dispatched, now):
    set_setting(zoekt_lost_node_threshold="30m")
    node = NodeFactory(last_seen_at=now - timedelta(minutes=31))
    NodeFactory()
    service().execute("lost_nodes_check")
    assert dispatched == [("delete_lost_node", (node.id,))]


def test_lost_nodes_are_handled_one_per_10_minutes(service, dispatched, now):
    lost_node(now)
    lost_node(now)
    NodeFactory()

    service().execute("lost_nodes_check")
    second = service().execute("lost_nodes_check")

    assert second["skipped"] == Reason.THROTTLED
    assert len(dispatched) == 1


# --- the lost-node event --------------------------------------------------------------------


def test_a_lost_node_goes_with_its_indices_and_repositories_but_not_replicas_or_tasks(now):
    node = lost_node(now)
    replica = ReplicaFactory()
    index = IndexFactory(zoekt_node=node, zoekt_replica=replica)
    RepositoryFactory(zoekt_index=index)
    RepositoryFactory(zoekt_index=index)
    survivor = IndexFactory(zoekt_replica=ReplicaFactory())
    RepositoryFactory(zoekt_index=survivor)
    TaskFactory(zoekt_node_id=node.id)

    result = handlers.delete_lost_node(node.id)

    assert result["repositories_deleted"] == 2
    assert result["indices_deleted"] == 1
    assert result["node_deleted"] is True
    assert not Node.objects.filter(pk=node.pk).exists()
    assert list(Index.objects.values_list("pk", flat=True)) == [survivor.pk]
    assert Repository.objects.count() == 1
    assert Replica.objects.filter(pk=replica.pk).exists()  # index-less: the rollout rebuilds it
    assert Replica.objects.without_indices().filter(pk=replica.pk).exists()
    assert Task.objects.filter(zoekt_node_id=node.id).count() == 1


def test_a_lost_node_with_more_than_10000_repositories_is_deleted_in_batches(now):
    node = lost_node(now)
    index = builders.group_with_index(node)
    builders.repositories(index, 10_001)

    result = handlers.delete_lost_node(node.id)

    assert result["repositories_deleted"] == 10_001
    assert Repository.objects.count() == 0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param("came-back", Reason.NODE_NOT_LOST, id="node-came-back"),
        pytest.param("gone", Reason.NODE_NOT_FOUND, id="node-already-gone"),
        pytest.param("disabled", Reason.LOST_NODE_HANDLING_DISABLED, id="handling-disabled"),
    ],
)
def test_the_event_re_checks_the_node_before_deleting(now, change, reason):
    node = lost_node(now)
    IndexFactory(zoekt_node=node)
    if change == "came-back":
        Node.objects.filter(pk=node.pk).update(last_seen_at=now)
    elif change == "gone":
        Index.objects.all().delete()
        Node.objects.filter(pk=node.pk).delete()
    else:
        set_setting(zoekt_lost_node_threshold="0")
    before = (Node.objects.count(), Index.objects.count())

    result = handlers.delete_lost_node(node.id)

    assert result["skipped"] == reason
    assert (Node.objects.count(), Index.objects.count()) == before


# --- auto_index_self_managed ------------------------------------------------------------------


def test_auto_index_is_off_unless_the_setting_is_on(service):
    GroupFactory()
    assert service().execute("auto_index_self_managed")["skipped"] == Reason.AUTO_INDEX_DISABLED
    assert EnabledNamespace.objects.count() == 0


def test_auto_index_enables_every_top_level_namespace_that_lacks_one(service):
    set_setting(zoekt_auto_index_root_namespace=True)
    root = GroupFactory()
    GroupFactory(parent=root)  # a subgroup
    GroupFactory(type=Namespace.Type.PROJECT, parent=root)  # a project namespace
    already = EnabledNamespaceFactory(search=False)

    result = service().execute("auto_index_self_managed")

    enabled = set(EnabledNamespace.objects.values_list("root_namespace_id", flat=True))
    assert enabled == {root.id, already.root_namespace_id}
    assert result["enabled_namespaces_created"] == 1
    assert EnabledNamespace.objects.get(pk=already.pk).search is False
    assert EnabledNamespace.objects.get(root_namespace=root).search is True


def test_auto_index_walks_namespaces_in_batches_of_1000_and_is_idempotent(service):
    set_setting(zoekt_auto_index_root_namespace=True)
    builders.roots(2_001)

    first = service().execute("auto_index_self_managed")
    second = service().execute("auto_index_self_managed")

    assert (first["namespace_batches"], first["enabled_namespaces_created"]) == (3, 2_001)
    assert second["enabled_namespaces_created"] == 0
    assert EnabledNamespace.objects.count() == 2_001
