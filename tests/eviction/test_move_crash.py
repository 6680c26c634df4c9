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
from tests.config.test_celery_integration import _test_database_url
from tests.eviction.conftest import beat, ready_namespace
from tests.eviction.test_moves import HOUR, _finish_indexing, _keep_online, _targets
from tests.factories import GIB, NodeFactory
from zoekt import app_settings, clock
from zoekt.models import Index, Move, Replica, Repository

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
    elif step == "swap":
        from zoekt import actions
        from eviction import moves
        hang_after(actions, "do_evict_index")
        moves.advance_move(int(arg))
    else:
        # "module:function": hang after it, inside one step of move ``arg``.
        import importlib
        from eviction import moves
        module, name = step.split(":")
        hang_after(importlib.import_module(module), name)
        moves.advance_move(int(arg))
"""


def _kill_inside(step: str, arg: str, tmp_path: Path) -> None:
    marker = tmp_path / f"{step.replace(':', '-')}.marker"
    env = {
        **os.environ,
        "DATABASE_URL": _test_database_url(),
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "DJANGO_SETTINGS_MODULE": "config.settings",
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


def _wait_for_state(move: Move, state: str) -> None:
    """Wait until the killed step's transaction is rolled back: ``move`` is back in ``state``."""

    def back() -> bool:
        move.refresh_from_db()
        return move.state == state

    _wait_for_rollback(back)


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
    _wait_for_state(move, Move.State.BUILDING)
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


def test_killed_while_a_queued_move_starts_building_it_stays_queued(now, tmp_path):
    hot, roomy, enabled = _fleet()
    app_settings.update(zoekt_move_max_per_source=0)  # every move waits for a slot
    eviction.run_node_level()
    move = Move.objects.get()
    assert move.state == Move.State.PLANNED
    app_settings.update(zoekt_move_max_per_source=2)
    _keep_online(hot, roomy)

    _kill_inside("eviction.moves:_build", str(move.id), tmp_path)

    _wait_for_state(move, Move.State.PLANNED)
    assert move.replacement_index_id is None
    assert not Index.objects.filter(zoekt_node=roomy).exists()
    assert Replica.objects.filter(zoekt_enabled_namespace=enabled).count() == 1
    assert _targets(enabled) == [hot.id]
    assert moves.advance_move(move.id) == Move.State.BUILDING
    assert Index.objects.filter(zoekt_node=roomy).count() == 1


@pytest.mark.parametrize("attempts", [1, moves.MAX_ATTEMPTS], ids=["retry", "park"])
def test_killed_while_a_failed_build_is_retired_the_next_run_retires_it(now, tmp_path, attempts):
    hot, roomy, enabled = _fleet()
    eviction.run_node_level()
    move = Move.objects.get()
    Move.objects.filter(pk=move.pk).update(details={**move.details, "attempts": attempts})
    clock.advance(Move.deadline_seconds(move.bytes) + 1)
    _keep_online(hot, roomy)

    _kill_inside("zoekt.actions:do_evict_replicas", str(move.id), tmp_path)

    _wait_for_state(move, Move.State.BUILDING)
    # Nothing retired, nothing recorded: the replacement still builds, the source serves.
    assert Index.objects.get(pk=move.replacement_index_id).state == Index.State.PENDING
    assert Replica.objects.filter(pk=move.replacement_replica_id).exists()
    assert _targets(enabled) == [hot.id]

    expected = Move.State.PLANNED if attempts < moves.MAX_ATTEMPTS else Move.State.PARKED
    assert moves.advance_move(move.id) == expected
    assert Index.objects.get(pk=move.replacement_index_id).state == Index.State.EVICTED
    assert Replica.objects.filter(zoekt_enabled_namespace=enabled).count() == 1
    assert _targets(enabled) == [hot.id]


def test_killed_in_the_middle_of_a_carve_the_source_keeps_its_whole_range(now, tmp_path):
    from tests.eviction.test_resplit import (
        _hot_namespace,
        _index_replacement,
        _node,
        memory_planning_on,
    )

    memory_planning_on()
    hot, cold = _node("hot", used=30 * GIB), _node("cold")
    enabled, index = _hot_namespace(hot)
    plan = moves.start_resplit(enabled.root_namespace_id)
    move = Move.objects.get(pk=plan.move_id)
    _index_replacement(move)

    _kill_inside("eviction.moves:_narrow", str(move.id), tmp_path)

    _wait_for_state(move, Move.State.BUILDING)
    index.refresh_from_db()
    assert index.metadata == {}
    assert not Repository.objects.filter(
        zoekt_index=index, state=Repository.State.PENDING_DELETION
    ).exists()
    assert Index.objects.get(pk=move.replacement_index_id).zoekt_replica_id == (
        move.replacement_replica_id
    )
    assert _targets(enabled) == [hot.id]

    assert moves.advance_move(move.id) == Move.State.DONE
    index.refresh_from_db()
    assert index.metadata != {}
    assert sorted(_targets(enabled)) == sorted([hot.id, cold.id])
