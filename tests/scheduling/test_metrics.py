"""GitLab's metrics log line (6.1): per online node, and stale indices."""

from __future__ import annotations

from datetime import timedelta

import pytest

from config.celery import BEAT_SCHEDULE
from tests.factories import IndexFactory, NodeFactory, TaskFactory
from zoekt.models import Index, Task
from zoekt.reasons import Reason
from zoekt.scheduling.tasks import log_metrics_task

pytestmark = pytest.mark.django_db


def test_metrics_count_what_each_online_node_holds_by_state(indexing_enabled, now):
    node = NodeFactory(metadata={"name": "zoekt-0"})
    IndexFactory(zoekt_node=node, state=Index.State.READY)
    IndexFactory(zoekt_node=node, state=Index.State.PENDING)
    TaskFactory(zoekt_node_id=node.id)
    TaskFactory(zoekt_node_id=node.id, state=Task.State.DONE)
    offline = NodeFactory(last_seen_at=now - timedelta(minutes=5))
    IndexFactory(zoekt_node=offline)

    result = log_metrics_task()

    assert result["nodes"] == [
        {
            "node_id": node.id,
            "node_name": "zoekt-0",
            "enabled_namespaces": 2,
            "indices": {"ready": 1, "pending": 1},
            "tasks": {"pending": 1, "done": 1},
        }
    ]
    assert result["stale_indices"] == 3  # every new index is stale


def test_metrics_need_indexing_enabled(db):
    assert log_metrics_task() == {"skipped": Reason.INDEXING_DISABLED}


def test_beat_logs_metrics_every_minute():
    assert BEAT_SCHEDULE["scheduling-metrics"] == {
        "task": "zoekt.log_metrics",
        "schedule": 60.0,
        "options": {"expires": 60},
    }
