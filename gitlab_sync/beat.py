"""Beat entries of the GitLab integration, declared in code (merged into ``zoekt.celery``).
Plain data with no Django import."""

from __future__ import annotations

#: Hooks whose enqueue was lost, and pushes past their debounce.
PROCESS_HOOKS_SECONDS = 60
#: Reconciliation (docs/gitlab.md): a delta sweep every few minutes, a full one daily.
DELTA_SWEEP_SECONDS = 300
FULL_SWEEP_SECONDS = 24 * 3600

GITLAB_BEAT: dict[str, dict] = {
    "gitlab-process-hooks": {
        "task": "gitlab_sync.process_hooks",
        "schedule": float(PROCESS_HOOKS_SECONDS),
        "options": {"expires": PROCESS_HOOKS_SECONDS},
    },
    "gitlab-delta-sweep": {
        "task": "gitlab_sync.delta_sweep",
        "schedule": float(DELTA_SWEEP_SECONDS),
        "options": {"expires": DELTA_SWEEP_SECONDS},
    },
    "gitlab-full-sweep": {
        "task": "gitlab_sync.full_sweep",
        "schedule": float(FULL_SWEEP_SECONDS),
        "options": {"expires": FULL_SWEEP_SECONDS},
    },
}
