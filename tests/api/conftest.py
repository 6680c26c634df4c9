"""Fixtures of the node-protocol tests: a signed client, a registered node and its index."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.api.helpers import HOST, NodeAPI
from tests.factories import IndexFactory, NodeFactory
from zoekt.models import Index, Node


@pytest.fixture
def node_api(db) -> NodeAPI:
    return NodeAPI(Client(HTTP_HOST=HOST))


@pytest.fixture
def node(now) -> Node:
    """A registered node (concurrency 4, so a limit of 4) seen at the frozen ``now``."""
    return NodeFactory(metadata={"name": "zoekt-0", "concurrency": 4})


@pytest.fixture
def index(node) -> Index:
    return IndexFactory(zoekt_node=node)
