"""The simulator tests' shared fixtures: the fake node's stub server, and nodes against it."""

from __future__ import annotations

import pytest

from simulator.fakenode import FakeNode, FakeNodeConfig
from tests.simulator.fakenode_stub import SECRET, StubServer


@pytest.fixture
def stub():
    server = StubServer()
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


@pytest.fixture
def make_node(stub, tmp_path):
    nodes: list[FakeNode] = []

    def make(**overrides) -> FakeNode:
        options = {"base_url": stub.url, "secret": SECRET, "state_dir": tmp_path, "seed": 1}
        options.update(overrides)
        node = FakeNode(FakeNodeConfig(**options))
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.stop()
