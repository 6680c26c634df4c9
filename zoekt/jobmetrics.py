"""How long each job runs, kept in Redis for ``/metrics``.

Every Celery job run is timed by two signal handlers (``task_prerun`` and
``task_postrun``, connected by ``config.celery``) and added to five Redis
hashes keyed by the cache's prefix, in one round trip: runs, failed runs,
seconds in all, and the duration and end time of the last run. Redis, not the
process, holds them because jobs run in the workers and ``/metrics`` is
answered by the web processes; every web replica reads the same figures.

A job is the Celery task's name, except that one ``zoekt.run_scheduled_task``
per scheduled task is told apart: ``zoekt.run_scheduled_task:<task>``.
Counting is best effort: a Redis error is logged and the job is unaffected.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from zoekt import clock
from zoekt.logging import get_logger

log = get_logger(__name__)

FIELDS = ("runs", "failures", "seconds", "last_seconds", "last_finished")
SCHEDULED_TASK_JOB = "zoekt.run_scheduled_task"

_client_lock = threading.Lock()
_client: Any = None
_started: dict[str, float] = {}


def _redis():
    """A client on the cache's Redis database (made once per process)."""
    global _client
    with _client_lock:
        if _client is None:
            import redis
            from django.conf import settings

            _client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
        return _client


def _key(field: str) -> str:
    from django.conf import settings

    return f"{settings.CACHES['default']['KEY_PREFIX']}:jobs:{field}"


def job_name(task_name: str, args: Any = None, kwargs: Any = None) -> str:
    """The job a run counts for: the task's name, with the scheduled task for scheduling jobs."""
    if task_name == SCHEDULED_TASK_JOB:
        name = (kwargs or {}).get("name") or (args[0] if args else None)
        if name:
            return f"{SCHEDULED_TASK_JOB}:{name}"
    return task_name


def record(job: str, seconds: float, *, failed: bool = False) -> None:
    """Add one run of ``job`` that took ``seconds``."""
    pipe = _redis().pipeline(transaction=False)
    pipe.hincrby(_key("runs"), job, 1)
    if failed:
        pipe.hincrby(_key("failures"), job, 1)
    pipe.hincrbyfloat(_key("seconds"), job, seconds)
    pipe.hset(_key("last_seconds"), job, seconds)
    pipe.hset(_key("last_finished"), job, clock.now().timestamp())
    pipe.execute()


@dataclasses.dataclass(frozen=True)
class JobFigures:
    job: str
    runs: int
    failures: int
    seconds: float
    last_seconds: float
    last_finished: float  # Unix time


def read() -> list[JobFigures]:
    """Every job's figures, by name (one round trip)."""
    pipe = _redis().pipeline(transaction=False)
    for field in FIELDS:
        pipe.hgetall(_key(field))
    maps = [{key.decode(): value.decode() for key, value in raw.items()} for raw in pipe.execute()]
    runs, failures, seconds, last_seconds, last_finished = maps
    return [
        JobFigures(
            job=job,
            runs=int(runs[job]),
            failures=int(failures.get(job, 0)),
            seconds=float(seconds.get(job, 0.0)),
            last_seconds=float(last_seconds.get(job, 0.0)),
            last_finished=float(last_finished.get(job, 0.0)),
        )
        for job in sorted(runs)
    ]


def reset() -> None:
    """Forget every figure (tests, and an operator starting over)."""
    _redis().delete(*(_key(field) for field in FIELDS))


# --- Celery signals (connected in config.celery) ---------------------------------------------


def on_prerun(task_id: str | None = None, **_: Any) -> None:
    if task_id:
        _started[task_id] = time.monotonic()


def on_postrun(
    task_id: str | None = None,
    task: Any = None,
    args: Any = None,
    kwargs: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    started = _started.pop(task_id, None) if task_id else None
    if started is None or task is None:
        return
    job = job_name(task.name, args, kwargs)
    try:
        record(job, time.monotonic() - started, failed=state == "FAILURE")
    except Exception as exc:  # the job's outcome never depends on its metrics
        log.warning("job_metrics_not_recorded", job=job, error=f"{type(exc).__name__}: {exc}")
