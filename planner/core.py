"""The placement planner: a scenario in, a plan out (pure; no Django, clock or randomness).

In the disk dimension this produces exactly the plan GitLab's
``Search::Zoekt::PlanningService`` produces for the same input (reference
5.3), including the behaviours ``docs/planner.md`` lists as kept on purpose.
In short, for each namespace in input order:

* ``destroy`` / ``unchanged`` when it has at least as many replicas as
  desired (no simulation);
* otherwise, for each missing replica, walk the projects with statistics in
  ascending project-namespace id; before each one check the index cap, then
  find the *first* candidate (in the stale input order) that is not
  exhausted for the namespace and has room for the scaled size; put the
  project into the replica's last index if it fits there, else open a new
  index on that first-fit node.

Node records are shared by every namespace of the run: capacity one plan
consumes (failed plans included) is gone for the next.

How it stays fast (a million projects over hundreds of nodes) without
changing a single choice:

* While a replica has one index, a project that fits that index needs no
  search at all: the index's node has exactly the room the index has left
  and is not exhausted, so GitLab's first-fit gate passes.
* Unclaimed bytes only ever fall during a run, so the first-fit search uses
  a max-tree over the candidate order whose entries may be *stale-high*
  (upper bounds). A search descends to the leftmost entry that could fit,
  checks the real value, and if it no longer fits refreshes that entry and
  looks again: nodes that could not fit the request before are never looked
  at one by one.
* Behind a second-or-later index (whose node is exhausted), the gate's
  answer depends only on the request size until the next index opens, so
  the largest size known to pass and the smallest known to fail are cached.

The memory dimension (docs/planner.md, "Memory") is on when any node has a
memory budget. Then every decision starts from GitLab's disk decision and
memory only overrides it where memory binds: a project that fits the last
index on disk but not in memory rolls over (its node excluded *before* the
new node is chosen), a new index avoids nodes without the memory, and when
memory cannot be satisfied the project keeps the disk decision and the
namespace gets a warning, never an error. If the memory-aware attempt of a
namespace fails, it is rolled back and the namespace is planned by the disk
rule alone. With memory off, ``_simulate_replica`` below
runs exactly as before and the plan has no memory keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.filters import share_left, storage_capacity
from planner.plan import (
    CREATE,
    DESTROY,
    DISK_CEILING_ABANDONED,
    INDEX_LIMIT_EXCEEDED,
    MEMORY_BUDGET_INSUFFICIENT,
    MEMORY_INDEX_LIMIT_REACHED,
    MEMORY_NODE_EXHAUSTED,
    MEMORY_PLACEMENT_ABANDONED,
    NODE_UNAVAILABLE,
    UNCHANGED,
    Decision,
    DecisionLog,
    NamespacePlan,
    NodeChange,
    NodeMemory,
    Plan,
    PlanIssue,
    PlannedIndex,
    ReplicaPlan,
    bounds_entry,
)
from planner.scenario import (
    BALANCED,
    CONCURRENCY_FACTOR,
    DISK,
    LARGEST_FIRST,
    MEMORY,
    Namespace,
    Scenario,
    _factor_ratio,
    gc_paused,
    parse_scenario,
)

__all__ = ["CONCURRENCY_FACTOR", "plan", "plan_dict"]

_NEG = float("-inf")
_INF = float("inf")

NEW_INDEX = "new_index"
NO_NODE = "no_node"
EMPTY_REPLICA = "empty_replica"
MEMORY_OVERFLOW = "memory_overflow"

#: Why a new index opened (``Decision.cause``, memory dimension only).
CAUSE_FIRST = "first"
CAUSE_DISK = "disk"
CAUSE_MEMORY_CEILING = "memory_ceiling"
CAUSE_MEMORY_BUDGET = "memory_budget"
CAUSE_DISK_CEILING = "disk_ceiling"

_OPEN = 0
_JOIN = 1


def plan(scenario: Scenario, *, record_decisions: bool = True, memory_aware: bool = True) -> Plan:
    """Plan every namespace of the scenario, in order, over the shared nodes.

    ``memory_aware=False`` (memory dimension on only): decide by disk alone,
    exactly as with memory off, but still report every memory figure, so
    one can see what the disk-only plan does to memory.
    """
    with gc_paused():
        run = _Run(scenario, record_decisions=record_decisions, memory_aware=memory_aware)
        namespaces = scenario.namespaces
        if scenario.options.order == LARGEST_FIRST:
            order = _largest_first(namespaces)
            for i in order:
                run.plan_namespace(namespaces[i])
            # The plan lists the namespaces in the given order.
            in_order: list[NamespacePlan] = [None] * len(order)  # type: ignore[list-item]
            for ns_plan, i in zip(run.plans, order, strict=True):
                in_order[i] = ns_plan
            run.plans = in_order
        else:
            for namespace in namespaces:
                run.plan_namespace(namespace)
        return run.result()


def _largest_first(namespaces: tuple[Namespace, ...] | list[Namespace]) -> list[int]:
    """Positions of the namespaces in planning order for ``order: largest_first``.

    The most repository bytes first, as the largest-processing-time rule of
    scheduling has it: the big pieces go while every node still has room, the
    small ones even the nodes out. Ties keep the given order.
    """

    # The namespaces that need nothing claim nothing: where they go is immaterial.
    keys = [-namespace.repository_bytes for namespace in namespaces]
    return sorted(range(len(keys)), key=keys.__getitem__)


def plan_dict(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """Convenience: a JSON-shaped scenario in, the JSON-shaped plan out.

    Raises ``planner.scenario.ScenarioError`` for an invalid scenario.
    """
    return plan(parse_scenario(scenario), record_decisions=False).to_dict()


class _FirstFit:
    """The leftmost candidate with at least ``need`` bytes, skipping blocked ones.

    A max-tree over candidate positions. ``values`` is the run's live list of
    unclaimed bytes (shared, not copied); the tree's leaves may be stale but
    never below the live value, because unclaimed bytes only fall. Blocked
    (exhausted) positions hold minus infinity.
    """

    __slots__ = ("size", "tree", "values")

    def __init__(self, values: list[int]) -> None:
        self.values = values
        size = 1
        while size < len(values):
            size *= 2
        self.size = size
        tree: list[float] = [_NEG] * (2 * size)
        tree[size : size + len(values)] = values
        for i in range(size - 1, 0, -1):
            left, right = tree[2 * i], tree[2 * i + 1]
            tree[i] = left if left >= right else right
        self.tree = tree

    def _set(self, position: int, value: float) -> None:
        tree = self.tree
        i = position + self.size
        tree[i] = value
        i >>= 1
        while i:
            left, right = tree[2 * i], tree[2 * i + 1]
            best = left if left >= right else right
            if tree[i] == best:
                break
            tree[i] = best
            i >>= 1

    def block(self, position: int) -> None:
        self._set(position, _NEG)

    def unblock(self, position: int) -> None:
        self._set(position, self.values[position])

    def current(self, position: int) -> int:
        """The node's key now (the tree may hold a stale, higher one)."""
        return self.values[position]

    def find(self, need: int) -> int | None:
        tree = self.tree
        size = self.size
        current = self.current
        while True:
            if tree[1] < need:
                return None
            i = 1
            while i < size:
                i <<= 1
                if tree[i] < need:
                    i += 1
            position = i - size
            actual = current(position)
            if actual >= need:
                return position
            self._set(position, actual)


class _FitBoth(_FirstFit):
    """The leftmost candidate with room for a project in *both* dimensions.

    A project of repository size ``r`` needs ``ceil(r × buffer_factor)``
    disk bytes and ``ceil(r × memory_ratio)`` memory bytes; a node with
    ``d`` unclaimed disk and ``m`` unclaimed memory fits it exactly when
    ``min(floor(d / buffer_factor), floor(m / memory_ratio)) >= r`` (the
    factors as exact fractions). That key is one number per node and only
    falls during a run, so the max-tree of ``_FirstFit`` answers the
    two-dimensional first fit with the same stale-high search. A node
    without a budget has infinite memory: its key is the disk part.
    """

    __slots__ = ("bd", "bn", "disk", "md", "mem", "mn")

    def __init__(
        self,
        disk: list[int],
        mem: list[int | float],
        buffer_ratio: tuple[int, int],
        memory_ratio: tuple[int, int],
    ) -> None:
        self.disk = disk
        self.mem = mem
        self.bn, self.bd = buffer_ratio
        self.mn, self.md = memory_ratio
        super().__init__([self.key(position) for position in range(len(disk))])

    def key(self, position: int) -> int:
        """The largest repository size the node can take now."""
        d = self.disk[position] * self.bd // self.bn
        m = self.mem[position]
        if m == _INF:
            return d
        m = m * self.md // self.mn
        return d if d <= m else m

    def unblock(self, position: int) -> None:
        self._set(position, self.key(position))

    current = key


class _Roomiest(_FirstFit):
    """The ``balanced`` strategy's search: among the candidates with room for
    ``need``, the one with the largest share of its capacity left (the least
    allocated, as Kubernetes' scheduler scores nodes); ties go to the earlier
    position, the candidate order. ``capacity`` is each node's disk size (for
    want of it, what it had unclaimed at the start of the run).

    A max-tree over that share. The share only falls during a run, so leaves
    may be stale-high exactly as in ``_FirstFit``: the search descends towards
    the larger child (the left one on a tie); a leaf whose stored share is its
    live share is the true maximum; a stale one is brought down and the search
    starts again. The best-scored node may lack the room for ``need`` (a small
    node with a large share left): it is set aside for this search and the next
    best is looked at; the ones set aside are put back before returning.
    ``fit`` is the run's max-tree of room (``_FirstFit`` or ``_FitBoth``): its
    root says at once when no candidate has the room.
    """

    __slots__ = ("fit", "start")

    def __init__(self, fit: _FirstFit, capacity: list[int]) -> None:
        self.fit = fit
        self.start = capacity
        super().__init__([self.score(position) for position in range(len(capacity))])

    def score(self, position: int) -> float:
        """The share of the node's capacity that is unclaimed now."""
        return share_left(self.fit.values[position], self.start[position])

    current = score

    def unblock(self, position: int) -> None:
        self._set(position, self.current(position))

    def best(self, need: int) -> int | None:
        fit = self.fit
        if fit.tree[1] < need:
            return None
        tree = self.tree
        size = self.size
        current = self.current
        room = fit.current
        aside: list[int] | None = None
        found: int | None = None
        while tree[1] != _NEG:
            i = 1
            while i < size:
                i <<= 1
                if tree[i] < tree[i + 1]:
                    i += 1
            position = i - size
            actual = current(position)
            if actual != tree[i]:
                self._set(position, actual)
                continue
            if room(position) >= need:
                found = position
                break
            if aside is None:
                aside = []
            aside.append(position)
            self._set(position, _NEG)
        if aside is not None:
            for position in aside:
                self._set(position, current(position))
        return found


class _RoomiestBoth(_Roomiest):
    """``_Roomiest`` in two dimensions: the share left is the smaller of the
    disk share and the memory share (unclaimed memory over the budget): the
    dominant resource decides. A node without a budget scores by disk alone.
    Room for ``need`` (repository bytes) is ``_FitBoth``'s key."""

    __slots__ = ("mem", "mem_start")

    def __init__(self, fit: _FitBoth, start: list[int], mem_start: list[int | float]) -> None:
        self.mem = fit.mem
        self.mem_start = mem_start
        super().__init__(fit, start)

    def score(self, position: int) -> float:
        """``planner.filters.node_score`` of the node (disk and memory)."""
        share = share_left(self.fit.disk[position], self.start[position])  # type: ignore[attr-defined]
        budget = self.mem_start[position]
        if budget == _INF:
            return share
        memory_share = share_left(self.mem[position], budget)
        return share if share <= memory_share else memory_share

    current = score


class _Projects:
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


class _Run:
    """The shared node records of one planning run, and the namespace plans so far."""

    def __init__(
        self, scenario: Scenario, *, record_decisions: bool, memory_aware: bool = True
    ) -> None:
        self.node_ids = [node.id for node in scenario.nodes]
        self.position_of = {node_id: pos for pos, node_id in enumerate(self.node_ids)}
        #: Node names by position when any node has one (the plan then
        #: carries them), else ``None``.
        self.names: list[str | None] | None = None
        if any(node.name is not None for node in scenario.nodes):
            self.names = [node.name for node in scenario.nodes]
        #: Live unclaimed bytes per candidate position (the disk dimension).
        #: The node of a replica's open index is brought up to date lazily
        #: (``_write``) before anything reads it.
        self.disk = [node.unclaimed_storage_bytes for node in scenario.nodes]
        self.before = list(self.disk)
        self.node_indices: list[list[PlannedIndex]] = [[] for _ in self.node_ids]
        self.first_fit = _FirstFit(self.disk)
        #: ``first_fit``: the first candidate with room (GitLab's); ``balanced``: the
        #: candidate with the largest share of its room left, re-scored as the run
        #: consumes it (``_Roomiest``).
        self.balanced = scenario.options.strategy == BALANCED
        self.roomiest: _Roomiest | None = None
        if self.balanced:
            #: What a node's room is scored against: its disk size (never below
            #: what it has unclaimed), or for want of it the unclaimed.
            self.capacity = [
                storage_capacity(node.total_bytes, value)
                for node, value in zip(scenario.nodes, self.disk, strict=True)
            ]
            self.roomiest = _Roomiest(self.first_fit, self.capacity)
            self.pick = self.roomiest.best
        else:
            self.pick = self.first_fit.find
        #: The trees searched for a node: a namespace's exclusions block them. (In
        #: balanced runs the room trees are only asked for an upper bound, which
        #: holds unblocked.) ``all_trees``: every tree, refreshed after a rollback.
        self.trees: list[_FirstFit] = [self.roomiest or self.first_fit]
        self.all_trees: list[_FirstFit] = [self.first_fit]
        if self.roomiest is not None:
            self.all_trees.append(self.roomiest)
        self.exhausted = _Exhausted(self.trees)
        self.cap = scenario.options.max_indices_per_replica
        self.factor = _factor_ratio(scenario.options.buffer_factor)
        #: ``max_index_storage_fraction``: each node's largest max_storage_bytes
        #: of a new index (a share of its unclaimed storage at the start of the
        #: run), or ``None``: GitLab's rule, whatever the node has left.
        self.disk_ceilings: list[int] | None = None
        self.smallest_disk_ceiling = 0
        fraction = scenario.options.max_index_storage_fraction
        if fraction is not None:
            num, den = _factor_ratio(fraction)
            self.disk_ceilings = [max(value, 0) * num // den for value in self.disk]
            self.smallest_disk_ceiling = min(self.disk_ceilings, default=0)
        self.plans: list[NamespacePlan] = []
        self.log: DecisionLog | None = None
        self.decisions: list[Decision] = []
        self.disk_history: list[tuple[list[int], list[int]]] = []
        if record_decisions:
            self.disk_history = [([-1], [value]) for value in self.disk]
            self.log = DecisionLog(
                tuple(self.node_ids),
                self.decisions,
                {DISK: self.disk_history},
                strategy=scenario.options.strategy,
                capacity={DISK: self.capacity} if self.balanced else None,
            )
        #: While a memory-aware namespace attempt runs: position → what to
        #: restore if the attempt is abandoned (see ``_rollback``).
        self.undo: dict[int, tuple[int, int | float, int, int]] | None = None
        self.undo_decisions = 0
        self.memory = scenario.memory_on
        if self.memory:
            self._init_memory(scenario, memory_aware)

    def _init_memory(self, scenario: Scenario, memory_aware: bool) -> None:
        options = scenario.options.memory
        self.aware = memory_aware
        self.budgets = [scenario.memory_budget(node) for node in scenario.nodes]
        #: Live unclaimed memory per candidate position: budget minus the
        #: estimated memory of the indices the node already holds (the
        #: ``reserved_memory_bytes`` extension) minus what this run places.
        #: Infinite for a node without a budget (no limit).
        self.mem: list[int | float] = [
            _INF if budget is None else budget - (node.reserved_memory_bytes or 0)
            for node, budget in zip(scenario.nodes, self.budgets, strict=True)
        ]
        self.mem_before = list(self.mem)
        #: max_memory_bytes of an index on each node (infinite: no budget).
        self.ceilings: list[int | float] = [
            _INF if budget is None else options.ceiling(budget) for budget in self.budgets
        ]
        self.memory_ratio = _factor_ratio(options.memory_ratio)
        self.fit_both = _FitBoth(self.disk, self.mem, self.factor, self.memory_ratio)
        self.all_trees.append(self.fit_both)
        self.roomiest_both: _RoomiestBoth | None = None
        if self.balanced:
            budgets = [_INF if budget is None else budget for budget in self.budgets]
            self.roomiest_both = _RoomiestBoth(self.fit_both, self.capacity, budgets)
            if self.log is not None and self.log.capacity is not None:
                self.log.capacity[MEMORY] = budgets
            self.trees.append(self.roomiest_both)
            self.all_trees.append(self.roomiest_both)
            self.pick_both = self.roomiest_both.best
        else:
            self.trees.append(self.fit_both)
            self.pick_both = self.fit_both.find
        self.exhausted = _Exhausted(self.trees)
        self.undo_decisions = 0
        #: The largest repository size placed in the run (for the bounds;
        #: scaled size and estimate are both monotone in it).
        self.largest_repository = 0
        self.mem_history: list[tuple[list[int], list[int | float]]] = []
        if self.log is not None:
            self.mem_history = [([-1], [value]) for value in self.mem]
            self.log.history[MEMORY] = self.mem_history

    def _touch(self, position: int) -> None:
        """Remember what to restore at ``position`` if the namespace attempt is abandoned."""
        undo = self.undo
        if undo is not None and position not in undo:
            memory = self.memory
            mem = self.mem[position] if memory else 0
            if self.log is not None:
                undo[position] = (
                    self.disk[position],
                    mem,
                    len(self.disk_history[position][0]),
                    len(self.mem_history[position][0]) if memory else 0,
                )
            else:
                undo[position] = (self.disk[position], mem, 0, 0)

    def _write(self, position: int, value: int) -> None:
        """Set a node's unclaimed bytes, and log the change for explain."""
        if self.undo is not None:
            self._touch(position)
        if self.disk[position] != value:
            self.disk[position] = value
            if self.log is not None:
                sequences, values = self.disk_history[position]
                sequences.append(len(self.decisions))
                values.append(value)

    def _write_both(self, position: int, disk_value: int, mem_value: int | float) -> None:
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

    # ------------------------------------------------------------------ #

    def plan_namespace(self, namespace: Namespace) -> None:
        existing = len(namespace.existing_replicas)
        desired = namespace.number_of_replicas
        ns_plan = NamespacePlan(
            namespace.namespace_id,
            namespace.enabled_namespace_id,
            CREATE if existing < desired else DESTROY if existing > desired else UNCHANGED,
        )
        self.plans.append(ns_plan)
        if existing > desired:
            ordered = sorted(
                namespace.existing_replicas, key=lambda replica: (replica.state_value, -replica.id)
            )
            ns_plan.replicas_to_destroy = [replica.id for replica in ordered[: existing - desired]]
            return
        if existing == desired:
            return
        exhausted = self.exhausted
        self._exclude_existing(namespace)
        if self.memory and namespace.has_projects:
            self._plan_namespace_memory(ns_plan, namespace, desired - existing)
            return

        if not namespace.has_projects:
            try:
                for replica_idx in range(desired - existing):
                    self._empty_replica(ns_plan, replica_idx)
            finally:
                exhausted.release()
        else:
            pnids, pids, rsizes = namespace.columns
            num, den = self.factor
            if den != 1:
                sizes = [-(-r * num // den) for r in rsizes]
            elif num != 1:
                sizes = [r * num for r in rsizes]
            else:
                sizes = rsizes
            total = sum(sizes)
            guarded = self._ceiling_may_bind(total)
            ceilings = self.disk_ceilings if guarded else None
            if guarded:
                self._begin_attempt()
            try:
                for replica_idx in range(desired - existing):
                    self._simulate_replica(
                        ns_plan, replica_idx, pnids, pids, sizes, total, ceilings
                    )
            finally:
                exhausted.release()
            if guarded and ns_plan.errors:
                # It failed under the ceiling: planned again by GitLab's rule alone.
                error = self._abandon_attempt(ns_plan, namespace)
                try:
                    for replica_idx in range(desired - existing):
                        self._simulate_replica(ns_plan, replica_idx, pnids, pids, sizes, total)
                finally:
                    exhausted.release()
                if not ns_plan.errors:
                    ns_plan.warnings.append(self._abandoned_warning(ns_plan, error, False))
            self.undo = None
        if len(ns_plan.errors) > 1:
            # GitLab keeps the unique errors, first occurrence first.
            ns_plan.errors = list(dict.fromkeys(ns_plan.errors))

    def _exclude_existing(self, namespace: Namespace) -> None:
        """One index per namespace and node: the nodes that hold an index of
        the namespace already are excluded from every search of its plan."""
        exhausted = self.exhausted
        position_of = self.position_of
        for node_id in namespace.existing_node_ids:
            position = position_of.get(node_id)
            if position is not None:
                exhausted.add(position)

    # ------------------------------------------------------------------ #

    def _simulate_replica(
        self,
        ns_plan: NamespacePlan,
        replica_idx: int,
        pnids: list[int],
        pids: list[int],
        sizes: list[int],
        total: int,
        ceilings: list[int] | None = None,
    ) -> None:
        """Plan one replica by the disk rule (GitLab's newest planner).

        Before each project the index cap is checked; a project that fits the
        replica's last index joins it with no node search; otherwise a new
        index opens on the first candidate with room that holds no index of
        the namespace (existing, of a replica planned earlier in this run, or
        of this replica), and that node is excluded at once. With ``ceilings``
        (``max_index_storage_fraction``) a new index's max_storage_bytes is at
        most its node's ceiling, so a large namespace rolls over sooner.
        """
        disk = self.disk
        write = self._write
        find = self.pick
        exhausted = self.exhausted
        cap = self.cap
        namespace_id = ns_plan.namespace_id
        node_ids = self.node_ids
        names = self.names
        indices: list[PlannedIndex] = []
        n = len(sizes)

        last: PlannedIndex | None = None
        last_pos = -1
        last_max: int | float = -1  # no last index: nothing fits it
        last_open = 0  # the last index's node's unclaimed bytes when it opened
        last_req = 0
        last_to = 0
        # Within a namespace's plan room only shrinks and exclusions only
        # grow: a size the search could not place fails for good.
        search_fail: int | float = _INF

        k = 0
        while k < n:
            size = sizes[k]
            if len(indices) >= cap:
                ns_plan.errors.append(
                    PlanIssue(
                        namespace_id,
                        replica_idx,
                        INDEX_LIMIT_EXCEEDED,
                        f"Replica reached maximum index limit ({cap})",
                    )
                )
                break
            if last_req + size <= last_max:
                # The fit test comes before the node search.
                last_req += size
                last_to = pnids[k]
                k += 1
                continue

            # A new index (or the replica's first) on the first-fit node.
            if last is not None:
                write(last_pos, last_open - last_req)
            exhausted.flush()
            position = find(size) if size < search_fail else None
            if position is None:
                if size < search_fail:
                    search_fail = size
                self._unavailable(ns_plan, replica_idx, len(indices), pids[k], pnids[k], size)
                k += 1
                continue
            if self.log is not None:
                self.decisions.append(
                    Decision(
                        NEW_INDEX,
                        namespace_id,
                        replica_idx,
                        len(indices),
                        pids[k],
                        pnids[k],
                        {DISK: size},
                        position,
                        exhausted.frozen(),
                    )
                )
            last_open = max_bytes = disk[position]
            if ceilings is not None and ceilings[position] < max_bytes:
                # Never below the project that opens the index.
                max_bytes = ceilings[position] if ceilings[position] >= size else size
            if last is None:
                index = PlannedIndex(node_ids[position], namespace_id, None, None, 0, max_bytes)
            else:
                last.required_storage_bytes = last_req
                last.project_namespace_id_to = last_to
                index = PlannedIndex(
                    node_ids[position], namespace_id, last_to + 1, None, 0, max_bytes
                )
            if names is not None:
                index.node_name = names[position]
            exhausted.add(position)
            indices.append(index)
            self.node_indices[position].append(index)
            last = index
            last_pos = position
            last_max = max_bytes
            last_req = size
            last_to = pnids[k]
            if k == 0 and cap > 1 and total <= max_bytes:
                # Everything fits the first index: every project joins it, as
                # it would one by one.
                last_req = total
                last_to = pnids[-1]
                break
            k += 1

        if last is not None:
            last.required_storage_bytes = last_req
            last.project_namespace_id_to = None
            write(last_pos, last_open - last_req)
        ns_plan.replicas.append(ReplicaPlan(indices))

    # ------------------------------------------------------------------ #
    # The memory dimension
    # ------------------------------------------------------------------ #

    def _plan_namespace_memory(
        self, ns_plan: NamespacePlan, namespace: Namespace, missing: int
    ) -> None:
        """Plan a namespace with projects, memory dimension on.

        The memory-aware attempt runs first. If it ends with an error, it is
        rolled back (nodes, decision records) and the namespace is planned by
        the disk rule alone, the plan GitLab would make from this state: memory
        never makes a namespace fail (seed 1d). (When memory changed nothing,
        the redo is the same plan.) The disk-only plan keeps its verdict; if it
        succeeds, memory did make the difference and it carries a
        ``memory_placement_abandoned`` warning. With a disk ceiling per index
        that applies to the namespace, the disk-rule redo keeps the ceiling, and
        if that fails too the namespace is planned once more without it
        (``disk_ceiling_abandoned`` when that succeeds).
        """
        pnids, pids, repository_sizes = namespace.columns
        num, den = self.factor
        rsizes: list[int] | None = None
        if den == 1:
            sizes = [r * num for r in repository_sizes] if num != 1 else repository_sizes
        else:
            rsizes = repository_sizes
            sizes = [-(-r * num // den) for r in rsizes]
        # The replica's sizes all together (the first index's shortcut).
        total = sum(sizes) if rsizes is None else _INF
        data = (pnids, pids, sizes, rsizes, total)
        aware = self.aware
        # (The sum is only needed with a fractional buffer factor and a ceiling.)
        bind = self.disk_ceilings is not None and self._ceiling_may_bind(
            total if rsizes is None else sum(sizes)
        )
        ceilings = self.disk_ceilings if bind else None
        guarded = aware or bind
        if guarded:
            self._begin_attempt()
        if missing == 1:
            try:
                largest = self._simulate_replica_memory(
                    ns_plan, 0, data[0], data[1], sizes, rsizes, total, aware, ceilings
                )
            finally:
                self.exhausted.release()
        else:
            largest = self._simulate_replicas(ns_plan, data, missing, aware, ceilings)
        # What failed is tried again one rule less at a time: memory never makes
        # a namespace fail where the disk rules place it, nor the disk ceiling
        # where GitLab's rule does.
        given_up: list[PlanIssue] = []
        if aware and ns_plan.errors:
            error = self._abandon_attempt(ns_plan, namespace)
            largest = self._simulate_replicas(ns_plan, data, missing, False, ceilings)
            given_up.append(self._abandoned_warning(ns_plan, error, True))
        if ceilings is not None and ns_plan.errors:
            error = self._abandon_attempt(ns_plan, namespace)
            largest = self._simulate_replicas(ns_plan, data, missing, False, None)
            given_up.append(self._abandoned_warning(ns_plan, error, False))
        if given_up and not ns_plan.errors:
            ns_plan.warnings.extend(given_up)
        self.undo = None
        if len(ns_plan.errors) > 1:
            ns_plan.errors = list(dict.fromkeys(ns_plan.errors))
        if largest < 0:
            # Every project was placed. Its largest matters only if it can beat
            # the run's: not when the whole namespace is smaller.
            if rsizes is None:
                if total // num > self.largest_repository:
                    largest = max(sizes) // num
            else:
                largest = max(rsizes, default=0)
        if largest > self.largest_repository:
            self.largest_repository = largest

    def _simulate_replicas(
        self,
        ns_plan: NamespacePlan,
        data: tuple,
        missing: int,
        aware: bool,
        ceilings: list[int] | None = None,
    ) -> int:
        """Every missing replica; the largest repository size placed (-1: all were)."""
        simulate = self._simulate_replica_memory
        try:
            if missing == 1:
                return simulate(ns_plan, 0, *data, aware, ceilings)
            largest = 0
            for replica_idx in range(missing):
                biggest = simulate(ns_plan, replica_idx, *data, aware, ceilings)
                if biggest < 0 or largest < 0:
                    largest = -1
                elif biggest > largest:
                    largest = biggest
            return largest
        finally:
            self.exhausted.release()

    def _ceiling_may_bind(self, total: int | float) -> bool:
        """Whether the disk ceilings apply to a namespace of ``total`` scaled bytes:
        only when it is larger than the run's smallest ceiling (a smaller one is
        planned by GitLab's rule, which the ceilings could not change), so that
        its attempt must be undoable."""
        return self.disk_ceilings is not None and total > self.smallest_disk_ceiling

    def _begin_attempt(self) -> None:
        """Record from here what a namespace attempt changes, to roll it back."""
        self.undo = {}
        self.undo_decisions = len(self.decisions)

    def _abandon_attempt(self, ns_plan: NamespacePlan, namespace: Namespace) -> PlanIssue:
        """Roll the failed attempt back and clear its plan; returns its first error."""
        error = ns_plan.errors[0]
        self._rollback(ns_plan)
        ns_plan.replicas = []
        ns_plan.errors = []
        ns_plan.warnings = []
        self._exclude_existing(namespace)
        return error

    def _abandoned_warning(
        self, ns_plan: NamespacePlan, error: PlanIssue, aware: bool
    ) -> PlanIssue:
        """The warning of a namespace planned by GitLab's disk rule after the
        memory-aware or disk-ceiling attempt failed."""
        cause = f"({error.type} in replica {error.replica_idx}: {error.details})"
        if aware:
            return PlanIssue(
                ns_plan.namespace_id,
                None,
                MEMORY_PLACEMENT_ABANDONED,
                f"The memory-aware placement would have failed {cause}; the namespace is "
                "planned by the disk-only rule instead, without memory limits",
            )
        return PlanIssue(
            ns_plan.namespace_id,
            None,
            DISK_CEILING_ABANDONED,
            f"The placement under the disk ceiling per index (max_index_storage_fraction) "
            f"would have failed {cause}; the namespace is planned without it, each index "
            "taking up to its node's unclaimed storage",
        )

    def _rollback(self, ns_plan: NamespacePlan) -> None:
        """Undo everything the namespace's abandoned attempt did to the run's records."""
        node_indices = self.node_indices
        position_of = self.position_of
        for replica in reversed(ns_plan.replicas):
            for index in reversed(replica.indices):
                popped = node_indices[position_of[index.node_id]].pop()
                assert popped is index
        undo = self.undo or {}
        memory = self.memory
        for position, (disk, mem, disk_len, mem_len) in undo.items():
            self.disk[position] = disk
            if memory:
                self.mem[position] = mem
            if self.log is not None:
                histories = [(self.disk_history[position], disk_len)]
                if memory:
                    histories.append((self.mem_history[position], mem_len))
                for history, length in histories:
                    del history[0][length:]
                    del history[1][length:]
        del self.decisions[self.undo_decisions :]
        # Unclaimed bytes went back up: the trees' entries must not stay below them.
        for position in undo:
            for tree in self.all_trees:
                tree.unblock(position)
        self.undo = {}

    def _estimate(self, repository_bytes: int | float) -> int | float:
        """The estimate for ``repository_bytes`` of projects: × memory_ratio, rounded up."""
        num, den = self.memory_ratio
        return -(-repository_bytes * num // den)

    def _r_limit(self, memory_bytes: int | float) -> int | float:
        """The most repository bytes whose estimate fits in ``memory_bytes`` (−1: none)."""
        if memory_bytes == _INF:
            return _INF
        num, den = self.memory_ratio
        return memory_bytes * den // num if memory_bytes >= 0 else -1

    def _simulate_replica_memory(
        self,
        ns_plan: NamespacePlan,
        replica_idx: int,
        pnids: list[int],
        pids: list[int],
        sizes: list[int],
        rsizes: list[int] | None,
        total: int | float,
        aware: bool,
        ceilings: list[int] | None = None,
    ) -> int:
        """Plan one replica with the memory dimension on.

        Returns the largest repository size placed (-1: every project was
        placed). With ``aware`` False this makes exactly the
        disk-only decisions of ``_simulate_replica`` and only keeps the
        memory figures.

        Memory is tracked in repository bytes: the last index's memory test
        ``estimate(Σr + r) <= limit`` is ``Σr + r <= floor(limit / ratio)``,
        one integer per index. With an integral buffer factor ``num`` a
        scaled size is ``r × num``, so that limit is folded into the disk
        test as ``last_lim = min(max_storage, limit × num)``: the hot path
        (a project joining the last index) costs what GitLab's does. With a
        fractional factor the repository bytes are summed alongside.
        Only what the hot path needs is bound to locals; the rest is looked
        up when a new index opens.
        """
        find = self.pick
        fit_both = self.pick_both
        cap = self.cap
        num = self.factor[0]
        nonlinear = rsizes is not None
        n = len(sizes)
        indices: list[PlannedIndex] = []
        notes: dict[str, list] | None = None  # memory warnings: type → [details, count]
        skipped: list[int] | None = None
        stop = n

        last: PlannedIndex | None = None
        last_pos = -1
        last_max: int | float = -1  # no last index: nothing fits it
        last_open = 0  # the last index's node's unclaimed bytes when it opened
        last_lim: int | float = -1  # min(last_max, memory limit × num) (integral factor)
        last_req = 0
        last_to = 0
        last_r = 0  # fractional factor only: repository bytes in the last index
        last_rlim: int | float = _INF  # repository bytes the memory limit allows
        last_mopen: int | float = 0  # the node's unclaimed memory when the index opened
        search_fail: int | float = _INF  # smallest size the disk search could not place

        for k in range(n):
            size = sizes[k]
            if len(indices) >= cap:
                ns_plan.errors.append(
                    PlanIssue(
                        ns_plan.namespace_id,
                        replica_idx,
                        INDEX_LIMIT_EXCEEDED,
                        f"Replica reached maximum index limit ({cap})",
                    )
                )
                stop = k
                break

            if last_req + size > last_lim or (nonlinear and last_r + rsizes[k] > last_rlim):
                mn, md = self.memory_ratio
                position = -1  # set: a memory-driven rollover to this candidate
                if last_req + size <= last_max:
                    # Fits the last index on disk but not in memory (aware only).
                    index_r = last_r if nonlinear else last_req // num
                    self._write_both(
                        last_pos,
                        last_open - last_req,
                        last_mopen - -(-index_r * mn // md),
                    )
                    if notes is None:
                        notes = {}
                    outcome = self._memory_limit(
                        _Projects(pnids, pids, sizes, rsizes, num),
                        k,
                        last_pos,
                        index_r,
                        last_mopen,
                        len(indices),
                        notes,
                    )
                    if outcome[0] == _OPEN:
                        position = outcome[1]
                    else:
                        last_rlim = outcome[1]
                        if not nonlinear:
                            limit = last_rlim * num
                            last_lim = last_max if last_max < limit else limit
                        if self.log is not None:
                            self._record(
                                MEMORY_OVERFLOW,
                                ns_plan,
                                replica_idx,
                                len(indices) - 1,
                                pids[k],
                                pnids[k],
                                size,
                                rsizes[k] if nonlinear else size // num,
                                last_pos,
                                None,
                                outcome[2],
                                True,
                            )
                if position >= 0 or last_req + size > last_max:
                    # A new index: the replica's first, a disk rollover, or
                    # (position set) a memory rollover.
                    mem = self.mem
                    exhausted = self.exhausted
                    warning = None
                    if position >= 0:
                        cause = outcome[2]
                    elif last is None:
                        cause = CAUSE_FIRST
                    elif last_req + size <= last_open:
                        # The node has the room; the index's disk ceiling does not.
                        cause = CAUSE_DISK_CEILING
                    else:
                        cause = CAUSE_DISK
                    if last is not None:
                        self._write_both(
                            last_pos,
                            last_open - last_req,
                            last_mopen - -(-(last_r if nonlinear else last_req // num) * mn // md),
                        )
                    r = rsizes[k] if nonlinear else size // num
                    if position < 0 and aware:
                        # The first node with room in both dimensions: GitLab's own
                        # first fit whenever that node has the memory too.
                        exhausted.flush()
                        position = fit_both(r)
                        if position is None:
                            # No usable node has both: the disk-only choice, with a warning.
                            if notes is None:
                                notes = {}
                            position, warning = self._memory_choice(
                                ns_plan,
                                replica_idx,
                                len(indices),
                                pids[k],
                                pnids[k],
                                size,
                                r,
                                notes,
                            )
                            if position is None:
                                if skipped is None:
                                    skipped = []
                                skipped.append(k)
                                continue
                    elif position < 0:
                        exhausted.flush()
                        position = find(size) if size < search_fail else None
                        if position is None:
                            if size < search_fail:
                                search_fail = size
                            self._unavailable(
                                ns_plan,
                                replica_idx,
                                len(indices),
                                pids[k],
                                pnids[k],
                                size,
                            )
                            if skipped is None:
                                skipped = []
                            skipped.append(k)
                            continue
                    if self.log is not None:
                        self._record(
                            NEW_INDEX,
                            ns_plan,
                            replica_idx,
                            len(indices),
                            pids[k],
                            pnids[k],
                            size,
                            r,
                            position,
                            cause,
                            warning,
                            aware,
                        )
                    opened = max_bytes = self.disk[position]
                    if ceilings is not None and ceilings[position] < max_bytes:
                        # Never below the project that opens the index.
                        c = ceilings[position]
                        max_bytes = c if c >= size else size
                    ceiling = self.ceilings[position]
                    if last is None:
                        index = PlannedIndex(
                            self.node_ids[position],
                            ns_plan.namespace_id,
                            None,
                            None,
                            0,
                            max_bytes,
                            0,
                            None if ceiling == _INF else ceiling,
                        )
                    else:
                        last.required_storage_bytes = last_req
                        last.estimated_memory_bytes = -(
                            -(last_r if nonlinear else last_req // num) * mn // md
                        )
                        last.project_namespace_id_to = last_to
                        index = PlannedIndex(
                            self.node_ids[position],
                            ns_plan.namespace_id,
                            last_to + 1,
                            None,
                            0,
                            max_bytes,
                            0,
                            None if ceiling == _INF else ceiling,
                        )
                    if self.names is not None:
                        index.node_name = self.names[position]
                    # One index per namespace and node, from the first index on.
                    exhausted.add(position)
                    indices.append(index)
                    self.node_indices[position].append(index)
                    last = index
                    last_pos = position
                    last_max = max_bytes
                    last_open = opened
                    last_req = size
                    last_to = pnids[k]
                    last_mopen = mem[position]
                    last_r = r
                    last_lim = max_bytes
                    if aware:
                        room = ceiling if ceiling < last_mopen else last_mopen
                        if room == _INF:
                            last_rlim = _INF
                        else:
                            last_rlim = room * md // mn if room >= 0 else -1
                            if last_rlim * num < max_bytes and not nonlinear:
                                last_lim = last_rlim * num
                    if k == 0 and n > 1 and cap > 1 and total <= last_lim:
                        # The replica's first index has no gate: if everything fits it
                        # (the namespace's total size), every project joins it, as
                        # they would one by one. (Integral buffer factors only.)
                        last_req = total
                        last_to = pnids[-1]
                        break
                    continue

            # Joins the last index (the fit test comes before any node search).
            last_req += size
            last_to = pnids[k]
            if nonlinear:
                last_r += rsizes[k]

        if last is not None:
            mn, md = self.memory_ratio
            last.required_storage_bytes = last_req
            estimate = -(-(last_r if nonlinear else last_req // num) * mn // md)
            last.estimated_memory_bytes = estimate
            last.project_namespace_id_to = None
            self._write_both(
                last_pos,
                last_open - last_req,
                last_mopen - estimate,
            )
        ns_plan.replicas.append(ReplicaPlan(indices))
        if notes:
            self._warn(ns_plan, replica_idx, indices, notes)
        if skipped is None and stop == n:
            return -1
        refused = set(skipped or ())
        values = rsizes if nonlinear else sizes
        largest = max((values[k] for k in range(stop) if k not in refused), default=0)
        return largest if nonlinear else largest // num

    def _memory_choice(
        self,
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

    def _record(
        self,
        kind: str,
        ns_plan: NamespacePlan,
        replica_idx: int,
        index_idx: int,
        pid: int,
        pnid: int,
        size: int,
        r: int,
        position: int,
        cause: str | None,
        warning: str | None,
        memory: bool,
    ) -> None:
        """A decision record of the memory dimension (only when recording)."""
        exhausted = self.exhausted
        self.decisions.append(
            Decision(
                kind,
                ns_plan.namespace_id,
                replica_idx,
                index_idx,
                pid,
                pnid,
                # The decisions of an unaware pass are disk-only: they ask for disk.
                {DISK: size, MEMORY: self._estimate(r)} if memory else {DISK: size},
                position,
                exhausted.frozen(),
                cause,
                warning,
            )
        )

    def _memory_limit(
        self,
        data: _Projects,
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
        size = data.sizes[k]
        r = data.r(k)
        estimate = self._estimate
        mm = estimate(r)
        last_mem = estimate(last_r)
        pid = data.pids[k]
        exhausted = self.exhausted
        node_ids = self.node_ids
        # How many more indices the cap allows without GitLab's cap error
        # (10.4: a replica at the cap fails on its next project).
        cap_left = self.cap - n_indices - (1 if k < len(data.sizes) - 1 else 0)
        here = f"index {n_indices - 1} on node {node_ids[last_pos]}"

        if estimate(last_r + r) > last_mopen:
            # The node's own unclaimed memory is short (not only the ceiling).
            if cap_left > 0:
                exhausted.flush()
                position = self.pick_both(r)
                if position is not None:
                    return (_OPEN, position, CAUSE_MEMORY_BUDGET)
                if self._disk_only_choice(size) is not None:
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
                f"Node {node_ids[last_pos]} has {_show(last_mopen - last_mem)} bytes of unclaimed "
                f"memory left, less than project {pid} needs ({mm} bytes estimated), and {why}; "
                f"the project and the rest of the replica stay in {here} past the node's "
                "memory budget (disk-only decision)",
            )
            return (_JOIN, _INF, wtype)

        # The index's memory limit binds. Which nodes could take a new index?
        disk = self.disk
        mem = self.mem
        positions = exhausted.positions
        # The node a ceiling rollover goes to: the first usable one (first fit),
        # or the roomiest (balanced, the earlier on a tie).
        first = -1
        usable = 0
        score = None if self.roomiest_both is None else self.roomiest_both.score
        best: float = _NEG
        for p in range(len(disk)):
            if disk[p] >= size and mem[p] >= mm and p not in positions:
                usable += 1
                if first < 0:
                    first = p
                    if score is not None:
                        best = score(p)
                elif score is not None and score(p) > best:
                    first, best = p, score(p)
        allowed = cap_left if cap_left > 0 else 0
        more = usable if usable < allowed else allowed
        left = estimate(data.suffix(k))
        ceiling = self.ceilings[last_pos]
        if more > 0 and left <= more * ceiling:
            return (_OPEN, first, CAUSE_MEMORY_CEILING)
        # The limit cannot be kept for the rest of the replica.
        if allowed < usable:
            wtype = MEMORY_INDEX_LIMIT_REACHED
            why = f"max_indices_per_replica ({self.cap}) allows only {more} more index(es)"
        elif usable == 0 and self._disk_only_choice(size) is not None:
            wtype = MEMORY_BUDGET_INSUFFICIENT
            why = "the nodes with unclaimed storage for a new index lack the memory"
        else:
            wtype = MEMORY_NODE_EXHAUSTED
            why = (
                "the nodes ran out: "
                + (
                    f"only {usable} other node(s) can take a new index of this replica"
                    if usable
                    else "no other node can take a new index of this replica"
                )
                + " (the others are exhausted for the namespace or without the room)"
            )
        head = (
            f"{here} reached its max_memory_bytes ({ceiling}) at project {pid}; the rest of "
            f"the replica needs {left} bytes of estimated memory and {why}"
        )
        if more == 0:
            _note(
                notes,
                wtype,
                f"{head}, so the rest stays in {here} past its max_memory_bytes "
                "(disk-only decision)",
            )
            return (_JOIN, _INF, wtype)
        share = -(-(last_mem + left) // (more + 1))
        target = share if share < last_mopen else last_mopen
        limit = self._r_limit(target)
        if last_r + r <= limit:
            _note(
                notes,
                wtype,
                f"{head}, so the last {more + 1} indices are balanced at about {share} bytes "
                "each instead, past max_memory_bytes",
            )
            return (_JOIN, limit, wtype)
        return (_OPEN, first, CAUSE_MEMORY_CEILING)

    def _disk_only_choice(self, size: int) -> int | None:
        """The first (balanced: the roomiest) candidate with the disk room that the
        namespace may still use."""
        self.exhausted.flush()
        return self.pick(size)

    def _warn(
        self,
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

    def _unavailable(
        self,
        ns_plan: NamespacePlan,
        replica_idx: int,
        index_idx: int,
        project_id: int,
        project_namespace_id: int,
        size: int,
        *,
        memory: int | None = None,
    ) -> None:
        """A ``node_unavailable`` error, in GitLab's two wordings.

        ``memory``: the failed search also asked for this much estimated
        memory (the memory dimension's record of what was requested).
        """
        if max(self.disk, default=_NEG) >= size:
            # Some node has the room, but every such node already holds an
            # index of this namespace.
            details = (
                f"Every node with capacity for project {project_id} with size {size} "
                "already holds an index for this namespace"
            )
        else:
            details = f"No node can accommodate project {project_id} with size {size}"
        ns_plan.errors.append(
            PlanIssue(ns_plan.namespace_id, replica_idx, NODE_UNAVAILABLE, details)
        )
        if self.log is not None:
            self.decisions.append(
                Decision(
                    NO_NODE,
                    ns_plan.namespace_id,
                    replica_idx,
                    index_idx,
                    project_id,
                    project_namespace_id,
                    {DISK: size} if memory is None else {DISK: size, MEMORY: memory},
                    None,
                    self.exhausted.frozen(),
                )
            )

    def _empty_replica(self, ns_plan: NamespacePlan, replica_idx: int) -> None:
        """One index with no projects on the roomiest usable node (first on ties).

        Usable: not negative, and holding no index of the namespace (existing
        or planned in this run).
        """
        disk = self.disk
        exhausted = self.exhausted
        best = -1
        for position in range(len(disk)):
            if position in exhausted or disk[position] < 0:
                continue
            if best < 0 or disk[position] > disk[best]:
                best = position
        if self.log is not None:
            self.decisions.append(
                Decision(
                    EMPTY_REPLICA,
                    ns_plan.namespace_id,
                    replica_idx,
                    0 if best >= 0 else None,
                    None,
                    None,
                    {DISK: 0},
                    best if best >= 0 else None,
                    exhausted.frozen(),
                )
            )
        if best < 0:
            ns_plan.errors.append(
                PlanIssue(
                    ns_plan.namespace_id,
                    None,
                    NODE_UNAVAILABLE,
                    "No nodes available to create an empty replica",
                )
            )
            return
        index = PlannedIndex(self.node_ids[best], ns_plan.namespace_id, None, None, 0, disk[best])
        if self.names is not None:
            index.node_name = self.names[best]
        if self.memory:
            # No projects, no estimated memory; the node's ceiling is shown as is.
            index.estimated_memory_bytes = 0
            ceiling = self.ceilings[best]
            index.max_memory_bytes = None if ceiling == _INF else ceiling
        # As in GitLab, the empty index claims nothing and is not listed on its node.
        exhausted.add(best)
        ns_plan.replicas.append(ReplicaPlan([index]))

    # ------------------------------------------------------------------ #

    def result(self) -> Plan:
        create: list[NamespacePlan] = []
        destroy: list[NamespacePlan] = []
        unchanged: list[NamespacePlan] = []
        failures: list[NamespacePlan] = []
        groups = {CREATE: create, DESTROY: destroy, UNCHANGED: unchanged}
        for ns_plan in self.plans:
            (failures if ns_plan.errors else groups[ns_plan.action]).append(ns_plan)
        names = self.names
        nodes = [
            NodeChange(
                self.node_ids[pos],
                self.before[pos],
                self.disk[pos],
                indices,
                name=None if names is None else names[pos],
            )
            for pos, indices in enumerate(self.node_indices)
            if indices
        ]
        bounds = None
        if self.memory:
            by_id = {node.id: node for node in nodes}
            for pos, node_id in enumerate(self.node_ids):
                if node_id in by_id:
                    by_id[node_id].memory = NodeMemory(
                        self.budgets[pos], _finite(self.mem_before[pos]), _finite(self.mem[pos])
                    )
            num, den = self.factor
            largest = self.largest_repository
            bounds = {
                DISK: _bounds(self.before, self.disk, -(-largest * num // den)),
                MEMORY: _bounds(self.mem_before, self.mem, self._estimate(largest)),
            }
        return Plan(
            create=create,
            destroy=destroy,
            unchanged=unchanged,
            failures=failures,
            nodes=nodes,
            namespaces_in_order=self.plans,
            log=self.log,
            bounds=bounds,
            named=names is not None,
        )


def _finite(value: int | float) -> int | None:
    return None if value == _INF else int(value)


def _show(value: int | float) -> str:
    return "unlimited" if value == _INF else str(value)


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
        if have == _INF:
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


class _Exhausted:
    """One namespace plan's excluded positions, and their blocks in the search trees.

    A position is excluded when its node holds an index of the namespace: in
    the database, in a replica planned earlier in the run, or in the replica
    being planned (GitLab's newest planner; ``zoekt_indices`` is unique on
    enabled namespace and node). The trees are blocked lazily: ``add`` only
    records the position, and ``flush`` (called before every search) blocks
    what was added since, so the many namespaces that never search again
    after their first index cost no tree update at all.
    """

    __slots__ = ("_frozen", "blocked", "pending", "positions", "trees")

    def __init__(self, trees: list[_FirstFit]) -> None:
        self.trees = trees
        self.positions: set[int] = set()
        self.pending: list[int] = []
        self.blocked: list[int] = []
        self._frozen: frozenset[int] | None = frozenset()

    def __contains__(self, position: int) -> bool:
        return position in self.positions

    def add(self, position: int) -> None:
        if position not in self.positions:
            self.positions.add(position)
            self.pending.append(position)
            self._frozen = None

    def flush(self) -> None:
        """Block in the trees every position added since the last flush."""
        pending = self.pending
        if pending:
            for tree in self.trees:
                block = tree.block
                for position in pending:
                    block(position)
            self.blocked.extend(pending)
            pending.clear()

    def frozen(self) -> frozenset[int]:
        """Every excluded position, as an immutable set (shared while it does not change)."""
        if self._frozen is None:
            self._frozen = frozenset(self.positions)
        return self._frozen

    def release(self) -> None:
        """The namespace is planned: its excluded nodes are candidates again."""
        if self.positions:
            for tree in self.trees:
                unblock = tree.unblock
                for position in self.blocked:
                    unblock(position)
            self.positions.clear()
            self.pending.clear()
            self.blocked.clear()
            self._frozen = frozenset()
