"""The memory dimension of the planner (docs/planner.md, "Memory"; pure, no Django).

On when any node has a memory budget. Every decision starts from GitLab's
disk decision and memory only overrides it where memory binds: a project
that fits the last index on disk but not in memory rolls over (its node
excluded *before* the new node is chosen), a new index avoids nodes without
the memory, and when memory cannot be satisfied the project keeps the disk
decision and the namespace gets a warning, never an error.

The replica simulation is the core's one loop (``planner.core``);
``MemoryFit`` is what it asks when a project does not join the last index,
with memory counted, and ``MemoryDimension`` holds the run's memory records
and the choices that read them (the planning run, ``_Run``, inherits it).

Memory is tracked in repository bytes: the last index's memory test
``estimate(Σr + r) <= limit`` is ``Σr + r <= floor(limit / ratio)``, one
integer per index. With an integral buffer factor ``num`` a scaled size is
``r × num``, so that limit is folded into the disk test as
``min(max_storage, limit × num)``: the hot path (a project joining the last
index) costs what GitLab's does. With a fractional factor the repository
bytes are summed alongside.
"""

from __future__ import annotations

from typing import Any

from planner.packing import INF, NEG, DiskFit, FitBoth, RoomiestBoth
from planner.plan import (
    MEMORY_BUDGET_INSUFFICIENT,
    MEMORY_INDEX_LIMIT_REACHED,
    MEMORY_NODE_EXHAUSTED,
    MEMORY_OVERFLOW,
    NamespacePlan,
    NodeChange,
    NodeMemory,
    PlanIssue,
    PlannedIndex,
    bounds_entry,
)
from planner.scenario import DISK, MEMORY, Scenario, _factor_ratio

__all__ = ["MemoryDimension", "MemoryFit"]

#: Why a new index opened (``Decision.cause``, memory dimension only).
CAUSE_FIRST = "first"
CAUSE_DISK = "disk"
CAUSE_MEMORY_CEILING = "memory_ceiling"
CAUSE_MEMORY_BUDGET = "memory_budget"
CAUSE_DISK_CEILING = "disk_ceiling"

#: What a project that fits the last index on disk but not in memory does.
_OPEN = 0
_JOIN = 1


class Projects:
    """One namespace's projects with statistics, as parallel lists (memory dimension).

    With an integral buffer factor ``num`` every scaled size is exactly
    ``repository_size × num``, so repository sizes are not stored
    (``rsizes`` is ``None``) and are recovered as ``size // num``.
    """

    __slots__ = ("num", "pids", "pnids", "rsizes", "sizes")

    def __init__(
        self,
        pnids: list[int],
        pids: list[int],
        sizes: list[int],
        rsizes: list[int] | None,
        num: int,
    ) -> None:
        self.pnids = pnids
        self.pids = pids
        self.sizes = sizes
        self.rsizes = rsizes
        self.num = num

    def r(self, k: int) -> int:
        """Project ``k``'s repository size."""
        if self.rsizes is None:
            return self.sizes[k] // self.num
        return self.rsizes[k]

    def suffix(self, k: int) -> int:
        """The repository bytes of projects ``k`` and after (a C-level sum: rare)."""
        if self.rsizes is None:
            return sum(self.sizes[k:]) // self.num
        return sum(self.rsizes[k:])


class MemoryFit(DiskFit):
    """``DiskFit`` with memory counted (the memory dimension on).

    ``aware``: memory steers the choices (a new index goes to the first, or
    roomiest, node with room in both dimensions; a project past the last
    index's memory limit rolls over). Not aware: exactly the disk-only
    decisions, with the memory figures kept. Either way an index carries its
    estimated memory and its node's ``max_memory_bytes``, and its node's
    unclaimed memory falls by the estimate.
    """

    __slots__ = ("aware", "md", "mn", "nonlinear", "notes", "num")

    zero = 0
    memory = True

    def __init__(self, run: Any, aware: bool) -> None:
        super().__init__(run)
        self.aware = aware
        self.shown = [None if ceiling == INF else ceiling for ceiling in run.ceilings]
        self.num = run.factor[0]
        self.mn, self.md = run.memory_ratio
        #: A fractional buffer factor: repository bytes are summed beside the
        #: scaled ones (the project columns carry them).
        self.nonlinear = run.factor[1] != 1
        #: The replica's memory warnings: type → [details, count].
        self.notes: dict[str, list] | None = None

    def _r(self, data: tuple, k: int) -> int:
        """Project ``k``'s repository size."""
        return data[3][k] if self.nonlinear else data[2][k] // self.num

    def _estimate(self, r: int | float) -> int | float:
        return -(-r * self.mn // self.md)

    def choose(
        self, ns_plan: Any, replica_idx: int, index_idx: int, data: tuple, k: int
    ) -> tuple[int | None, str | None]:
        """The first node with room in both dimensions: GitLab's own first fit
        whenever that node has the memory too. When none has both: the
        disk-only choice with a warning."""
        if not self.aware:
            return super().choose(ns_plan, replica_idx, index_idx, data, k)
        run = self.run
        r = data[3][k] if self.nonlinear else data[2][k] // self.num  # ``_r``, written out
        if run.exhausted.pending:
            run.exhausted.flush()
        position = run.pick_both(r)
        if position is not None:
            return position, None
        if self.notes is None:
            self.notes = {}
        position, warning = run._memory_choice(
            ns_plan, replica_idx, index_idx, data[1][k], data[0][k], data[2][k], r, self.notes
        )
        if position is None:
            self.refuse(k)
        return position, warning

    def demand(self, data: tuple, k: int) -> dict[str, int]:
        # The decisions of an unaware pass are disk-only: they ask for disk.
        if self.aware:
            return {DISK: data[2][k], MEMORY: self._estimate(self._r(data, k))}
        return {DISK: data[2][k]}

    def cause(self, bound: str | None, last: Any, need: int, last_open: int) -> str | None:
        if bound is not None:
            return bound
        if last is None:
            return CAUSE_FIRST
        if need <= last_open:
            # The node has the room; the index's disk ceiling does not.
            return CAUSE_DISK_CEILING
        return CAUSE_DISK

    def close(
        self,
        index: Any,
        position: int,
        opened: int,
        required: int,
        to: int | None,
        r: int,
        mem_open: int | float,
    ) -> None:
        # ``_estimate``, written out: once per index.
        estimate = -(-(r if self.nonlinear else required // self.num) * self.mn // self.md)
        index.required_storage_bytes = required
        index.estimated_memory_bytes = estimate
        index.project_namespace_id_to = to
        self.run._write_both(position, opened - required, mem_open - estimate)

    def limits(self, position: int, max_bytes: int) -> tuple[int | float, int | float, int | float]:
        mem_open = self.run.mem[position]
        if not self.aware:
            return max_bytes, INF, mem_open
        ceiling = self.run.ceilings[position]
        room = ceiling if ceiling < mem_open else mem_open
        if room == INF:
            return max_bytes, INF, mem_open
        r_limit = room * self.md // self.mn if room >= 0 else -1
        if r_limit * self.num < max_bytes and not self.nonlinear:
            return r_limit * self.num, r_limit, mem_open
        return max_bytes, r_limit, mem_open

    def bound(
        self,
        ns_plan: NamespacePlan,
        replica_idx: int,
        data: tuple,
        k: int,
        last: tuple[Any, int, int, int, int, int, int | float],
        last_max: int,
        n_indices: int,
    ) -> tuple[int, str | None, int | float, int | float]:
        """Project ``k`` fits the last index on disk but not in memory (aware only).

        ``last``: ``close``'s arguments for the last index as it stands (its
        node position, that node's unclaimed bytes when it opened, scaled bytes,
        range end, repository bytes (fractional factor), its node's unclaimed
        memory when it opened); it is closed here first. ``last_max``: its
        max_storage_bytes. Returns ``(position, cause, limit, r_limit)``: a
        rollover to ``position``, or (``position`` -1) the project stays with
        the index's new limits.
        """
        self.close(*last)
        _, last_pos, _, last_req, _, last_r, last_mopen = last
        nonlinear = self.nonlinear
        num = self.num
        pnids, pids, sizes, rsizes, _total, _ = data
        if self.notes is None:
            self.notes = {}
        outcome = self.run._memory_limit(
            Projects(pnids, pids, sizes, rsizes, num),
            k,
            last_pos,
            last_r if nonlinear else last_req // num,
            last_mopen,
            n_indices,
            self.notes,
        )
        if outcome[0] == _OPEN:
            return outcome[1], outcome[2], -1, INF
        r_limit = outcome[1]
        limit = last_max
        if not nonlinear and r_limit * num < last_max:
            limit = r_limit * num
        run = self.run
        if run.log is not None:
            run._record(
                MEMORY_OVERFLOW,
                ns_plan,
                replica_idx,
                n_indices - 1,
                pids[k],
                pnids[k],
                {DISK: sizes[k], MEMORY: self._estimate(self._r(data, k))},
                last_pos,
                None,
                outcome[2],
            )
        return -1, None, limit, r_limit

    def finish(self, ns_plan: NamespacePlan, replica_idx: int, data: tuple, stop: int) -> int:
        """Warns once per memory warning type; returns the largest repository
        size placed in the replica (-1: every project was placed)."""
        notes, skipped = self.notes, self.skipped
        self.search_fail = INF
        self.skipped = self.notes = None
        if notes:
            self.run._warn(ns_plan, replica_idx, ns_plan.replicas[-1].indices, notes)
        sizes, rsizes = data[2], data[3]
        # (``sizes`` may hold the first project's alone: only when the replica
        # stopped at it, every project placed.)
        if skipped is None and stop == len(data[0]):
            return -1
        refused = set(skipped or ())
        values = rsizes if self.nonlinear else sizes
        largest = max((values[k] for k in range(stop) if k not in refused), default=0)
        return largest if self.nonlinear else largest // self.num


class MemoryDimension:
    """The planning run's memory records and the choices that read them.

    A mixin of ``planner.core._Run``: it reads the run's disk records
    (``disk``, ``exhausted``, ``pick``, ``node_ids``, ``cap``, ``log``) and
    adds the memory ones.
    """

    def _init_memory(self: Any, scenario: Scenario, memory_aware: bool) -> None:
        options = scenario.options.memory
        self.aware = memory_aware
        self.budgets = [scenario.memory_budget(node) for node in scenario.nodes]
        #: Live unclaimed memory per candidate position: budget minus the
        #: estimated memory of the indices the node already holds (the
        #: ``reserved_memory_bytes`` extension) minus what this run places.
        #: Infinite for a node without a budget (no limit).
        self.mem: list[int | float] = [
            INF if budget is None else budget - (node.reserved_memory_bytes or 0)
            for node, budget in zip(scenario.nodes, self.budgets, strict=True)
        ]
        self.mem_before = list(self.mem)
        #: max_memory_bytes of an index on each node (infinite: no budget).
        self.ceilings: list[int | float] = [
            INF if budget is None else options.ceiling(budget) for budget in self.budgets
        ]
        self.memory_ratio = _factor_ratio(options.memory_ratio)
        self.fit_both = FitBoth(self.disk, self.mem, self.factor, self.memory_ratio)
        self.all_trees.append(self.fit_both)
        self.roomiest_both: RoomiestBoth | None = None
        if self.balanced:
            budgets = [INF if budget is None else budget for budget in self.budgets]
            self.roomiest_both = RoomiestBoth(self.fit_both, self.capacity, budgets)
            if self.log is not None and self.log.capacity is not None:
                self.log.capacity[MEMORY] = budgets
            self.trees.append(self.roomiest_both)
            self.all_trees.append(self.roomiest_both)
            self.pick_both = self.roomiest_both.best
        else:
            self.trees.append(self.fit_both)
            self.pick_both = self.fit_both.find
        #: The largest repository size placed in the run (for the bounds;
        #: scaled size and estimate are both monotone in it).
        self.largest_repository = 0
        self.mem_history: list[tuple[list[int], list[int | float]]] = []
        if self.log is not None:
            self.mem_history = [([-1], [value]) for value in self.mem]
            self.log.history[MEMORY] = self.mem_history
        #: The replica simulation's fits: (disk-only decisions, memory-aware).
        self.fits = (MemoryFit(self, False), MemoryFit(self, True))

    def _write_both(self: Any, position: int, disk_value: int, mem_value: int | float) -> None:
        """Set a node's unclaimed bytes and memory (an index closes or rolls over).

        Logs each change for explain, and first remembers the old values if a
        memory-aware namespace attempt may be rolled back.
        """
        undo = self.undo
        if undo is not None and position not in undo:
            self._touch(position)
        log = self.log
        if self.disk[position] != disk_value:
            self.disk[position] = disk_value
            if log is not None:
                sequences, values = self.disk_history[position]
                sequences.append(len(self.decisions))
                values.append(disk_value)
        if self.mem[position] != mem_value:
            self.mem[position] = mem_value
            if log is not None:
                sequences, values = self.mem_history[position]
                sequences.append(len(self.decisions))
                values.append(mem_value)

    def _note_largest(self: Any, largest: int, data: tuple) -> None:
        """Keep the run's largest placed repository size (``largest`` -1: every
        project of the namespace was placed)."""
        rsizes, total = data[3], data[4]
        if largest < 0:
            # Every project was placed. Its largest matters only if it can beat
            # the run's: not when the whole namespace is smaller.
            num = self.factor[0]
            if rsizes is None:
                if total // num > self.largest_repository:
                    largest = max(data[5])
            else:
                largest = max(rsizes, default=0)
        if largest > self.largest_repository:
            self.largest_repository = largest

    def _estimate(self: Any, repository_bytes: int | float) -> int | float:
        """The estimate for ``repository_bytes`` of projects: × memory_ratio, rounded up."""
        num, den = self.memory_ratio
        return -(-repository_bytes * num // den)

    def _r_limit(self: Any, memory_bytes: int | float) -> int | float:
        """The most repository bytes whose estimate fits in ``memory_bytes`` (−1: none)."""
        if memory_bytes == INF:
            return INF
        num, den = self.memory_ratio
        return memory_bytes * den // num if memory_bytes >= 0 else -1

    def _memory_choice(
        self: Any,
        ns_plan: NamespacePlan,
        replica_idx: int,
        index_idx: int,
        pid: int,
        pnid: int,
        size: int,
        r: int,
        notes: dict[str, list],
    ) -> tuple[int | None, str | None]:
        """A new index's node when no usable node has room in both dimensions.

        The disk-only choice (skipping the nodes the memory-driven split
        excluded) with a ``memory_budget_insufficient`` warning, returned as
        the second item; ``(None, None)`` when there is no node at all (a
        ``node_unavailable`` error has been recorded).
        """
        mm = self._estimate(r)
        chosen = self._disk_only_choice(size)
        if chosen is None:
            self._unavailable(ns_plan, replica_idx, index_idx, pid, pnid, size, memory=mm)
            return None, None
        _note(
            notes,
            MEMORY_BUDGET_INSUFFICIENT,
            f"Node {self.node_ids[chosen]} has the unclaimed storage for project {pid} "
            f"(size {size}) but not its estimated memory ({mm} bytes requested, "
            f"{_show(self.mem[chosen])} available), and no usable node has both; the project "
            f"opened index {index_idx} there by the disk-only rule",
        )
        return chosen, MEMORY_BUDGET_INSUFFICIENT

    def _memory_limit(
        self: Any,
        data: Projects,
        k: int,
        last_pos: int,
        last_r: int,
        last_mopen: int | float,
        n_indices: int,
        notes: dict[str, list],
    ) -> tuple:
        """Project ``k`` fits the last index on disk but not in memory: roll over, or stay.

        Returns ``(_OPEN, position, cause)`` for a rollover to ``position``,
        or ``(_JOIN, limit, warning_type)``: the project stays in the last
        index, whose memory limit becomes ``limit`` repository bytes
        (infinite: no more memory checks for this index, the disk-only
        decision from here on).

        The last index's node (and the replica's first node) are excluded
        from the replica's memory-driven choices *before* any candidate is
        chosen (seed 1c), so a rollover never lands where the limit was hit.
        """
        # How many more indices the cap allows without GitLab's cap error
        # (10.4: a replica at the cap fails on its next project).
        cap_left = self.cap - n_indices - (1 if k < len(data.sizes) - 1 else 0)
        here = f"index {n_indices - 1} on node {self.node_ids[last_pos]}"
        if self._estimate(last_r + data.r(k)) > last_mopen:
            # The node's own unclaimed memory is short (not only the ceiling).
            return self._budget_short(data, k, last_pos, last_r, last_mopen, cap_left, here, notes)
        return self._ceiling_binds(data, k, last_pos, last_r, last_mopen, cap_left, here, notes)

    def _budget_short(
        self: Any,
        data: Projects,
        k: int,
        last_pos: int,
        last_r: int,
        last_mopen: int | float,
        cap_left: int,
        here: str,
        notes: dict[str, list],
    ) -> tuple:
        """``_memory_limit`` when the last index's node lacks the memory: a
        rollover to a node with room in both dimensions, else the project stays
        and the rest of the replica is decided by disk alone."""
        r = data.r(k)
        if cap_left > 0:
            self.exhausted.flush()
            position = self.pick_both(r)
            if position is not None:
                return (_OPEN, position, CAUSE_MEMORY_BUDGET)
            if self._disk_only_choice(data.sizes[k]) is not None:
                wtype = MEMORY_BUDGET_INSUFFICIENT
                why = "the nodes with unclaimed storage for a new index lack the memory"
            else:
                wtype = MEMORY_NODE_EXHAUSTED
                why = (
                    "the nodes ran out: no other node can take a new index of this replica "
                    "(exhausted for the namespace or without the unclaimed storage)"
                )
        else:
            wtype = MEMORY_INDEX_LIMIT_REACHED
            why = f"a new index would reach max_indices_per_replica ({self.cap})"
        _note(
            notes,
            wtype,
            f"Node {self.node_ids[last_pos]} has {_show(last_mopen - self._estimate(last_r))} "
            f"bytes of unclaimed memory left, less than project {data.pids[k]} needs "
            f"({self._estimate(r)} bytes estimated), and {why}; the project and the rest of "
            f"the replica stay in {here} past the node's memory budget (disk-only decision)",
        )
        return (_JOIN, INF, wtype)

    def _ceiling_binds(
        self: Any,
        data: Projects,
        k: int,
        last_pos: int,
        last_r: int,
        last_mopen: int | float,
        cap_left: int,
        here: str,
        notes: dict[str, list],
    ) -> tuple:
        """``_memory_limit`` when the last index's memory ceiling binds: a
        rollover when the nodes that could take new indices hold the rest of the
        replica under the ceiling, else the last indices are balanced past it,
        or the rest stays in the last index."""
        first, usable = self._usable_nodes(data.sizes[k], self._estimate(data.r(k)))
        allowed = cap_left if cap_left > 0 else 0
        more = usable if usable < allowed else allowed
        left = self._estimate(data.suffix(k))
        ceiling = self.ceilings[last_pos]
        if more > 0 and left <= more * ceiling:
            return (_OPEN, first, CAUSE_MEMORY_CEILING)
        # The limit cannot be kept for the rest of the replica.
        wtype, why = self._ceiling_shortfall(data.sizes[k], usable, allowed, more)
        head = (
            f"{here} reached its max_memory_bytes ({ceiling}) at project {data.pids[k]}; the "
            f"rest of the replica needs {left} bytes of estimated memory and {why}"
        )
        if more == 0:
            _note(
                notes,
                wtype,
                f"{head}, so the rest stays in {here} past its max_memory_bytes "
                "(disk-only decision)",
            )
            return (_JOIN, INF, wtype)
        share = -(-(self._estimate(last_r) + left) // (more + 1))
        limit = self._r_limit(share if share < last_mopen else last_mopen)
        if last_r + data.r(k) <= limit:
            _note(
                notes,
                wtype,
                f"{head}, so the last {more + 1} indices are balanced at about {share} bytes "
                "each instead, past max_memory_bytes",
            )
            return (_JOIN, limit, wtype)
        return (_OPEN, first, CAUSE_MEMORY_CEILING)

    def _usable_nodes(self: Any, size: int, mm: int | float) -> tuple[int, int]:
        """The node a ceiling rollover goes to (the first usable one, first fit;
        or the roomiest, balanced, the earlier on a tie; -1: none), and how many
        nodes could take a new index of ``size`` scaled and ``mm`` estimated bytes."""
        disk = self.disk
        mem = self.mem
        positions = self.exhausted.positions
        first = -1
        usable = 0
        score = None if self.roomiest_both is None else self.roomiest_both.score
        best: float = NEG
        for p in range(len(disk)):
            if disk[p] >= size and mem[p] >= mm and p not in positions:
                usable += 1
                if first < 0:
                    first = p
                    if score is not None:
                        best = score(p)
                elif score is not None and score(p) > best:
                    first, best = p, score(p)
        return first, usable

    def _ceiling_shortfall(
        self: Any, size: int, usable: int, allowed: int, more: int
    ) -> tuple[str, str]:
        """The warning type, and why, when a ceiling rollover cannot hold the rest."""
        if allowed < usable:
            why = f"max_indices_per_replica ({self.cap}) allows only {more} more index(es)"
            return MEMORY_INDEX_LIMIT_REACHED, why
        if usable == 0 and self._disk_only_choice(size) is not None:
            why = "the nodes with unclaimed storage for a new index lack the memory"
            return MEMORY_BUDGET_INSUFFICIENT, why
        why = (
            "the nodes ran out: "
            + (
                f"only {usable} other node(s) can take a new index of this replica"
                if usable
                else "no other node can take a new index of this replica"
            )
            + " (the others are exhausted for the namespace or without the room)"
        )
        return MEMORY_NODE_EXHAUSTED, why

    def _disk_only_choice(self: Any, size: int) -> int | None:
        """The first (balanced: the roomiest) candidate with the disk room that the
        namespace may still use."""
        self.exhausted.flush()
        return self.pick(size)

    def _warn(
        self: Any,
        ns_plan: NamespacePlan,
        replica_idx: int,
        indices: list[PlannedIndex],
        notes: dict[str, list],
    ) -> None:
        """One warning per memory warning type and replica, in order of first occurrence."""
        over = [
            f"index {i} on node {index.node_id} ({index.estimated_memory_bytes} bytes "
            f"estimated, max_memory_bytes {index.max_memory_bytes})"
            for i, index in enumerate(indices)
            if index.max_memory_bytes is not None
            and (index.estimated_memory_bytes or 0) > index.max_memory_bytes
        ]
        for wtype, (details, count) in notes.items():
            text = details
            if count > 1:
                text += f" ({count} such decisions in this replica)"
            if over and wtype != MEMORY_BUDGET_INSUFFICIENT:
                text += ". Over max_memory_bytes: " + ", ".join(over)
            ns_plan.warnings.append(PlanIssue(ns_plan.namespace_id, replica_idx, wtype, text))

    def _memory_result(self: Any, nodes: list[NodeChange]) -> dict[str, dict[str, Any]]:
        """Each node entry's memory figures; returns the plan's ``bounds``."""
        by_id = {node.id: node for node in nodes}
        for pos, node_id in enumerate(self.node_ids):
            if node_id in by_id:
                by_id[node_id].memory = NodeMemory(
                    self.budgets[pos], _finite(self.mem_before[pos]), _finite(self.mem[pos])
                )
        num, den = self.factor
        largest = self.largest_repository
        return {
            DISK: _bounds(self.before, self.disk, -(-largest * num // den)),
            MEMORY: _bounds(self.mem_before, self.mem, self._estimate(largest)),
        }


def _finite(value: int | float) -> int | None:
    return None if value == INF else int(value)


def _show(value: int | float) -> str:
    return "unlimited" if value == INF else str(value)


def _note(notes: dict[str, list], wtype: str, details: str) -> None:
    """Count a memory warning of the replica; the first occurrence's details are kept."""
    if wtype in notes:
        notes[wtype][1] += 1
    else:
        notes[wtype] = [details, 1]


def _bounds(
    before: list[int] | list[int | float],
    after: list[int] | list[int | float],
    largest: int,
) -> dict[str, float | None]:
    """How far the plan's busiest node is from the best achievable, in one dimension.

    The capacity of a node is what it had unclaimed at the start of the run
    (infinite for a node without a memory budget); what the run claimed is
    before − after. ``lower_bound`` = max(total claimed / total positive
    capacity, largest placed project / largest capacity): no placement of
    the same projects can keep every node below it. ``max_utilization`` =
    max over nodes of claimed / capacity. ``ratio`` = max_utilization /
    lower_bound; with a zero bound it is 1 when nothing was claimed and
    ``None`` (unbounded) otherwise; ``None`` too when a node took bytes it
    did not have room for (capacity ≤ 0, infinite utilisation). Rounded to
    six decimals after the ratio is computed.
    """
    demand = 0
    total = 0
    biggest = 0
    unlimited = False
    utilization: float | None = 0.0
    for have, left in zip(before, after, strict=True):
        if have == INF:
            unlimited = True
            continue
        claimed = have - left
        demand += claimed
        if have > 0:
            total += have
            if have > biggest:
                biggest = have
            if utilization is not None and claimed / have > utilization:
                utilization = claimed / have
        elif claimed > 0:
            utilization = None
    lower: float | None
    if unlimited or demand == 0:
        lower = 0.0
    elif total == 0:
        lower = None
    else:
        lower = max(demand / total, largest / biggest)
    return bounds_entry(lower, utilization)
