"""The one shape of a beat entry (plain data, no Django import).

Every entry expires after its own interval, so a backlog of missed ticks never
runs the same job several times in a row.
"""

from __future__ import annotations


def every(task: str, seconds: int) -> dict:
    """Run ``task`` every ``seconds``; a tick not picked up within them expires."""
    return {"task": task, "schedule": float(seconds), "options": {"expires": seconds}}
