"""Where following GitLab stands, for the operator's surfaces (``zoekt_info``, ``/metrics``).

``status(now)`` reads, in four queries: the last sweep and the last complete one, the
hook events by state, and the oldest event that is due and still pending (the lag).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Min

from gitlab_sync.models import HookEvent, Sweep


@dataclasses.dataclass(frozen=True)
class GitLabStatus:
    configured: bool
    hooks_configured: bool
    last_sweep: dict[str, Any] | None
    last_complete_sweep_at: datetime | None
    hooks: dict[str, int]
    #: Seconds the oldest due, unprocessed hook has waited (0 with none).
    hook_lag_seconds: float


def _sweep(record: Sweep | None) -> dict[str, Any] | None:
    if record is None:
        return None
    counts = record.counts
    return {
        "id": record.id,
        "state": record.state,
        "phase": record.phase,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "projects": counts.get("projects", 0),
        "skipped": counts.get("skipped", 0),
        "removed_projects": (counts.get("removed") or {}).get("projects", 0),
        "requests": counts.get("requests", 0),
        "error": record.error,
    }


def status(now: datetime) -> GitLabStatus:
    last = Sweep.objects.order_by("-id").first()
    complete = (
        Sweep.objects.filter(state=Sweep.State.COMPLETE).order_by("-id").values("finished_at")
    ).first()
    hooks = {state: 0 for state in HookEvent.State.values}
    for row in HookEvent.objects.values("state").annotate(n=Count("id")):
        hooks[row["state"]] = row["n"]
    oldest = HookEvent.objects.filter(
        state=HookEvent.State.PENDING, process_after__lte=now
    ).aggregate(at=Min("process_after"))["at"]
    return GitLabStatus(
        configured=bool(settings.ZOEKT_GITLAB_URL and settings.ZOEKT_GITLAB_TOKEN_FILE),
        hooks_configured=bool(settings.ZOEKT_GITLAB_HOOK_SECRETS),
        last_sweep=_sweep(last),
        last_complete_sweep_at=complete["finished_at"] if complete else None,
        hooks=hooks,
        hook_lag_seconds=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
    )


def recent_sweeps(limit: int = 20) -> list[dict[str, Any]]:
    """The newest sweeps, as the dashboard lists them."""
    out = []
    for record in Sweep.objects.order_by("-id")[:limit]:
        row = _sweep(record)
        counts = record.counts
        end = record.finished_at or record.updated_at
        row.update(
            kind=record.kind,
            groups=counts.get("groups", 0),
            removed=sum((counts.get("removed") or {}).values()),
            seconds=(end - record.started_at).total_seconds(),
        )
        out.append(row)
    return out


def recent_hooks(limit: int = 50) -> list[HookEvent]:
    """The newest system hook events, pending and failed ones first."""
    order = {HookEvent.State.PENDING: 0, HookEvent.State.FAILED: 1, HookEvent.State.DONE: 2}
    rows = list(HookEvent.objects.order_by("-id")[:limit])
    return sorted(rows, key=lambda e: (order[e.state], -e.id))
