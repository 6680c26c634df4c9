"""Celery tasks of the fleet domain: thin, argument-free, one log line each."""

from __future__ import annotations

from celery import shared_task

from zoekt import actions, memory
from zoekt.buffer_factor import refresh_global_buffer_factor
from zoekt.locks import LockKey, try_advisory_lock
from zoekt.logging import get_logger
from zoekt.reasons import Reason

log = get_logger(__name__)


@shared_task(name="zoekt.update_replica_states")
def update_replica_states_task() -> dict:
    with try_advisory_lock(LockKey.UPDATE_REPLICA_STATES) as acquired:
        if not acquired:
            log.info("update_replica_states", skipped=Reason.LOCK_HELD)
            return {"skipped": Reason.LOCK_HELD}
        result = actions.do_update_replica_states()
    log.info("update_replica_states", **result)
    return result


@shared_task(name="zoekt.refresh_buffer_factor")
def refresh_buffer_factor_task() -> dict:
    with try_advisory_lock(LockKey.REFRESH_BUFFER_FACTOR) as acquired:
        if not acquired:
            log.info("refresh_buffer_factor", skipped=Reason.LOCK_HELD)
            return {"skipped": Reason.LOCK_HELD}
        factor = refresh_global_buffer_factor()
    result = {
        "buffer_factor": factor.value,
        "reason": factor.reason,
        "used_storage_bytes": factor.used_storage_bytes,
        "repository_size": factor.repository_size,
    }
    log.info("refresh_buffer_factor", **result)
    return result


@shared_task(name="zoekt.calibrate_memory_ratio")
def calibrate_memory_ratio_task() -> dict:
    """Auto-calibration of ``memory_ratio`` (opt-in; a no-op without RSS reports)."""
    with try_advisory_lock(LockKey.CALIBRATE_MEMORY_RATIO) as acquired:
        if not acquired:
            log.info("calibrate_memory_ratio", skipped=Reason.LOCK_HELD)
            return {"skipped": Reason.LOCK_HELD}
        result = memory.calibrate_memory_ratio().as_dict()
    log.info("calibrate_memory_ratio", **result)
    return result


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
