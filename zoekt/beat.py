"""The one shape of a beat entry (plain data, no Django import).

Every entry expires after its own interval, so a backlog of missed ticks never
runs the same job several times in a row.
"""

from __future__ import annotations


def every(task: str, seconds: int) -> dict:
    """Run ``task`` every ``seconds``; a tick not picked up within them expires."""
    return {"task": task, "schedule": float(seconds), "options": {"expires": seconds}}


#: The fleet domain's own periodic jobs (``zoekt.tasks``).
ZOEKT_BEAT: dict[str, dict] = {
    "refresh-buffer-factor": every("zoekt.refresh_buffer_factor", 3600),
    # Memory (docs/memory.md): opt-in auto-calibration of memory_ratio, and the
    # per-node estimated-vs-observed memory metrics as structured log records.
    "calibrate-memory-ratio": every("zoekt.calibrate_memory_ratio", 3600),
    "log-node-memory": every("zoekt.log_node_memory", 60),
    # Not GitLab's: failed tasks whose handle_task_failed message was lost (docs/reliability.md).
    "sweep-failed-tasks": every("zoekt.sweep_failed_tasks", 600),
    # Node maintenance (docs/operations.md): restart records complete or expire.
    "settle-node-shutdowns": every("zoekt.settle_node_shutdowns", 60),
}
