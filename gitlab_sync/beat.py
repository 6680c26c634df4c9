"""Beat entries of the GitLab integration, declared in code (merged into ``config.celery``).
Plain data with no Django import."""

from __future__ import annotations

from zoekt.beat import every

#: Hooks whose enqueue was lost, and pushes past their debounce.
PROCESS_HOOKS_SECONDS = 60
#: Reconciliation (docs/gitlab.md): a delta sweep every few minutes, a full one daily.
DELTA_SWEEP_SECONDS = 300
FULL_SWEEP_SECONDS = 24 * 3600

GITLAB_BEAT: dict[str, dict] = {
    "gitlab-process-hooks": every("gitlab_sync.process_hooks", PROCESS_HOOKS_SECONDS),
    "gitlab-delta-sweep": every("gitlab_sync.delta_sweep", DELTA_SWEEP_SECONDS),
    "gitlab-full-sweep": every("gitlab_sync.full_sweep", FULL_SWEEP_SECONDS),
}
