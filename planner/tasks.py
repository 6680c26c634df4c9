"""The rollout job: thin, argument-free, one log line (GitLab's ``RolloutWorker``, 5.1).

Beat runs it every 10 minutes (``rollout`` in ``planner.beat``,
expiring after its interval). It does nothing while indexing is disabled or
paused. One run at a time: it takes the ``ROLLOUT`` advisory lock and a run
that finds it held logs ``lock_held`` and returns. The whole run (clean-up,
select, load, plan, apply) is one transaction under that lock; when the result
asks for it, the job enqueues itself again after the commit.
"""

from __future__ import annotations

from celery import shared_task

from planner.rollout import RolloutService
from zoekt import app_settings
from zoekt.locks import LockKey, try_advisory_lock
from zoekt.logging import get_logger
from zoekt.reasons import Reason

log = get_logger(__name__)


@shared_task(name="zoekt.rollout")
def rollout_task() -> dict:
    settings = app_settings.current()
    skipped = settings.indexing_gate
    if skipped is not None:
        log.info("rollout", skipped=skipped)
        return {"skipped": skipped}

    with try_advisory_lock(LockKey.ROLLOUT) as acquired:
        if not acquired:
            log.info("rollout", skipped=Reason.LOCK_HELD)
            return {"skipped": Reason.LOCK_HELD}
        # Decision records feed the dashboard's explanation (planner.records).
        service = RolloutService(record_decisions=True)
        result = service.execute(dry_run=False, batch_size=settings.rollout_batch_size)
    # Committed: a re-enqueued run sees this run's rows.
    summary = result.summary()
    log.info("rollout", **summary)
    if result.re_enqueue:
        rollout_task.apply_async(countdown=0)
    return summary
