"""An index's used bytes converge to the sum of its repositories' sizes (reference 4.3, 7.5).

Eviction sizes indices from ``used_storage_bytes``, so it must be the sum of
``size_bytes`` over the index's repositories once indexing stops: within one
refresh period (a scheduling tick) of the last callback, whatever the pace of
the callbacks and of the ticks. The reservation follows by the existing rules.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction

from simulator.replay import Replay, catalog_rows
from tests.api.helpers import make_repository, make_task
from tests.factories import GIB, IndexFactory, NodeFactory
from tests.scheduling.conftest import set_setting
from zoekt import actions, capacity, clock
from zoekt.models import Index, Node, Repository, Task
from zoekt.scheduling import events, handlers
from zoekt.scheduling.service import TASKS, SchedulingService

I = Index.State  # noqa: E741
R = Repository.State
W = Index.WatermarkLevel
MIB = 1024**2

# The scheduled tasks of a tick that move an index's bytes and state, in the tick's order.
STORAGE_TASKS = (
    "force_update_overprovisioned_index",
    "mark_indices_as_ready",
    "update_index_used_storage_bytes",
)


def run_event(event: str, args: tuple) -> None:
    """A dispatched event, run at once as a worker would run it."""
    events.EVENTS[event](*args)


def tick() -> None:
    """One scheduling pass, as beat (or the demo driver) runs it."""
    service = SchedulingService(dispatch=run_event)
    for task in STORAGE_TASKS:
        service.execute(task)


def index_being_indexed(count: int) -> tuple[Node, Index, list[Task]]:
    """An initializing index holding the planner's 10 GiB, ``count`` repositories in flight."""
    node = NodeFactory(total_bytes=100 * GIB, used_bytes=10 * GIB)
    index = IndexFactory(zoekt_node=node, state=I.INITIALIZING, reserved_storage_bytes=10 * GIB)
    tasks = [
        make_task(make_repository(index, state=R.INITIALIZING), state=Task.State.PROCESSING)
        for _ in range(count)
    ]
    return node, index, tasks


def report(node: Node, task: Task, size: int | None = None) -> None:
    """The node reports ``task`` done; an index task with the repository's size."""
    body: dict = {"name": "index", "success": True, "payload": {"task_id": task.id}}
    if size is not None:
        body["additional_payload"] = {"repo_stats": {"size_in_bytes": size, "index_file_count": 1}}
    assert actions.do_apply_callback(node, body).action == "done"


def held_bytes(index: Index) -> int:
    return sum(Repository.objects.filter(zoekt_index=index).values_list("size_bytes", flat=True))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("count", "callback_every", "tick_every", "first_tick"),
    [
        # Beat's pace: one pass a minute, a first callback just before it, the others in 21 s.
        pytest.param(8, 3, 60, 1, id="beat-burst-under-30s"),
        # The demo driver's pace: a pass every 2 s, a callback every second.
        pytest.param(12, 1, 2, 1, id="driver-every-2s"),
        # A longer run: the last pass of indexing falls 5 s before the last callback.
        pytest.param(6, 10, 60, 45, id="beat-long-run"),
        # Callbacks further apart than the debounce.
        pytest.param(4, 40, 60, 30, id="beat-callbacks-40s-apart"),
    ],
)
def test_used_bytes_equal_the_repositories_sizes_one_tick_after_indexing_stops(
    now, count, callback_every, tick_every, first_tick
):
    node, index, tasks = index_being_indexed(count)
    sizes = [(7 + 13 * i) * MIB for i in range(count)]
    callbacks = [(i * callback_every, "callback", i) for i in range(count)]
    last_callback = callbacks[-1][0]
    ticks = []
    at = first_tick
    while at <= last_callback + tick_every:
        ticks.append((at, "tick", None))
        at += tick_every

    elapsed = 0
    first_tick_after_stop = None
    # A callback and a tick at the same second: the callback first.
    for at, kind, i in sorted(callbacks + ticks, key=lambda e: (e[0], e[1])):
        clock.advance(at - elapsed)
        elapsed = at
        if kind == "callback":
            report(node, tasks[i], sizes[i])
        else:
            tick()
            if at > last_callback:
                first_tick_after_stop = at
                break

    assert first_tick_after_stop is not None
    assert first_tick_after_stop - last_callback <= tick_every
    index.refresh_from_db()
    assert held_bytes(index) == sum(sizes)
    assert index.used_storage_bytes == sum(sizes)
    # The reservation follows: the index is ready, so it shrinks to used ÷ 0.6.
    assert index.state == I.READY
    assert index.reserved_storage_bytes == int(sum(sizes) / capacity.STORAGE_IDEAL_PERCENT_USED)
    assert index.watermark_level == W.HEALTHY
    # And stays there: the next passes have nothing to do.
    before = Index.objects.filter(pk=index.pk).values().get()
    clock.advance(tick_every)
    tick()
    assert Index.objects.filter(pk=index.pk).values().get() == before


@pytest.mark.django_db
def test_a_ready_index_re_indexed_within_30_s_of_its_last_stamp_is_recounted(now):
    node, index, tasks = index_being_indexed(2)
    report(node, tasks[0], 100 * MIB)
    report(node, tasks[1], 200 * MIB)
    clock.advance(1)
    tick()
    index.refresh_from_db()
    assert (index.state, index.used_storage_bytes) == (I.READY, 300 * MIB)

    # A re-index of the first repository, 10 s after the last stamp: its size grew.
    reindex = make_task(Repository.objects.get(pk=tasks[0].zoekt_repository_id))
    clock.advance(9)
    report(node, reindex, 400 * MIB)
    clock.advance(60)
    tick()

    index.refresh_from_db()
    assert index.used_storage_bytes == 600 * MIB
    assert index.reserved_storage_bytes == int(600 * MIB / capacity.STORAGE_IDEAL_PERCENT_USED)


@pytest.mark.django_db
def test_a_deleted_repository_leaves_the_used_bytes_within_one_tick(now):
    node, index, tasks = index_being_indexed(2)
    report(node, tasks[0], 100 * MIB)
    report(node, tasks[1], 200 * MIB)
    clock.advance(60)
    tick()
    index.refresh_from_db()
    assert index.used_storage_bytes == 300 * MIB

    repository = Repository.objects.get(pk=tasks[1].zoekt_repository_id)
    Repository.objects.filter(pk=repository.pk).update(state=R.DELETED)
    delete = make_task(repository, task_type=Task.TaskType.DELETE_REPO, state=Task.State.PROCESSING)
    clock.advance(60)
    report(node, delete)
    clock.advance(1)
    tick()

    index.refresh_from_db()
    assert index.used_storage_bytes == 100 * MIB


# --- the write stays cheap --------------------------------------------------------------------


@pytest.mark.django_db
def test_a_callback_on_an_index_already_stale_writes_nothing_to_it_for_30_s(now):
    node, index, tasks = index_being_indexed(3)
    report(node, tasks[0], MIB)  # stamps the index: it is stale until the next refresh
    stamped = Index.objects.filter(pk=index.pk).values().get()
    assert stamped["last_indexed_at"] == now

    clock.advance(10)
    report(node, tasks[1], MIB)
    clock.advance(20)
    report(node, tasks[2], MIB)

    assert Index.objects.filter(pk=index.pk).values().get() == stamped


@pytest.mark.django_db
def test_a_callback_after_a_refresh_marks_the_index_stale_at_once(now):
    node, index, tasks = index_being_indexed(2)
    report(node, tasks[0], MIB)
    clock.advance(1)
    handlers.update_index_used_storage_bytes()
    assert not Index.objects.with_stale_used_storage_bytes_updated_at().exists()

    clock.advance(1)  # 2 s after the last stamp, well inside GitLab's 30 s
    report(node, tasks[1], MIB)

    index.refresh_from_db()
    assert index.last_indexed_at == clock.now()
    assert Index.objects.with_stale_used_storage_bytes_updated_at().get() == index


@pytest.mark.django_db
def test_a_callback_whose_clock_is_behind_the_refresh_still_marks_the_index_stale(now):
    node, index, tasks = index_being_indexed(2)
    report(node, tasks[0], MIB)
    # A refresh in a process whose clock runs 2 s ahead of this one.
    with clock.frozen(now + timedelta(seconds=3)):
        handlers.update_index_used_storage_bytes()
    clock.advance(1)
    report(node, tasks[1], MIB)

    assert Index.objects.with_stale_used_storage_bytes_updated_at().get() == index
    clock.advance(60)
    tick()
    index.refresh_from_db()
    assert index.used_storage_bytes == 2 * MIB


# --- a refresh and a callback at the same time --------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_refresh_while_a_callback_commits_does_not_lose_its_size():
    """The refresh counts a callback that commits while it runs, or the callback marks it stale.

    The index was stamped 5 s before the callback, so GitLab's debounce alone
    would write nothing; the refresh starts after the callback wrote its
    repository's size but before it committed.
    """
    set_setting(zoekt_indexing_enabled=True)
    start = clock.now()
    with clock.frozen(start):
        node, index, tasks = index_being_indexed(2)
        report(node, tasks[0], 100 * MIB)
        handlers.update_index_used_storage_bytes()
        assert Index.objects.get(pk=index.pk).used_storage_bytes == 100 * MIB
    Index.objects.filter(pk=index.pk).update(
        used_storage_bytes_updated_at=start - timedelta(seconds=10),
        last_indexed_at=start - timedelta(seconds=5),
    )
    written, release, refreshed = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def callback() -> None:
        try:
            with clock.frozen(start), transaction.atomic():
                report(node, tasks[1], 200 * MIB)
                written.set()
                release.wait(timeout=10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            written.set()
            connection.close()

    def refresh() -> None:
        try:
            with clock.frozen(start + timedelta(seconds=1)):
                handlers.update_index_used_storage_bytes()
        except BaseException as exc:
            errors.append(exc)
        finally:
            refreshed.set()
            connection.close()

    threads = [threading.Thread(target=callback), threading.Thread(target=refresh)]
    threads[0].start()
    assert written.wait(timeout=10)
    threads[1].start()
    refreshed.wait(timeout=1)  # returns at once unless the refresh waits for the callback
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors

    with clock.frozen(start + timedelta(seconds=60)):
        handlers.update_index_used_storage_bytes()  # the next tick
    assert Index.objects.get(pk=index.pk).used_storage_bytes == 300 * MIB


# --- a fleet at the demo driver's pace ------------------------------------------------------------


def scheduling_every(replay: Replay, seconds: float) -> None:
    """Run the every-tick scheduled tasks every ``seconds`` (the throttled ones keep theirs)."""
    for job in replay.jobs:
        if job.name in TASKS and job.period in (2, 60):
            job.period = seconds


@pytest.mark.django_db(transaction=True)
def test_a_fleet_indexed_at_the_demo_drivers_pace_records_what_its_indices_hold():
    """``make demo``'s driver: a scheduling pass every 2 s until convergence, then beat's minute.

    Nodes that index two repositories at a time call back over several passes,
    so each index is refreshed between its callbacks.
    """
    roots = {9400 + k: f"root-{k}" for k in range(4)}
    projects = [
        (60_000 + 10 * k + j, root, (5 + 7 * j) * MIB)
        for k, root in enumerate(roots)
        for j in range(8)
    ]
    sizes = {project_id: size for project_id, _, size in projects}
    with Replay(index_size=sizes.__getitem__, tick_seconds=2, node_concurrency=2) as replay:
        scheduling_every(replay, 2)
        replay.settings(zoekt_indexing_enabled=True)
        replay.load_catalog(*catalog_rows(roots, projects))
        for name in ("zoekt-a", "zoekt-b"):
            replay.add_node(name, disk_total_bytes=10 * GIB, disk_base_used_bytes=GIB)
        replay.enable(list(roots))
        assert replay.run(3600, until=lambda r: r.converged())
        scheduling_every(replay, 60)  # the driver stops; beat alone
        replay.run(62)  # one pass of beat

    recorded = dict(Index.objects.values_list("id", "used_storage_bytes"))
    held = {index_id: held_bytes(Index(pk=index_id)) for index_id in recorded}
    assert len(recorded) >= 4
    assert sum(held.values()) == sum(sizes.values())
    assert recorded == held
    for index in Index.objects.all():
        assert index.reserved_storage_bytes == int(
            index.used_storage_bytes / capacity.STORAGE_IDEAL_PERCENT_USED
        )
