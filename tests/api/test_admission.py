"""Admission control on the heartbeat (zoekt.admission, docs/scheduling.md).

Each rule through the real heartbeat: slots never over-filled, the disk headroom never
crossed with temporary data, the priority order, fairness between namespaces, and
GitLab's hand-out kept as the ``gitlab`` mode.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.api.helpers import (
    GIB,
    heartbeat_body,
    make_index_task,
    make_repository,
    process_metrics,
    set_app_setting,
)
from tests.factories import IndexFactory, ProjectFactory
from zoekt import clock
from zoekt.models import Index, Move, Repository, Task
from zoekt.scheduling.task_creation import create_bulk_tasks

pytestmark = pytest.mark.django_db


def beat(node_api, node, *, used_gib: float = 10, concurrency: int | None = None) -> list[int]:
    extra = {"disk.all": 100 * GIB, "disk.used": int(used_gib * GIB)}
    if concurrency is not None:
        extra["node.concurrency"] = concurrency
    response = node_api.heartbeat(node.uuid, heartbeat_body(extra))
    assert response.status_code == 200, response.content
    return [task["payload"]["Callback"]["payload"]["task_id"] for task in response.json()["tasks"]]


def sized_task(index: Index, gib: float, **kwargs) -> Task:
    return make_index_task(index, repository_size=int(gib * GIB), **kwargs)


def finish(*tasks: Task) -> None:
    Task.objects.filter(id__in=[t.id for t in tasks]).update(state=Task.State.DONE)


# --- slots ------------------------------------------------------------------------------------


def test_in_flight_tasks_hold_their_slots(node_api, node, index):
    tasks = [sized_task(index, 0.01) for _ in range(7)]

    first = beat(node_api, node)
    assert first == [t.id for t in tasks[:4]]
    # Still in flight: offered again, and nothing new while the four slots are taken.
    assert beat(node_api, node) == first
    finish(tasks[0], tasks[1])
    assert beat(node_api, node) == [t.id for t in tasks[2:6]]


def test_a_node_reporting_more_concurrency_gets_more_slots(node_api, node, index):
    tasks = [sized_task(index, 0.01) for _ in range(10)]

    assert beat(node_api, node, concurrency=8) == [t.id for t in tasks[:8]]


# --- disk headroom ----------------------------------------------------------------------------


def test_builds_fill_the_headroom_to_the_build_ceiling_and_no_further(node_api, node, index):
    # 100 GiB at 60 %: 10 GiB to the build ceiling (70 %: the high watermark, 75 %, less
    # the hysteresis band); each build takes 4 GiB beside it.
    tasks = [sized_task(index, 4) for _ in range(4)]

    assert beat(node_api, node, used_gib=60) == [tasks[0].id, tasks[1].id]
    finish(tasks[0])
    # The finished build's temporary bytes are gone; the node reports what it holds now.
    assert beat(node_api, node, used_gib=61) == [tasks[1].id, tasks[2].id]


def test_the_temporary_space_factor_scales_what_a_build_takes(node_api, node, index):
    set_app_setting(zoekt_indexing_temporary_space_factor=0.5)
    tasks = [sized_task(index, 4) for _ in range(4)]

    # 2 GiB a build against 10 GiB of headroom: the four slots fill.
    assert beat(node_api, node, used_gib=60) == [t.id for t in tasks]


def test_past_the_build_ceiling_one_build_at_a_time_up_to_the_high(node_api, node, index):
    tasks = [sized_task(index, 4) for _ in range(3)]

    assert beat(node_api, node, used_gib=68) == [tasks[0].id]
    assert beat(node_api, node, used_gib=71) == [tasks[0].id]
    finish(tasks[0])
    assert beat(node_api, node, used_gib=69) == [tasks[1].id]


def test_a_build_that_would_cross_the_high_watermark_alone_is_held_and_others_pass(
    node_api, node, index
):
    huge = sized_task(index, 20)
    small = sized_task(index, 1)

    # 65 + 20 > 75: never, even alone; the small one goes.
    assert beat(node_api, node, used_gib=65) == [small.id]
    assert Task.objects.get(pk=huge.pk).state == Task.State.PENDING


def test_a_build_that_does_not_fit_yet_is_not_overtaken(node_api, node, index):
    first = sized_task(index, 6)
    second = sized_task(index, 6)
    behind = sized_task(index, 1)

    # 60 % used: the first takes 6 of the 10 GiB; the second waits, and the small one
    # behind it waits too rather than overtake it.
    assert beat(node_api, node, used_gib=60) == [first.id]
    assert {t.state for t in Task.objects.filter(pk__in=[second.pk, behind.pk])} == {
        Task.State.PENDING
    }


def test_deletes_go_out_whatever_the_headroom(node_api, node, index):
    build = sized_task(index, 30)
    delete = make_index_task(index, task_type=Task.TaskType.DELETE_REPO)

    assert beat(node_api, node, used_gib=74) == [delete.id]
    assert Task.objects.get(pk=build.pk).state == Task.State.PENDING


# --- priority ---------------------------------------------------------------------------------


def test_work_is_admitted_in_priority_order(node_api, node, now):
    # Each task's priority is what its repository, index and the live moves say when it is
    # queued.
    ready = IndexFactory(zoekt_node=node, state=Index.State.READY)
    update = sized_task(ready, 0.01, task_type=Task.TaskType.FORCE_INDEX_REPO, indexed_at=now)
    fresh = IndexFactory(zoekt_node=node, state=Index.State.INITIALIZING)
    never_indexed = sized_task(fresh, 0.01)
    lost = IndexFactory(zoekt_node=node, state=Index.State.INITIALIZING)
    lost_data = sized_task(lost, 0.01, indexed_at=now - timedelta(days=1))
    replacement = IndexFactory(zoekt_node=node, state=Index.State.INITIALIZING)
    Move.objects.create(
        trigger="rebalance",
        state=Move.State.BUILDING,
        zoekt_enabled_namespace=replacement.zoekt_enabled_namespace,
        namespace_id=replacement.namespace_id,
        source_node=node,
        source_index_ref=ready.id,
        target_node=node,
        replacement_index=replacement,
    )
    move_build = sized_task(replacement, 0.01)
    delete = make_index_task(ready, task_type=Task.TaskType.DELETE_REPO)
    Task.objects.update(perform_at=clock.now() - timedelta(minutes=5))

    assert beat(node_api, node, concurrency=2) == [delete.id, move_build.id]
    finish(delete, move_build)
    assert beat(node_api, node, concurrency=2) == [lost_data.id, never_indexed.id]
    finish(lost_data, never_indexed)
    assert beat(node_api, node, concurrency=2) == [update.id]


def critical_memory_beat(node_api, node, *, rss_share: float) -> list[int]:
    """A heartbeat whose webserver uses ``rss_share`` of a 1 GiB budget."""
    blocks = {"webserver": process_metrics(rss_bytes=int(rss_share * GIB))}
    response = node_api.heartbeat(node.uuid, heartbeat_body({"process_health": blocks}))
    assert response.status_code == 200, response.content
    return [task["payload"]["Callback"]["payload"]["task_id"] for task in response.json()["tasks"]]


def test_at_critical_memory_new_repositories_wait_and_rebuilds_go_on(node_api, node, now):
    set_app_setting(zoekt_node_memory_budget_bytes=GIB)
    ready = IndexFactory(zoekt_node=node, state=Index.State.READY)
    rebuild = sized_task(ready, 0.01, task_type=Task.TaskType.FORCE_INDEX_REPO, indexed_at=now)
    fresh = IndexFactory(zoekt_node=node, state=Index.State.INITIALIZING)
    never_indexed = sized_task(fresh, 0.01)
    Task.objects.update(perform_at=clock.now() - timedelta(minutes=5))

    # 90 % of the budget (critical at 85 %): only the rebuild of what the node serves.
    assert critical_memory_beat(node_api, node, rss_share=0.90) == [rebuild.id]
    assert Task.objects.get(pk=never_indexed.pk).state == Task.State.PENDING
    # Under it again, the new repository goes out.
    assert critical_memory_beat(node_api, node, rss_share=0.50) == [rebuild.id, never_indexed.id]


def test_without_a_memory_budget_memory_does_not_hold_work(node_api, node, index):
    task = sized_task(index, 0.01)

    assert critical_memory_beat(node_api, node, rss_share=50.0) == [task.id]


# --- fairness ---------------------------------------------------------------------------------


def big_and_small(node, now):
    big = IndexFactory(zoekt_node=node, state=Index.State.INITIALIZING)
    small = IndexFactory(zoekt_node=node, state=Index.State.INITIALIZING)
    big_tasks = [sized_task(big, 0.01) for _ in range(40)]
    small_tasks = [sized_task(small, 0.01) for _ in range(2)]
    # The big namespace queued first, long before the small one.
    for position, task in enumerate(big_tasks):
        Task.objects.filter(pk=task.pk).update(
            perform_at=now - timedelta(hours=2, seconds=-position)
        )
    return big_tasks, small_tasks


def test_a_namespace_with_many_projects_does_not_starve_a_small_one(node_api, node, now):
    big_tasks, small_tasks = big_and_small(node, now)

    assert beat(node_api, node) == [
        big_tasks[0].id,
        small_tasks[0].id,
        big_tasks[1].id,
        small_tasks[1].id,
    ]


def test_a_namespace_queued_later_joins_the_round_being_served(node_api, node, now):
    big_tasks, _small_tasks = big_and_small(node, now)
    finish(*big_tasks[:10], *_small_tasks)
    late = IndexFactory(zoekt_node=node, state=Index.State.INITIALIZING)
    late_tasks = [sized_task(late, 0.01) for _ in range(2)]

    # The big namespace is at its 11th task: the late one's first two go in the next
    # rounds, not after the big namespace's remaining 30.
    assert beat(node_api, node) == [
        big_tasks[10].id,
        late_tasks[0].id,
        big_tasks[11].id,
        late_tasks[1].id,
    ]


def test_a_namespaces_largest_repositories_queued_together_are_built_first(node_api, node, index):
    small, large, middle = (
        make_repository(index, repository_size=int(gib * GIB)) for gib in (0.1, 0.5, 0.3)
    )
    create_bulk_tasks(Repository.objects.filter(zoekt_index=index))
    task_of = {t.zoekt_repository_id: t.id for t in Task.objects.all()}

    assert beat(node_api, node, concurrency=1) == [task_of[large.id]]
    Task.objects.filter(state=Task.State.PROCESSING).update(state=Task.State.DONE)
    assert beat(node_api, node, concurrency=1) == [task_of[middle.id]]
    Task.objects.filter(state=Task.State.PROCESSING).update(state=Task.State.DONE)
    assert beat(node_api, node, concurrency=1) == [task_of[small.id]]


def test_a_namespaces_tasks_queued_later_wait_for_its_earlier_ones(node_api, node, index):
    first = sized_task(index, 0.1)
    later_larger = sized_task(index, 0.5)

    assert beat(node_api, node, concurrency=1) == [first.id]
    finish(first)
    assert beat(node_api, node, concurrency=1) == [later_larger.id]


def test_gitlabs_mode_hands_out_the_oldest_tasks_first(node_api, node, now):
    set_app_setting(zoekt_indexing_admission="gitlab")
    big_tasks, _small = big_and_small(node, now)

    assert beat(node_api, node) == [t.id for t in big_tasks[:4]]


def test_gitlabs_mode_ignores_the_disk_headroom(node_api, node, index):
    set_app_setting(zoekt_indexing_admission="gitlab")
    tasks = [sized_task(index, 20) for _ in range(4)]

    assert beat(node_api, node, used_gib=70) == [t.id for t in tasks]


def test_a_project_with_tasks_in_two_indices_of_the_node_goes_once(node_api, node, index):
    project = ProjectFactory(repository_size=GIB // 100)
    other = IndexFactory(zoekt_node=node)
    first = make_index_task(index, project=project)
    make_index_task(other, project=project)

    assert beat(node_api, node) == [first.id]
