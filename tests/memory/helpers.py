"""Builders shared by the memory tests: nodes that report memory, namespaces, placed indices."""

from __future__ import annotations

import logging
from typing import Any

from planner.rollout import PLAN_LOG_KEY
from tests.factories import (
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ProjectFactory,
    ReplicaFactory,
)
from zoekt import app_settings
from zoekt.models import EnabledNamespace, Index, Node, Replica

GIB = 1024**3
#: Passes the memory-limit version gate (zoekt.memory.MEMORY_LIMIT_MIN_VERSION = 1.16.0).
GATED_VERSION = "v1.16.2"


set_setting = app_settings.update


def webserver(
    *, rss: int | None = None, shards: int | None = None, limit: int | None = None
) -> dict[str, int]:
    block = {}
    if rss is not None:
        block["rss_bytes"] = rss
    if shards is not None:
        block["shards_loaded"] = shards
    if limit is not None:
        block["memory_limit_bytes"] = limit
    return block


def node(
    unclaimed: int,
    name: str,
    *,
    rss: int | None = None,
    shards: int | None = None,
    limit: int | None = None,
    version: str | None = GATED_VERSION,
    process_health: Any = ...,
    **kwargs: Any,
) -> Node:
    """A node with ``unclaimed`` bytes of disk and, optionally, webserver memory figures.

    ``process_health`` overrides the block entirely (``None``: reported null;
    leave it out to build it from ``rss``/``shards``/``limit``, or to report
    nothing when those are all None).
    """
    metadata: dict[str, Any] = {"name": name, "concurrency": 4}
    if version is not None:
        metadata["version"] = version
    if process_health is not ...:
        metadata["process_health"] = process_health
    elif rss is not None or shards is not None or limit is not None:
        metadata["process_health"] = {"webserver": webserver(rss=rss, shards=shards, limit=limit)}
    return NodeFactory(
        total_bytes=unclaimed, used_bytes=0, indexed_bytes=0, metadata=metadata, **kwargs
    )


def enabled_group(*sizes: int | None, **kwargs: Any) -> EnabledNamespace:
    group = GroupFactory()
    namespace = EnabledNamespaceFactory(root_namespace=group, **kwargs)
    for size in sizes:
        ProjectFactory(namespace=group, repository_size=size)
    return namespace


def placed(
    on: Node,
    *sizes: int | None,
    state: int = Index.State.READY,
    used: int = 0,
    reserved: int = 0,
    metadata: dict[str, int] | None = None,
) -> Index:
    """A namespace already placed on ``on``: one replica, one index covering its projects."""
    namespace = enabled_group(*sizes)
    replica = ReplicaFactory(
        zoekt_enabled_namespace=namespace,
        state=Replica.State.READY if state == Index.State.READY else Replica.State.PENDING,
    )
    return IndexFactory(
        zoekt_replica=replica,
        zoekt_node=on,
        state=state,
        used_storage_bytes=used,
        reserved_storage_bytes=reserved,
        metadata=metadata or {},
    )


def records(caplog, event: str) -> list[dict]:
    return [
        record.msg
        for record in caplog.records
        if isinstance(record.msg, dict) and record.msg.get("event") == event
    ]


def plan_record(caplog) -> dict:
    (record,) = records(caplog, PLAN_LOG_KEY)
    return record


def capture(caplog) -> None:
    caplog.set_level(logging.INFO)


def indices_of(plan: dict, namespace_id: int) -> list[dict]:
    (ns_plan,) = [ns for ns in plan["create"] if ns["namespace_id"] == namespace_id]
    return [index for replica in ns_plan["replicas"] for index in replica["indices"]]
