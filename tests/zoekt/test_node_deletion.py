"""Deleting a node's row (``zoekt.node_deletion``): refused while the node holds the last
ready copy of a project range, unless forced, and a forced delete is recorded; through the
function, ``manage.py zoekt_node delete``, and the admin's delete and bulk delete."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.urls import reverse

from tests.factories import EnabledNamespaceFactory, GroupFactory, NodeFactory
from zoekt import node_deletion, shutdowns
from zoekt.models import Index, Node, NodeShutdown, Replica
from zoekt.reasons import Reason
from zoekt.search_targets import HIGHEST, LOWEST, Span

pytestmark = pytest.mark.django_db


def ready(where: Node, *, replica=None, low=None, high=None) -> Index:
    if replica is None:
        enabled = EnabledNamespaceFactory(root_namespace=GroupFactory())
        replica = Replica.objects.create(
            zoekt_enabled_namespace=enabled,
            namespace_id=enabled.root_namespace_id,
            state=Replica.State.READY,
        )
    metadata = {
        key: value
        for key, value in (("project_namespace_id_from", low), ("project_namespace_id_to", high))
        if value is not None
    }
    return Index.objects.create(
        zoekt_enabled_namespace=replica.zoekt_enabled_namespace,
        zoekt_replica=replica,
        zoekt_node=where,
        namespace_id=replica.namespace_id,
        state=Index.State.READY,
        metadata=metadata,
    )


def second_replica(of: Index, where: Node, **bounds) -> Index:
    replica = Replica.objects.create(
        zoekt_enabled_namespace=of.zoekt_enabled_namespace,
        namespace_id=of.namespace_id,
        state=Replica.State.READY,
    )
    return ready(where, replica=replica, **bounds)


def state() -> tuple:
    return (
        sorted(Node.objects.values_list("id", flat=True)),
        sorted(Index.objects.values_list("id", "zoekt_node_id")),
        sorted(NodeShutdown.objects.values_list("id", "status", "status_reason")),
    )


@pytest.mark.parametrize(
    ("span", "others", "gaps"),
    [
        pytest.param((None, None), [], [(LOWEST, HIGHEST)], id="nothing-else"),
        pytest.param((None, None), [(None, None)], [], id="a-whole-copy"),
        pytest.param((1, 100), [(1, 40), (61, None)], [(41, 60)], id="a-hole-in-the-middle"),
        pytest.param((None, 100), [(50, 80)], [(LOWEST, 49), (81, 100)], id="both-ends"),
        pytest.param((10, 20), [(1, 15), (12, 30)], [], id="overlapping-copies"),
    ],
)
def test_uncovered_names_exactly_the_stretches_no_other_copy_holds(span, others, gaps):
    def make(bounds, index_id):
        return Span(index_id, 1, index_id, bounds[0], bounds[1])

    spans = [make(b, i + 2) for i, b in enumerate(others)]
    assert node_deletion.uncovered(make(span, 1), spans) == gaps


def test_a_node_holding_the_last_ready_copy_is_not_deleted(now):
    lonely_node, other = NodeFactory(), NodeFactory()
    lonely = ready(lonely_node)
    covered = ready(lonely_node)
    second_replica(covered, other)
    before = state()

    with pytest.raises(node_deletion.HoldsLastCopy) as refused:
        node_deletion.do_delete_node(lonely_node.id, deleted_by="ops")

    assert refused.value.ranges == [
        {
            "namespace_id": lonely.namespace_id,
            "enabled_namespace_id": lonely.zoekt_enabled_namespace_id,
            "index_id": lonely.id,
            "project_namespace_id_from": None,
            "project_namespace_id_to": None,
        }
    ]
    assert state() == before


def test_a_copy_on_a_node_that_is_not_searchable_does_not_count(now):
    node, offline = NodeFactory(), NodeFactory(last_seen_at=now.replace(year=2025))
    second_replica(ready(node), offline)
    assert len(node_deletion.last_copies(node.id)) == 1


def test_a_range_only_partly_held_elsewhere_names_the_stretch_left(now):
    node, other = NodeFactory(), NodeFactory()
    mine = ready(node, high=1000)
    second_replica(mine, other, high=400)

    (gap,) = node_deletion.last_copies(node.id)

    assert (gap["project_namespace_id_from"], gap["project_namespace_id_to"]) == (401, 1000)


def test_a_node_whose_every_range_has_another_copy_is_deleted_and_its_record_closed(now):
    node, other = NodeFactory(), NodeFactory()
    second_replica(ready(node), other)
    live = shutdowns.do_request_node_shutdown(
        node.id, type="remove", reason="gone", requested_by="ops"
    )

    result = node_deletion.do_delete_node(node.id, deleted_by="ops-gus")

    assert result["forced"] is False and result["indices_deleted"] == 1
    assert not Node.objects.filter(pk=node.id).exists()
    live.refresh_from_db()
    assert (live.status, live.status_reason) == ("complete", Reason.SHUTDOWN_NODE_DELETED)
    assert live.details["deleted_by"] == "ops-gus"
    assert NodeShutdown.objects.count() == 1  # nothing forced, nothing more recorded


def test_a_forced_delete_is_recorded_with_who_and_the_ranges_it_took_dark(now):
    node = NodeFactory(metadata={"name": "doomed"})
    lonely = ready(node, low=5, high=9)

    result = node_deletion.do_delete_node(node.id, deleted_by="ops-hana", force=True)

    assert result["forced"] is True
    assert not Node.objects.filter(pk=node.id).exists()
    record = NodeShutdown.objects.get()
    assert (record.type, record.status, record.status_reason) == (
        "remove",
        "complete",
        Reason.FORCED_DELETE,
    )
    assert (record.node_id, record.node_ref, record.node_name) == (None, node.id, "doomed")
    assert record.requested_by == "ops-hana" and record.completed_at == now
    assert record.details["dark_ranges"] == [
        {
            "namespace_id": lonely.namespace_id,
            "enabled_namespace_id": lonely.zoekt_enabled_namespace_id,
            "index_id": lonely.id,
            "project_namespace_id_from": 5,
            "project_namespace_id_to": 9,
        }
    ]
    assert record.details["deleted_by"] == "ops-hana"


# --- manage.py zoekt_node delete ---------------------------------------------------------------


def run(*args) -> str:
    out = StringIO()
    call_command("zoekt_node", *args, stdout=out)
    return out.getvalue()


def test_the_cli_refuses_then_deletes_with_force(now):
    node = NodeFactory(metadata={"name": "zoekt-9"})
    ready(node)
    before = state()

    with pytest.raises(CommandError, match="last ready copy of 1 project range"):
        run("delete", "zoekt-9", "--by", "ops")
    assert state() == before

    out = run("delete", "zoekt-9", "--force", "--by", "ops")
    assert "forced: 1 range(s) dark" in out
    assert not Node.objects.filter(pk=node.id).exists()


# --- the admin ---------------------------------------------------------------------------------


@pytest.fixture
def staff(client):
    user = get_user_model().objects.create_superuser("ops-ivy", password="pw-12345678")
    client.force_login(user)
    return client


def test_the_admin_delete_page_names_the_ranges_and_refuses_without_the_force_box(staff, now):
    node = NodeFactory()
    lonely = ready(node)
    url = reverse("admin:zoekt_node_delete", args=[node.id])

    page = staff.get(url)
    assert page.status_code == 200
    assert b"last ready copy of 1 project range" in page.content
    assert f"index {lonely.id}".encode() in page.content
    assert b'name="force"' in page.content
    before = state()

    refused = staff.post(url, {"post": "yes"}, follow=True)

    assert state() == before
    assert b"node_holds_last_copy" in refused.content

    staff.post(url, {"post": "yes", "force": "yes"})
    assert not Node.objects.filter(pk=node.id).exists()
    record = NodeShutdown.objects.get()
    assert (record.status_reason, record.requested_by) == (Reason.FORCED_DELETE, "ops-ivy")


def test_the_admin_bulk_delete_is_all_or_nothing_and_records_a_forced_delete(staff, now):
    safe, other, lonely_node = NodeFactory(), NodeFactory(), NodeFactory()
    second_replica(ready(safe), other)
    ready(lonely_node)
    changelist = reverse("admin:zoekt_node_changelist")
    chosen = {"action": "delete_selected", "_selected_action": [safe.id, lonely_node.id]}

    page = staff.post(changelist, chosen)
    assert page.status_code == 200 and b'name="force"' in page.content
    before = state()

    staff.post(changelist, {**chosen, "post": "yes"})
    assert state() == before  # neither is deleted

    staff.post(changelist, {**chosen, "post": "yes", "force": "yes"})
    assert set(Node.objects.values_list("id", flat=True)) == {other.id}
    assert NodeShutdown.objects.get().node_ref == lonely_node.id
