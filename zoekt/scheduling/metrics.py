"""GitLab's metrics log lines (reference 6.1): what each online node holds, and stale indices.

GitLab's MetricsUpdateCronWorker writes, every minute, per online node the
counts of enabled namespaces, indices and tasks by state, and the count of
stale indices. Here one job writes them as one structured line.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db.models import Count

from zoekt import clock
from zoekt.models import Index, Node, Task


def collect(now: datetime | None = None) -> dict[str, Any]:
    """Per online node: enabled namespaces, indices and tasks by state; and stale indices."""
    now = now or clock.now()
    nodes = list(Node.objects.online(now).order_by("id").values_list("id", "metadata"))
    ids = [node_id for node_id, _ in nodes]
    indices: dict[int, dict[str, int]] = defaultdict(dict)
    for node_id, state, count in (
        Index.objects.filter(zoekt_node_id__in=ids)
        .values_list("zoekt_node_id", "state")
        .annotate(n=Count("id"))
        .order_by()
    ):
        indices[node_id][Index.State(state).label] = count
    namespaces = dict(
        Index.objects.filter(zoekt_node_id__in=ids, zoekt_enabled_namespace__isnull=False)
        .values_list("zoekt_node_id")
        .annotate(n=Count("zoekt_enabled_namespace_id", distinct=True))
        .order_by()
    )
    tasks: dict[int, dict[str, int]] = defaultdict(dict)
    for node_id, state, count in (
        Task.objects.filter(zoekt_node_id__in=ids)
        .values_list("zoekt_node_id", "state")
        .annotate(n=Count("id"))
        .order_by()
    ):
        tasks[node_id][Task.State(state).label] = count
    return {
        "nodes": [
            {
                "node_id": node_id,
                "node_name": (metadata or {}).get("name") or f"node-{node_id}",
                "enabled_namespaces": namespaces.get(node_id, 0),
                "indices": indices.get(node_id, {}),
                "tasks": tasks.get(node_id, {}),
            }
            for node_id, metadata in nodes
        ],
        "stale_indices": Index.objects.with_stale_used_storage_bytes_updated_at().count(),
    }
