"""The admission policy as a pure function (zoekt.admission): its rules on any input."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from zoekt import admission
from zoekt.admission import Admit, Candidate, Hold, NodeRoom, PendingIndex, Priority

GIB = 1024**3


def room(slots: int = 4, used_gib: float = 10, total_gib: float = 100) -> NodeRoom:
    return NodeRoom(slots, int(total_gib * GIB), int(used_gib * GIB), 0.60, 0.75)


def task(task_id: int, *, priority=Priority.NEVER_INDEXED, namespace=1, gib=0.0, **kw):
    return Candidate(
        task_id=task_id,
        priority=priority,
        namespace_id=namespace,
        project_id=kw.pop("project", task_id),
        temporary_bytes=int(gib * GIB),
        **kw,
    )


def queued(task_id, *, namespace=1, gib=0.0, priority=Priority.NEVER_INDEXED, node=1):
    return admission.Queued(task_id, node, priority, namespace, int(gib * GIB))


def served(turns: dict[int, int], queued_before: dict[int, int] | None = None) -> list[int]:
    """Task ids in the order a hand-out serves one priority queue: by turn, then id."""
    every = {**(queued_before or {}), **turns}
    return sorted(every, key=lambda task_id: (every[task_id], task_id))


def test_round_robin_between_namespaces_within_a_priority():
    tasks = [queued(i, namespace=1) for i in range(1, 5)] + [queued(10, namespace=2)]

    assert served(admission.queue_turns(tasks, {}, {})) == [1, 10, 2, 3, 4]


def test_a_namespaces_largest_builds_go_first_and_its_turns_stay_fair():
    tasks = [
        queued(1, namespace=1, gib=1),
        queued(2, namespace=1, gib=8),
        queued(3, namespace=2, gib=2),
        queued(4, namespace=1, gib=1),
        queued(5, namespace=2, gib=5),
    ]

    # Namespace 1's 8 GiB and namespace 2's 5 GiB in the first round, then each
    # namespace's next largest; equal sizes go by task id.
    assert served(admission.queue_turns(tasks, {}, {})) == [2, 5, 1, 3, 4]


def test_a_namespace_with_tasks_queued_appends_and_a_new_one_joins_the_round_served():
    # The node's queue serves round 7; namespace 1 has turns 7 to 9 pending.
    pending = {101: 7, 102: 8, 103: 9}
    heads = {(1, Priority.NEVER_INDEXED): 7}
    lasts = {(1, Priority.NEVER_INDEXED, 1): 9}
    turns = admission.queue_turns(
        [queued(1, namespace=1), queued(2, namespace=2), queued(3, namespace=2)], heads, lasts
    )

    assert turns == {1: 10, 2: 7, 3: 8}
    assert served(turns, pending) == [2, 101, 3, 102, 103, 1]


def test_queues_are_per_node_and_priority():
    tasks = [
        queued(1, node=1),
        queued(2, node=2),
        queued(3, node=1, priority=Priority.UPDATE),
    ]
    heads = {(1, Priority.NEVER_INDEXED): 4, (1, Priority.UPDATE): 9}

    assert admission.queue_turns(tasks, heads, {}) == {1: 4, 2: 0, 3: 9}


def test_rank_takes_in_flight_then_priority_then_turn():
    tasks = [task(1, turn=2), task(2, turn=1), task(3, priority=Priority.MOVE, turn=5)]

    assert [c.task_id for c in admission.rank(tasks)] == [3, 2, 1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 10)), min_size=1, max_size=60))
def test_no_namespace_is_served_twice_before_every_namespace_once(sizes):
    tasks = [queued(i, namespace=ns, gib=gib) for i, (ns, gib) in enumerate(sizes, 1)]
    order = served(admission.queue_turns(tasks, {}, {}))
    namespace_of = {t.task_id: t.namespace_id for t in tasks}
    bytes_of = {t.task_id: t.index_bytes for t in tasks}
    seen: dict[int, int] = {}
    for task_id in order:
        namespace = namespace_of[task_id]
        seen[namespace] = seen.get(namespace, 0) + 1
        # The n-th task of a namespace goes once every namespace with n tasks had n - 1.
        for other, count in seen.items():
            total = sum(1 for t in tasks if t.namespace_id == other)
            assert count >= min(total, seen[namespace] - 1)
    # Within a namespace, largest first.
    for namespace in set(namespace_of.values()):
        sizes_served = [bytes_of[t] for t in order if namespace_of[t] == namespace]
        assert sizes_served == sorted(sizes_served, reverse=True)


def test_in_flight_first_then_priority():
    tasks = [
        task(1, priority=Priority.UPDATE),
        task(2, priority=Priority.DELETE),
        task(3, priority=Priority.UPDATE, in_flight=True),
        task(4, priority=Priority.MOVE),
    ]

    assert [c.task_id for c in admission.rank(tasks)] == [3, 2, 4, 1]


def test_every_decision_carries_its_reason():
    decided = admission.admit(
        [task(1, gib=6), task(2, gib=6), task(3, gib=1), task(4, priority=Priority.DELETE)],
        room(used_gib=60),
    )

    assert decided.reasons() == {
        4: Admit.DELETE,
        1: Admit.WITHIN_HEADROOM,
        2: Hold.DISK_HEADROOM,
        3: Hold.BEHIND_HELD_TASK,
    }


def test_the_build_ceiling_is_the_high_watermark_less_the_hysteresis_band():
    assert room().build_ceiling == 0.70
    # Never under the low watermark, however close the two are set.
    assert NodeRoom(4, GIB, 0, 0.60, 0.62).build_ceiling == 0.60


def test_builds_fill_the_room_to_the_ceiling_then_one_at_a_time_to_high():
    # 64 of 100 GiB: 6 GiB to the 70 % ceiling takes three 2 GiB builds; the fourth waits.
    decided = admission.admit([task(i, gib=2) for i in range(1, 5)], room(used_gib=64))
    assert decided.admitted == [1, 2, 3]
    assert decided.reasons()[4] == Hold.DISK_HEADROOM
    # At 69 % nothing fits under the ceiling: one build alone, up to the high watermark.
    decided = admission.admit([task(i, gib=2) for i in range(1, 5)], room(used_gib=69))
    assert decided.reasons() == {
        1: Admit.ONE_AT_A_TIME,
        2: Hold.DISK_HEADROOM,
        3: Hold.BEHIND_HELD_TASK,
        4: Hold.BEHIND_HELD_TASK,
    }


def test_at_critical_memory_only_never_indexed_work_waits():
    tasks = [
        task(1, priority=Priority.NEVER_INDEXED),
        task(2, priority=Priority.UPDATE),
        task(3, priority=Priority.MOVE),
    ]
    node = NodeRoom(4, 100 * GIB, 10 * GIB, 0.60, 0.75, memory_critical=True)

    assert admission.admit(tasks, node).reasons() == {
        3: Admit.WITHIN_HEADROOM,
        1: Hold.MEMORY_CRITICAL,
        2: Admit.WITHIN_HEADROOM,
    }


def test_a_node_without_a_reported_disk_is_paced_by_its_slots_alone():
    decided = admission.admit([task(i, gib=500) for i in range(6)], room(total_gib=0))

    assert decided.admitted == [0, 1, 2, 3]


candidates = st.lists(
    st.builds(
        Candidate,
        task_id=st.integers(1, 10**6),
        priority=st.sampled_from(list(Priority)),
        namespace_id=st.integers(1, 5),
        project_id=st.integers(1, 30),
        temporary_bytes=st.integers(0, 30 * GIB),
        in_flight=st.booleans(),
    ),
    max_size=40,
    unique_by=lambda c: c.task_id,
)
rooms = st.builds(
    NodeRoom,
    slots=st.integers(1, 12),
    total_bytes=st.just(100 * GIB),
    used_bytes=st.integers(0, 90 * GIB),
    low_watermark=st.just(0.60),
    high_watermark=st.just(0.75),
)


@settings(max_examples=300, deadline=None)
@given(candidates, rooms)
def test_the_rules_hold_on_any_input(tasks, node):
    decided = admission.admit(tasks, node)
    by_id = {c.task_id: c for c in tasks}
    admitted = [by_id[i] for i in decided.admitted]
    new = [c for c in admitted if not c.in_flight]
    in_flight = [c for c in tasks if c.in_flight]

    # Every task gets exactly one decision, and every in-flight task stays handed out.
    assert sorted(d.task_id for d in decided.decisions) == sorted(by_id)
    assert all(c.in_flight or c.task_id in decided.admitted for c in in_flight)
    # Slots are never over-filled by new work.
    assert len(new) <= max(0, node.slots - len(in_flight))
    # One task per project among the new ones, and none beside a project in flight.
    projects = [c.project_id for c in new]
    assert len(projects) == len(set(projects))
    assert not set(projects) & {c.project_id for c in in_flight}
    # New builds never take the node past the high watermark with their temporary bytes,
    # and past the build ceiling (high less the hysteresis band) only as the single build
    # on the node.
    builds = [c for c in new if c.priority != Priority.DELETE]
    flying = sum(c.temporary_bytes for c in in_flight)
    total = node.used_bytes + flying + sum(c.temporary_bytes for c in builds)
    if builds:
        assert total <= node.high_watermark * node.total_bytes
        busy = any(c.priority != Priority.DELETE for c in in_flight)
        if total > (node.high_watermark - 0.05) * node.total_bytes:
            assert len(builds) == 1 and not busy
    # Deterministic.
    assert admission.admit(tasks, node) == decided


def test_pending_indices_start_while_the_queue_is_short():
    pending = [PendingIndex(i, node_id=1, repositories=100) for i in range(1, 8)]

    # 2 slots: a queue of 120 repositories; 50 already queued leaves room for one index.
    assert admission.start_pending_indices(pending, {1: 50}, {1: 2}) == [1]
    # An empty queue always starts one, however big.
    big = [PendingIndex(1, node_id=1, repositories=10_000)]
    assert admission.start_pending_indices(big, {}, {1: 2}) == [1]


def test_a_moves_replacement_starts_first_and_offline_nodes_start_nothing():
    pending = [
        PendingIndex(1, node_id=1, repositories=200),
        PendingIndex(2, node_id=1, repositories=200, moving=True),
        PendingIndex(3, node_id=9, repositories=1),
    ]

    assert admission.start_pending_indices(pending, {}, {1: 2}) == [2]
