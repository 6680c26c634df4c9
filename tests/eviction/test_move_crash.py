"""A worker killed with SIGKILL in the middle of a move's step: the step's transaction rolls
back, nothing is lost or left twice, and the next run completes the move.

The step runs in a real second process against the test database; a patched function in
that process writes a marker file and sleeps inside the step's transaction, and the test
kills the process there (PostgreSQL rolls back a transaction whose connection died)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from django.conf import settings

from eviction import actions as eviction
from eviction import moves
from tests.eviction.conftest import beat, ready_namespace
from tests.eviction.test_moves import HOUR, _finish_indexing, _keep_online, _targets
from tests.factories import GIB, NodeFactory
from tests.test_celery_integration import _test_database_url
from zoekt import app_settings, clock
from zoekt.models import Index, Move, Replica

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]

#: The child: freeze the clock at the parent's "now", patch ``target`` to mark and
#: hang after the original ran, then run ``step``.
CHILD = """
import sys, time, pathlib
from datetime import datetime
import django
django.setup()
from zoekt import clock
marker, at, step, arg = sys.argv[1], datetime.fromisoformat(sys.argv[2]), sys.argv[3], sys.argv[4]

def hang_after(module, name):
    original = getattr(module, name)
    def patched(*args, **kwargs):
        result = original(*args, **kwargs)
        pathlib.Path(marker).write_text("in the transaction")
        time.sleep(120)
        return result
    setattr(module, name, patched)

with clock.frozen(at):
    if step == "start":
        from eviction import actions, moves
        hang_after(moves, "_build")
        actions.run_node_level()
    else:
        from zoekt import actions
        from eviction import moves
        hang_after(actions, "do_evict_index")
        moves.advance_move(int(arg))
"""


def _kill_inside(step: str, arg: str, tmp_path: Path) -> None:
    marker = tmp_path / f"{step}.marker"
    env = {
        **os.environ,
        "DATABASE_URL": _test_database_url(),
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "DJANGO_SETTINGS_MODULE": "zoekt.settings",
    }
    env.pop("DJANGO_SECRET_KEY_FILE", None)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(CHILD),
            str(marker),
            clock.now().isoformat(),
            step,
            arg,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            if child.poll() is not None:
                raise AssertionError(child.stdout.read().decode()[-3000:])
            assert time.monotonic() < deadline, "the child never reached the step"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL


def _fleet():
    app_settings.update(zoekt_eviction_moves=True)
    hot = NodeFactory(total_bytes=100 * GIB, used_bytes=50 * GIB, metadata={"name": "hot"})
    roomy = NodeFactory(total_bytes=100 * GIB, used_bytes=GIB, metadata={"name": "roomy"})
    enabled = ready_namespace(hot, 10 * GIB)
    hot = beat(hot, 80 * GIB)
    hot = beat(hot, 80 * GIB, seconds=9 * HOUR)
    roomy = beat(roomy, GIB, seconds=0)
    return hot, roomy, enabled


def _wait_for_rollback(check, seconds: float = 10) -> None:
    """The server ends the dead connection's transaction as it notices; wait for it."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_killed_while_starting_a_move_leaves_nothing_half_built(now, tmp_path):
    hot, roomy, enabled = _fleet()

    _kill_inside("start", "-", tmp_path)

    # Rolled back: no move, no build replica, no replacement, no decision applied.
    _wait_for_rollback(lambda: not Replica.objects.filter(state=Replica.State.PENDING).exists())
    assert not Move.objects.exists()
    assert Replica.objects.filter(zoekt_enabled_namespace=enabled).count() == 1
    assert not Index.objects.filter(zoekt_node=roomy).exists()
    assert _targets(enabled) == [hot.id]
    # The next run starts it afresh.
    eviction.run_node_level()
    assert Move.objects.get().state == Move.State.BUILDING


def test_killed_in_the_middle_of_the_swap_the_next_run_completes_it(now, tmp_path):
    hot, roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    _finish_indexing(move)
    _keep_online(hot, roomy)

    _kill_inside("swap", str(move.id), tmp_path)

    # Rolled back: the source still serves in its replica, the replacement waits in its own.
    def rolled_back() -> bool:
        move.refresh_from_db()
        return move.state == Move.State.BUILDING

    _wait_for_rollback(rolled_back)
    source = Index.objects.get(pk=move.source_index_ref)
    assert (source.state, source.zoekt_replica_id) == (Index.State.READY, move.source_replica_ref)
    replacement = Index.objects.get(pk=move.replacement_index_id)
    assert replacement.zoekt_replica_id == move.replacement_replica_id
    assert _targets(enabled) == [hot.id]

    assert moves.advance_move(move.id) == Move.State.DONE
    (replica,) = Replica.objects.filter(zoekt_enabled_namespace=enabled)
    assert list(Index.objects.filter(zoekt_replica=replica).values_list("id", flat=True)) == [
        move.replacement_index_id
    ]
    assert Index.objects.get(pk=move.source_index_ref).state == Index.State.EVICTED
    assert _targets(enabled) == [roomy.id]
