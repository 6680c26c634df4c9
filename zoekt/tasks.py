"""Celery tasks of the fleet domain: thin, argument-free, one log line each."""

from __future__ import annotations

from celery import shared_task

from zoekt import actions, memory, shutdowns
from zoekt.buffer_factor import refresh_global_buffer_factor
from zoekt.locks import LockKey, try_advisory_lock
from zoekt.logging import get_logger
from zoekt.reasons import Reason

log = get_logger(__name__)


def _locked_job(event: str, lock: LockKey, run) -> dict:
    """Run ``run`` under ``lock``, or skip it while another process holds the lock.

    One log record, ``event``, either way; the result is returned as logged.
    """
    with try_advisory_lock(lock) as acquired:
        result = run() if acquired else {"skipped": Reason.LOCK_HELD}
    log.info(event, **result)
    return result


@shared_task(name="zoekt.update_replica_states")
def update_replica_states_task() -> dict:
    return _locked_job(
        "update_replica_states", LockKey.UPDATE_REPLICA_STATES, actions.do_update_replica_states
    )


def _refresh_buffer_factor() -> dict:
    factor = refresh_global_buffer_factor()
    return {
        "buffer_factor": factor.value,
        "reason": factor.reason,
        "used_storage_bytes": factor.used_storage_bytes,
        "repository_size": factor.repository_size,
    }


@shared_task(name="zoekt.refresh_buffer_factor")
def refresh_buffer_factor_task() -> dict:
    return _locked_job(
        "refresh_buffer_factor", LockKey.REFRESH_BUFFER_FACTOR, _refresh_buffer_factor
    )


@shared_task(name="zoekt.calibrate_memory_ratio")
def calibrate_memory_ratio_task() -> dict:
    """Auto-calibration of ``memory_ratio`` (opt-in; a no-op without RSS reports)."""
    return _locked_job(
        "calibrate_memory_ratio",
        LockKey.CALIBRATE_MEMORY_RATIO,
        lambda: memory.calibrate_memory_ratio().as_dict(),
    )


@shared_task(name="zoekt.log_node_memory")
def log_node_memory_task() -> dict:
    """One structured ``zoekt_node_memory`` record per search node: estimate vs observed."""
    report = memory.node_memory_report()
    for node in report:
        log.info("zoekt_node_memory", **node.as_dict())
    return {"nodes": len(report)}


@shared_task(name="zoekt.handle_task_failed")
def handle_task_failed_task(task_id: int) -> dict:
    result = actions.do_handle_task_failed(task_id)
    log.info("handle_task_failed", **result)
    return result


@shared_task(name="zoekt.sweep_failed_tasks")
def sweep_failed_tasks_task() -> dict:
    """The failed tasks whose message was lost, handled from the database state."""
    result = actions.do_sweep_failed_tasks()
    log.info("sweep_failed_tasks", **result)
    return result


@shared_task(name="zoekt.settle_node_shutdowns")
def settle_node_shutdowns_task() -> dict:
    """Restart records: complete those whose node came back with its data, close those
    whose allowed delay passed (docs/operations.md)."""
    return _locked_job(
        "settle_node_shutdowns", LockKey.SETTLE_NODE_SHUTDOWNS, shutdowns.do_settle_node_shutdowns
    )
