"""A real Celery worker and a real beat, against the real Redis, run a periodic task.

The beat reads its schedule from the database (django-celery-beat), so the
test stores a one-second entry for ``zoekt.update_replica_states`` there, as
an operator would in the admin, and waits for the worker's effect: a pending
replica whose indices are all ready becomes ready.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from config.celery import BEAT_SCHEDULE
from tests.factories import IndexFactory, ReplicaFactory
from zoekt.models import Index, Replica

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _test_database_url() -> str:
    db = connection.settings_dict
    host = quote(db["HOST"] or "", safe="")
    port = f":{db['PORT']}" if db.get("PORT") else ""
    password = f":{quote(db['PASSWORD'])}" if db.get("PASSWORD") else ""
    return f"postgres://{quote(db['USER'] or '')}{password}@{host}{port}/{db['NAME']}"


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", *args],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_worker_and_beat_run_a_periodic_task_whose_effect_reaches_the_database(tmp_path):
    replica = ReplicaFactory()
    IndexFactory(zoekt_replica=replica, state=Index.State.READY)
    IndexFactory(zoekt_replica=replica, state=Index.State.READY)
    untouched = ReplicaFactory()  # no indices: must stay pending
    every_second, _ = IntervalSchedule.objects.get_or_create(
        every=1, period=IntervalSchedule.SECONDS
    )
    PeriodicTask.objects.create(
        name="test-fast-replica-states", task="zoekt.update_replica_states", interval=every_second
    )

    queue = f"test-{uuid.uuid4().hex[:8]}"
    env = _worker_env(queue)
    worker = _spawn(
        [
            "worker",
            "--loglevel",
            "INFO",
            "--pool",
            "solo",
            "-Q",
            queue,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        env,
        tmp_path / "worker.log",
    )
    beat = _spawn(["beat", "--loglevel", "INFO", "--max-interval", "1"], env, tmp_path / "beat.log")
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            replica.refresh_from_db()
            if replica.state == Replica.State.READY:
                break
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert beat.poll() is None, (tmp_path / "beat.log").read_text()[-3000:]
            time.sleep(0.5)
    finally:
        _stop(beat)
        _stop(worker)

    logs = (tmp_path / "worker.log").read_text()
    assert replica.state == Replica.State.READY, logs[-3000:]
    untouched.refresh_from_db()
    assert untouched.state == Replica.State.PENDING
    assert '"replicas_marked_ready": 1' in logs
    # The entries declared in code were stored in the database by the beat.
    stored = set(PeriodicTask.objects.values_list("name", flat=True))
    assert set(BEAT_SCHEDULE) <= stored, stored


def test_every_task_dispatched_by_name_is_registered_in_a_plain_django_process():
    """A web server, a replay or a management command is not a worker: Celery's
    autodiscovery has not run there, yet eager dispatch and ``apply_async`` by name
    look the task up in the registry. The apps register their task modules."""
    script = (
        "import django, json\n"
        "django.setup()\n"
        "from celery import current_app\n"
        "from zoekt import hooks\n"
        "from config.celery import BEAT_SCHEDULE\n"
        "from eviction.tasks import EVICTION_EVENTS\n"
        "names = set(EVICTION_EVENTS.values())\n"
        "names |= {entry['task'] for entry in BEAT_SCHEDULE.values()}\n"
        "names |= {hooks.HANDLE_TASK_FAILED, hooks.INDEX_PROJECT}\n"
        "print(json.dumps(sorted(names - set(current_app.tasks))))\n"
        "print(len(names))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    missing, count = out.stdout.strip().splitlines()
    assert missing == "[]"
    assert int(count) >= 10


def _worker_env(queue: str, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": _test_database_url(),
        "REDIS_URL": os.environ["REDIS_URL"],
        "REDIS_BROKER_DB": "14",
        "CELERY_QUEUE": queue,
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        **extra,
    }
    env.pop("DJANGO_SECRET_KEY_FILE", None)
    return env


FIVE_MINUTES = 300
WORKER_ARGS = ["worker", "--loglevel", "INFO", "--pool", "solo", "--without-gossip"]


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0] > 0


def test_a_message_whose_worker_was_killed_mid_task_is_redelivered_and_runs_once(tmp_path):
    """SIGKILL of the whole worker while it runs a one-off task (the final-failure
    handling of a repository): the message was not acknowledged, so Redis hands it to
    the next worker after the visibility timeout, and the retry is spent exactly once,
    within 5 minutes of the kill with the shipped settings (no timeout given: the
    default, 240 s, so the test waits about 4 minutes)."""
    import signal
    import threading

    from django.db import connections

    from tests.factories import RepositoryFactory, TaskFactory
    from zoekt.models import HandledTaskFailure, Repository, Task
    from zoekt.tasks import handle_task_failed_task

    repository = RepositoryFactory(retries_left=5)
    task = TaskFactory(zoekt_repository_id=repository.id, state=Task.State.FAILED, retries_left=0)
    queue = f"test-{uuid.uuid4().hex[:8]}"
    # The workers read the broker this process sends to (its database number).
    env = _worker_env(queue, REDIS_BROKER_DB=str(settings.REDIS_BROKER_DB))
    env.pop("ZOEKT_CELERY_VISIBILITY_TIMEOUT", None)  # the shipped default

    # Another session holds the repository's row: the worker's task waits on it.
    holder_ready, release = threading.Event(), threading.Event()

    def hold():
        with connections["default"].cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                "SELECT id FROM zoekt_repositories WHERE id = %s FOR UPDATE", [repository.id]
            )
            holder_ready.set()
            release.wait(60)
            cursor.execute("ROLLBACK")
        connections["default"].close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holder_ready.wait(10)
    first = _spawn([*WORKER_ARGS, "-Q", queue], env, tmp_path / "first.log")
    second = None
    try:
        handle_task_failed_task.apply_async((task.id,), queue=queue)
        deadline = time.monotonic() + 60
        while not _waiting_on_a_lock():
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the worker never reached the task"
            time.sleep(0.2)
        os.kill(first.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        first.wait(10)
        release.set()
        holder.join(10)
        # Nothing was spent: the worker died inside the task's transaction.
        assert Repository.objects.get(pk=repository.pk).retries_left == 5
        assert not HandledTaskFailure.objects.filter(task_id=task.id).exists()
        second = _spawn([*WORKER_ARGS, "-Q", queue], env, tmp_path / "second.log")
        # Back within 5 minutes of the kill (the promise), with the shipped timeout.
        deadline = killed_at + FIVE_MINUTES
        while not HandledTaskFailure.objects.filter(task_id=task.id).exists():
            assert second.poll() is None, (tmp_path / "second.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "second.log").read_text()[-3000:]
            time.sleep(0.5)
        redelivered_after = time.monotonic() - killed_at
    finally:
        release.set()
        holder.join(10)
        if first.poll() is None:
            first.kill()
        if second is not None:
            _stop(second)
    assert first.returncode == -signal.SIGKILL
    assert Repository.objects.get(pk=repository.pk).retries_left == 4
    # Not much sooner either: it was the 240 s timeout that brought it back (less the
    # seconds between the delivery and the kill).
    assert redelivered_after > 180
