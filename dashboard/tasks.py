"""The dashboard's job: keep the node history (``dashboard.history``).

Beat runs it every sample interval (``record-node-history`` in
``dashboard.beat``, expiring after that interval). No advisory lock: a
second run in the same interval writes nothing the first did not (the
samples' primary key is the node and the interval) and prunes the same rows.
"""

from __future__ import annotations

from celery import shared_task

from dashboard import history
from zoekt.logging import get_logger

log = get_logger(__name__)


@shared_task(name="dashboard.record_node_history")
def record_node_history_task() -> dict:
    result = history.record_history()
    log.info("node_history", **result)
    return result


@shared_task(name="dashboard.sample_node")
def sample_node_task(node_id: int) -> int:
    """The first sample of a node that just registered (``zoekt.hooks``)."""
    sampled = history.sample_nodes(node_ids=[node_id])
    log.info("node_sampled", node_id=node_id, sampled=sampled)
    return sampled
