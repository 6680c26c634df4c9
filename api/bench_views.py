"""Reference endpoints for ``bench/heartbeat``, mounted only with ZOEKT_BENCH_ENDPOINTS=1.

They bracket the real heartbeat in the same server and the same request
stack (JWT authentication, body cap, validation of the same body):

- the *floor* does nothing after validation: the cost of the stack alone;
- the *ceiling* does the least database work a heartbeat needs: one raw-SQL
  upsert of the node row and one select of its pending tasks.
"""

from __future__ import annotations

from django.db import connection
from rest_framework.response import Response

from api import serializers
from api.views import NodeAPIView, validated
from zoekt import clock

_MINIMAL_UPSERT = """
INSERT INTO zoekt_nodes AS n (uuid, index_base_url, search_base_url, last_seen_at, total_bytes,
    used_bytes, metadata, created_at, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, '{}'::jsonb, %s, %s)
ON CONFLICT (uuid) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at,
    total_bytes = EXCLUDED.total_bytes, used_bytes = EXCLUDED.used_bytes
RETURNING id
"""

_PENDING_TASKS = """
SELECT id, task_type, project_identifier FROM zoekt_tasks
WHERE zoekt_node_id = %s AND state IN (0, 1) AND perform_at <= %s
ORDER BY perform_at, id LIMIT %s
"""


class FloorHeartbeatView(NodeAPIView):
    def post(self, request, uuid: str):
        validated(
            serializers.HeartbeatSerializer(data=request.data),
            "heartbeat",
            uuid,
            unprocessable_codes=serializers.NODE_INVALID_CODES,
        )
        return Response(
            {
                "id": 0,
                "truncate": False,
                "tasks": [],
                "pull_frequency": "5s",
                "stop_indexing": False,
            }
        )


class CeilingHeartbeatView(NodeAPIView):
    def post(self, request, uuid: str):
        node_uuid, data = validated(
            serializers.HeartbeatSerializer(data=request.data),
            "heartbeat",
            uuid,
            unprocessable_codes=serializers.NODE_INVALID_CODES,
        )
        now = clock.now()
        with connection.cursor() as cursor:
            cursor.execute(
                _MINIMAL_UPSERT,
                [
                    node_uuid,
                    data["node.url"],
                    data["node.url"],
                    now,
                    data["disk.all"],
                    data["disk.used"],
                    now,
                    now,
                ],
            )
            (node_id,) = cursor.fetchone()
            cursor.execute(_PENDING_TASKS, [node_id, now, 20])
            tasks = cursor.fetchall()
        return Response(
            {
                "id": node_id,
                "truncate": False,
                "tasks": [list(t) for t in tasks],
                "pull_frequency": "5s",
                "stop_indexing": False,
            }
        )
