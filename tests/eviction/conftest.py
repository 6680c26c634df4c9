"""What the eviction tests share: eviction switched on, heartbeats, namespaces on nodes."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.api.test_operator_api import make_user
from tests.factories import EnabledNamespaceFactory, GroupFactory, IndexFactory, ReplicaFactory
from zoekt import actions, app_settings, clock
from zoekt.models import EnabledNamespace, Index, Node, Replica


@pytest.fixture(autouse=True)
def _eviction_on(db):
    """Eviction on, and its delete step as GitLab has it (moves off): the decision tests
    check what is deleted; ``test_moves`` switches moves back on."""
    app_settings.update(
        zoekt_node_level_eviction_enabled=True,
        zoekt_indexing_enabled=True,
        zoekt_search_enabled=True,
        zoekt_eviction_moves=False,
    )


def beat(node: Node, used_bytes: int, *, seconds: float = 5) -> Node:
    """One heartbeat through the real upsert, ``seconds`` after the last one."""
    clock.advance(seconds)
    actions.do_record_heartbeat(
        node.uuid,
        {
            "node.name": node.name,
            "node.url": node.index_base_url,
            "disk.all": node.total_bytes,
            "disk.used": used_bytes,
            "disk.indexed": used_bytes,
        },
    )
    node.refresh_from_db()
    return node


def ready_namespace(
    node: Node, used_bytes: int, *, also_on: Node | None = None
) -> EnabledNamespace:
    """An enabled namespace with a ready replica on ``node`` (and another on ``also_on``)."""
    enabled = EnabledNamespaceFactory(root_namespace=GroupFactory())
    for where in (node, also_on):
        if where is None:
            continue
        replica = ReplicaFactory(zoekt_enabled_namespace=enabled, state=Replica.State.READY)
        IndexFactory(
            zoekt_replica=replica,
            zoekt_node=where,
            state=Index.State.READY,
            used_storage_bytes=used_bytes,
            reserved_storage_bytes=used_bytes,
        )
    return enabled


@pytest.fixture
def api(now) -> APIClient:
    """An operator's API client: a staff user's token."""
    client = APIClient()
    user = make_user("ops-alice", staff=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client
