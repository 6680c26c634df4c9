"""Admission control for indexing work, as plain functions over plain data (docs/scheduling.md).

A node runs a fixed number of tasks at once (its *slots*: the concurrency limit of
reference 1.1) and every index build needs room on its disk for the new shards
before the old ones go (its *temporary bytes*: the repository's index bytes times
``zoekt_indexing_temporary_space_factor``). GitLab hands a node its oldest tasks,
whatever they are and however full its disk is, and starts one pending index per node
a minute. Here each hand-out fills the node's free slots from its pending work:

* in **priority** order: deletes (they free space), then the replacement of a live
  move or drain, then the re-indexing of data a node lost, then never-indexed
  repositories, then forced re-indexing and updates of what already serves;
* **fair** between namespaces within a priority: round robin, the first task of every
  namespace before the second of any, and a namespace's largest builds first. A task's
  place is given when it is queued (``queue_turns``: start-time fair queuing, the turn a
  task is served in) and kept on its row, so a hand-out reads the head of the node's
  queue from an index and never ranks the whole backlog;
* within the node's **disk headroom**: its reported used bytes plus the temporary bytes
  of the builds it is running plus the new build's stay at or under the *build ceiling*,
  the high watermark less the eviction hysteresis band (70 % at GitLab's 75 %), so that
  temporary data never starts the node's eviction sustain clock. A node past the ceiling
  still makes progress one build at a time, and never past the high watermark: with
  nothing in flight, one build is admitted when its temporary bytes keep the node at or
  under the high watermark. A build that could not fit even then is held
  (``exceeds_high_watermark``) and does not block the ones behind it; any other build
  that does not fit stops the hand-out there (``disk_headroom``): nothing smaller
  overtakes it, so a large build is not starved by a stream of small ones.

On a node whose webserver is at or past its critical memory watermark (memory-aware
planning on), never-indexed repositories are held (``memory_critical``): their shards
would add to what the webserver must load; rebuilds, lost data and moves go on.

Every decision carries its reason as data. ``start_pending_indices`` is the other half:
how many pending indices each node starts per scheduling pass, by its queue.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence

from zoekt import capacity

#: The hand-out modes (the setting ``zoekt_indexing_admission``).
MODE_ADMISSION = "admission"
MODE_GITLAB = "gitlab"
MODES = (MODE_ADMISSION, MODE_GITLAB)

#: Default temporary space of a build, as a share of the index's bytes: a build writes its
#: new shards next to the old ones (the 2026-10-20 incident: about 740 GiB for 495 namespaces).
DEFAULT_TEMPORARY_SPACE_FACTOR = 1.0

#: Repositories not yet built that a node may have queued per slot before the scheduling
#: pass starts another of its pending indices: about a minute of work per slot at a second a
#: repository, so a node never idles between two passes a minute apart.
QUEUE_PER_SLOT = 60

DELETE_REPO = 50


class Priority(enum.IntEnum):
    """The order in which a node's pending work is admitted (lowest first)."""

    DELETE = 0
    MOVE = 1
    LOST_DATA = 2
    NEVER_INDEXED = 3
    UPDATE = 4


class Hold(enum.StrEnum):
    """Why a task was not admitted in this hand-out."""

    NO_FREE_SLOT = "no_free_slot"
    DISK_HEADROOM = "disk_headroom"
    EXCEEDS_HIGH_WATERMARK = "exceeds_high_watermark"
    BEHIND_HELD_TASK = "behind_held_task"
    SAME_PROJECT = "same_project"
    MEMORY_CRITICAL = "memory_critical"


class Admit(enum.StrEnum):
    """Why a task was admitted."""

    IN_FLIGHT = "in_flight"
    DELETE = "delete"
    WITHIN_HEADROOM = "within_headroom"
    ONE_AT_A_TIME = "one_at_a_time"


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One task of the node, as the hand-out sees it."""

    task_id: int
    priority: Priority
    namespace_id: int
    project_id: int
    temporary_bytes: int
    #: Already handed out and not yet called back: it holds a slot and its temporary bytes.
    in_flight: bool = False
    #: Its round in the node's queue within its priority (``queue_turns``).
    turn: int = 0


def build_ceiling(low_watermark: float, high_watermark: float) -> float:
    """The share of the disk that builds in flight may fill (see the module)."""
    return max(low_watermark, capacity.hysteresis_floor(high_watermark))


@dataclasses.dataclass(frozen=True, slots=True)
class NodeRoom:
    """What the node has for indexing work now."""

    slots: int
    total_bytes: int
    used_bytes: int
    low_watermark: float
    high_watermark: float
    #: The node's webserver RSS is at or past the critical memory watermark of its budget
    #: (only while memory-aware planning is on): its never-indexed repositories wait.
    memory_critical: bool = False

    @property
    def build_ceiling(self) -> float:
        return build_ceiling(self.low_watermark, self.high_watermark)

    def headroom_bytes(self, in_flight_bytes: int) -> int:
        """What is left for new builds' temporary bytes (negative past the ceiling)."""
        return int(self.build_ceiling * self.total_bytes - self.used_bytes - in_flight_bytes)


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    task_id: int
    admitted: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class Admission:
    """The hand-out's decisions, in the order they were taken."""

    decisions: tuple[Decision, ...]
    temporary_bytes_in_flight: int

    @property
    def admitted(self) -> list[int]:
        return [d.task_id for d in self.decisions if d.admitted]

    def reasons(self) -> dict[int, str]:
        return {d.task_id: d.reason for d in self.decisions}


def rank(candidates: Iterable[Candidate]) -> list[Candidate]:
    """In flight first, then by priority, then by turn (``queue_turns``), then in queue
    order (``perform_at``, id: the order of the input)."""
    candidates = list(candidates)
    order = sorted(
        range(len(candidates)),
        key=lambda p: (not candidates[p].in_flight, candidates[p].priority, candidates[p].turn, p),
    )
    return [candidates[p] for p in order]


@dataclasses.dataclass(frozen=True, slots=True)
class Queued:
    """A task being queued: what its place in its node's queue depends on."""

    task_id: int
    node_id: int
    priority: Priority
    namespace_id: int
    index_bytes: int


#: A node's queue within one priority.
QueueKey = tuple[int, Priority]


def queue_turns(
    queued: Sequence[Queued],
    heads: dict[QueueKey, int],
    lasts: dict[tuple[int, Priority, int], int],
) -> dict[int, int]:
    """The turn of each task being queued: round robin between namespaces, by start-time
    fair queuing.

    ``heads`` holds the lowest turn pending in each node's priority queue (its virtual
    time: the round being served) and ``lasts`` the highest turn pending of each
    namespace in it. A namespace with tasks pending queues its new ones after its last;
    one with none joins the round being served, so it waits for no namespace's backlog.
    The tasks of a namespace queued together go largest first (the longest-processing-
    time rule: the longest builds start first, so a namespace's last build does not start
    late), the task id between equals. A hand-out serves turn by turn, so the n-th task
    of every namespace goes before the (n+1)-th of any.
    """
    groups: dict[tuple[int, Priority, int], list[Queued]] = {}
    for task in queued:
        groups.setdefault((task.node_id, task.priority, task.namespace_id), []).append(task)
    turns: dict[int, int] = {}
    for (node_id, priority, namespace_id), tasks in groups.items():
        last = lasts.get((node_id, priority, namespace_id))
        start = last + 1 if last is not None else heads.get((node_id, priority), 0)
        tasks.sort(key=lambda t: (-t.index_bytes, t.task_id))
        for offset, task in enumerate(tasks):
            turns[task.task_id] = start + offset
    return turns


def admit(candidates: Sequence[Candidate], room: NodeRoom) -> Admission:
    """Which of the node's tasks to hand out now, each decision with its reason.

    ``candidates`` are ranked here (``rank``, by their turns); at most one task per project
    is handed out at once, as GitLab's hand-out does. A node that reports no disk size is paced
    by its slots alone.
    """
    ranked = rank(candidates)
    decisions: list[Decision] = []
    free = room.slots
    in_flight_bytes = 0
    building = False
    projects: set[int] = set()
    for candidate in ranked:
        if candidate.in_flight:
            # Re-offered on every heartbeat until its callback (the node de-duplicates).
            decisions.append(Decision(candidate.task_id, True, Admit.IN_FLIGHT))
            projects.add(candidate.project_id)
            free -= 1
            in_flight_bytes += candidate.temporary_bytes
            building = building or candidate.priority != Priority.DELETE
    measured = room.total_bytes > 0
    room_left = room.headroom_bytes(in_flight_bytes)
    high_room = room.high_watermark * room.total_bytes - room.used_bytes - in_flight_bytes
    blocked = False
    for candidate in ranked:
        if candidate.in_flight:
            continue
        task_id = candidate.task_id
        if free <= 0:
            decisions.append(Decision(task_id, False, Hold.NO_FREE_SLOT))
            continue
        if candidate.project_id in projects:
            decisions.append(Decision(task_id, False, Hold.SAME_PROJECT))
            continue
        if candidate.priority == Priority.DELETE:
            reason: str = Admit.DELETE
        elif candidate.priority == Priority.NEVER_INDEXED and room.memory_critical:
            # New shards would add to a webserver already at its critical memory: the
            # memory-pressure moves make room first; rebuilds of what it serves go on.
            decisions.append(Decision(task_id, False, Hold.MEMORY_CRITICAL))
            continue
        elif blocked:
            decisions.append(Decision(task_id, False, Hold.BEHIND_HELD_TASK))
            continue
        elif not measured or candidate.temporary_bytes <= room_left:
            reason = Admit.WITHIN_HEADROOM
        elif not building and candidate.temporary_bytes <= high_room:
            reason = Admit.ONE_AT_A_TIME
        elif not building:
            # Even alone it would take the node past the high watermark: hold it and let
            # the rest through (eviction or a move has to make room for it).
            decisions.append(Decision(task_id, False, Hold.EXCEEDS_HIGH_WATERMARK))
            continue
        else:
            decisions.append(Decision(task_id, False, Hold.DISK_HEADROOM))
            blocked = True
            continue
        decisions.append(Decision(task_id, True, reason))
        projects.add(candidate.project_id)
        free -= 1
        if candidate.priority != Priority.DELETE:
            building = True
            room_left -= candidate.temporary_bytes
            high_room -= candidate.temporary_bytes
            in_flight_bytes += candidate.temporary_bytes
    return Admission(tuple(decisions), in_flight_bytes)


def temporary_bytes(index_bytes: int, factor: float) -> int:
    """The disk a build of ``index_bytes`` takes beside what the node holds, while it runs."""
    return max(0, int(index_bytes * factor))


@dataclasses.dataclass(frozen=True, slots=True)
class PendingIndex:
    index_id: int
    node_id: int
    #: The repositories it is expected to create (its namespace's projects).
    repositories: int
    #: The replacement of a live move: it goes first.
    moving: bool = False


def start_pending_indices(
    pending: Iterable[PendingIndex], queued: dict[int, int], slots: dict[int, int]
) -> list[int]:
    """The pending indices to start now: on each node, a move's replacement first, then the
    oldest, while the node's queue of repositories not yet built stays under
    ``QUEUE_PER_SLOT`` × its slots. A node with an empty queue always starts one.
    Nodes without an entry in ``slots`` (offline) start nothing.
    """
    started: list[int] = []
    depth = dict(queued)
    for index in sorted(pending, key=lambda i: (i.node_id, not i.moving, i.index_id)):
        if index.node_id not in slots:
            continue
        have = depth.get(index.node_id, 0)
        if have and have >= QUEUE_PER_SLOT * slots[index.node_id]:
            continue
        started.append(index.index_id)
        depth[index.node_id] = have + max(1, index.repositories)
    return started
