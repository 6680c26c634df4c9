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
* Unclaimed bytes only ever fall during a run, so the node searches
  (``planner.packing``) are max-trees over the candidate order whose entries
  may be *stale-high* (upper bounds): nodes that could not fit the request
  before are never looked at one by one.
* Within a replica, a size the search could not place fails for good (room
  only shrinks and exclusions only grow), so it is not searched again.
* With a whole buffer factor, a namespace's scaled sizes
  are computed only past its first project when its first index cannot take
  it whole (the total is its repository bytes times the factor).

One replica simulation (``_Run._simulate_replica``) serves every run: a
project that joins the replica's last index costs what it does in GitLab's
loop, and whatever happens when one does not is asked of the replica's
*fit*: ``planner.packing.DiskFit`` (GitLab's disk rule) or, with the memory
dimension on, ``planner.memory.MemoryFit``.

The memory dimension (docs/planner.md, "Memory"; ``planner.memory``) is on
when any node has a memory budget. Then every decision starts from GitLab's
disk decision and memory only overrides it where memory binds. If the
memory-aware attempt of a namespace fails, it is rolled back and the
namespace is planned by the disk rule alone. With memory off the plan has
no memory keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.filters import storage_capacity
from planner.memory import MemoryDimension
from planner.packing import INF, NEG, DiskFit, Exhausted, FirstFit, Roomiest
from planner.plan import (
    CREATE,
    DESTROY,
    DISK_CEILING_ABANDONED,
    EMPTY_REPLICA,
    INDEX_LIMIT_EXCEEDED,
    MEMORY_OVERFLOW,
    MEMORY_PLACEMENT_ABANDONED,
    NEW_INDEX,
    NO_NODE,
    NODE_UNAVAILABLE,
    UNCHANGED,
    ZONE_SHARED,
    ZONE_SPREAD_ABANDONED,
    Decision,
    DecisionLog,
    NamespacePlan,
    NodeChange,
    Plan,
    PlanIssue,
    PlannedIndex,
    ReplicaPlan,
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

#: A decision record built from its fields' tuple, as ``Decision(...)`` builds it
#: but without the named tuple's Python-level constructor (once per new index).
_decision = tuple.__new__

__all__ = [
    "CONCURRENCY_FACTOR",
    "EMPTY_REPLICA",
    "MEMORY_OVERFLOW",
    "NEW_INDEX",
    "NO_NODE",
    "plan",
    "plan_dict",
]


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
        result = run.result()
        # The fits point back at the run: without this cycle the run's arrays
        # (and decision records) are freed as plan() returns, not at the next collection.
        run.fits = ()
        return result


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


class _Run(MemoryDimension):
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
        self._init_strategy(scenario)
        self.cap = scenario.options.max_indices_per_replica
        self.factor = _factor_ratio(scenario.options.buffer_factor)
        self._init_disk_ceilings(scenario)
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
        #: The replica simulation's fits: (disk-only decisions, memory-aware).
        self.fits: tuple[DiskFit, DiskFit] = (DiskFit(self), DiskFit(self))
        if self.memory:
            self._init_memory(scenario, memory_aware)
        self.exhausted = Exhausted(self.trees)
        self._init_zones(scenario)

    def _init_zones(self, scenario: Scenario) -> None:
        """The zone rule's records (docs/planner.md, "Zones"), only when some node has
        a zone: ``zones`` stays ``None`` otherwise, and nothing else of the run reads
        zones (the plan is then GitLab's, byte for byte)."""
        self.zones: list[str | None] | None = None
        #: Whether the namespace being planned keeps its replicas in distinct zones.
        self.zoning = False
        self.zone_positions: dict[str, list[int]] = {}
        self.namespace_zones: tuple[str, ...] = ()
        #: The positions the zone rule excluded for the namespace being planned.
        self.zone_blocked: list[int] = []
        if any(node.zone is not None for node in scenario.nodes):
            self.zones = [node.zone for node in scenario.nodes]
            for position, zone in enumerate(self.zones):
                if zone is not None:
                    self.zone_positions.setdefault(zone, []).append(position)

    def _init_strategy(self, scenario: Scenario) -> None:
        """The node search: ``first_fit``, the first candidate with room (GitLab's);
        ``balanced``, the candidate with the largest share of its room left,
        re-scored as the run consumes it (``Roomiest``)."""
        self.first_fit = FirstFit(self.disk)
        self.balanced = scenario.options.strategy == BALANCED
        self.roomiest: Roomiest | None = None
        if self.balanced:
            #: What a node's room is scored against: its disk size (never below
            #: what it has unclaimed), or for want of it the unclaimed.
            self.capacity = [
                storage_capacity(node.total_bytes, value)
                for node, value in zip(scenario.nodes, self.disk, strict=True)
            ]
            self.roomiest = Roomiest(self.first_fit, self.capacity)
            self.pick = self.roomiest.best
        else:
            self.pick = self.first_fit.find
        #: The trees searched for a node: a namespace's exclusions block them. (In
        #: balanced runs the room trees are only asked for an upper bound, which
        #: holds unblocked.) ``all_trees``: every tree, refreshed after a rollback.
        self.trees: list[FirstFit] = [self.roomiest or self.first_fit]
        self.all_trees: list[FirstFit] = [self.first_fit]
        if self.roomiest is not None:
            self.all_trees.append(self.roomiest)

    def _init_disk_ceilings(self, scenario: Scenario) -> None:
        """``max_index_storage_fraction``: each node's largest max_storage_bytes
        of a new index (a share of its unclaimed storage at the start of the
        run), or ``None``: GitLab's rule, whatever the node has left."""
        self.disk_ceilings: list[int] | None = None
        self.smallest_disk_ceiling = 0
        fraction = scenario.options.max_index_storage_fraction
        if fraction is not None:
            num, den = _factor_ratio(fraction)
            self.disk_ceilings = [max(value, 0) * num // den for value in self.disk]
            self.smallest_disk_ceiling = min(self.disk_ceilings, default=0)

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

    def _record(
        self,
        kind: str,
        ns_plan: NamespacePlan,
        replica_idx: int | None,
        index_idx: int | None,
        pid: int | None,
        pnid: int | None,
        demand: dict[str, int],
        position: int | None,
        cause: str | None = None,
        warning: str | None = None,
    ) -> None:
        """A decision record (only when recording). ``_simulate_replica`` appends its
        new-index records itself: once per index, the hottest record path."""
        self.decisions.append(
            Decision(
                kind,
                ns_plan.namespace_id,
                replica_idx,
                index_idx,
                pid,
                pnid,
                demand,
                position,
                self.exhausted.frozen(),
                cause,
                warning,
            )
        )

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
        if namespace.existing_node_ids:
            self._exclude_existing(namespace)
        if self.zones is not None:
            self._start_zoning(namespace, desired - existing)
        if namespace.has_projects:
            self._plan_projects(ns_plan, namespace, desired - existing)
        else:
            try:
                for replica_idx in range(desired - existing):
                    if self.zoning:
                        self._avoid_zones(ns_plan, replica_idx)
                    self._empty_replica(ns_plan, replica_idx)
            finally:
                self.exhausted.release()
        self.zoning = False
        if len(ns_plan.errors) > 1:
            # GitLab keeps the unique errors, first occurrence first.
            ns_plan.errors = list(dict.fromkeys(ns_plan.errors))

    def _start_zoning(self, namespace: Namespace, missing: int) -> None:
        """Whether the zone rule applies to the namespace: it has replicas to place
        and more than one replica in all, or an existing copy in a zone."""
        zones = self.zones
        assert zones is not None
        existing = list(namespace.existing_zones)
        for node_id in namespace.existing_node_ids:
            position = self.position_of.get(node_id)
            if position is not None and zones[position] is not None:
                existing.append(zones[position])  # type: ignore[arg-type]
        self.namespace_zones = tuple(dict.fromkeys(existing))
        self.zoning = missing > 1 or (missing == 1 and bool(self.namespace_zones))

    def _zones_taken(self, ns_plan: NamespacePlan) -> list[str]:
        """The zones the namespace's other replicas occupy: those of its existing
        copies and those of the replicas planned so far in this run."""
        zones = self.zones
        assert zones is not None
        taken = dict.fromkeys(self.namespace_zones)
        position_of = self.position_of
        for replica in ns_plan.replicas:
            for index in replica.indices:
                zone = zones[position_of[index.node_id]]
                if zone is not None:
                    taken[zone] = None
        return list(taken)

    def _avoid_zones(self, ns_plan: NamespacePlan, replica_idx: int) -> None:
        """Before a replica: exclude, for the rest of the namespace's plan, every node
        in a zone another replica of the namespace occupies, when some node the
        namespace may still use lies outside them (a node without a zone always
        does). When none does, the replica shares a zone: a warning, never an error.
        Zones only accumulate within a namespace, so an exclusion never has to be
        lifted before the namespace is planned."""
        if replica_idx == 0:
            self.zone_blocked = []
        taken = self._zones_taken(ns_plan)
        if not taken:
            return
        avoid = [position for zone in taken for position in self.zone_positions.get(zone, ())]
        exhausted = self.exhausted
        blocked = set(avoid)
        if all(p in blocked or p in exhausted for p in range(len(self.node_ids))):
            # The nodes kept from earlier replicas' zones are usable again: this
            # replica shares a zone whichever it takes.
            for position in self.zone_blocked:
                exhausted.discard(position)
            self.zone_blocked = []
            if self.log is not None:
                self.log.zone_excluded.pop((ns_plan.namespace_id, replica_idx), None)
            ns_plan.warnings.append(
                PlanIssue(
                    ns_plan.namespace_id,
                    replica_idx,
                    ZONE_SHARED,
                    f"Every node the replica could use is in a zone another replica of the "
                    f"namespace occupies ({', '.join(sorted(taken))}): the replica is placed "
                    "anyway and shares a zone",
                )
            )
            return
        for position in avoid:
            if position not in exhausted:
                exhausted.add(position)
                self.zone_blocked.append(position)
        if self.log is not None and self.zone_blocked:
            key = (ns_plan.namespace_id, replica_idx)
            self.log.zone_excluded[key] = frozenset(self.zone_blocked)

    def _exclude_existing(self, namespace: Namespace) -> None:
        """One index per namespace and node: the nodes that hold an index of
        the namespace already are excluded from every search of its plan."""
        exhausted = self.exhausted
        position_of = self.position_of
        for node_id in namespace.existing_node_ids:
            position = position_of.get(node_id)
            if position is not None:
                exhausted.add(position)

    def _plan_projects(self, ns_plan: NamespacePlan, namespace: Namespace, missing: int) -> None:
        """Plan the missing replicas of a namespace with projects.

        With memory on, the memory-aware attempt runs first. If it ends with an
        error, it is rolled back (nodes, decision records) and the namespace is
        planned by the disk rule alone, the plan GitLab would make from this
        state: memory never makes a namespace fail (seed 1d). The disk-only
        plan keeps its verdict; if it succeeds, memory did make the difference
        and it carries a ``memory_placement_abandoned`` warning. With a disk
        ceiling per index that applies to the namespace, the disk-rule attempt
        keeps the ceiling, and if that fails too the namespace is planned once
        more without it (``disk_ceiling_abandoned`` when that succeeds).
        """
        # ``data``, the projects as the replica simulation reads them: (pnids, pids,
        # scaled sizes, the repository sizes summed beside them or None, the total
        # scaled bytes, the repository sizes).
        pnids, pids, repository_sizes = namespace.columns
        num, den = self.factor
        if den == 1:
            # Scaled only as far as the simulation reads (``_scale_rest``): most
            # namespaces fit their first index whole.
            if num == 1 or not repository_sizes:
                sizes = repository_sizes
            else:
                sizes = [repository_sizes[0] * num]
            total = namespace.repository_bytes * num
            data = (pnids, pids, sizes, None, total, repository_sizes)
        else:
            sizes = [-(-r * num // den) for r in repository_sizes]
            # Memory counts repository bytes beside the scaled ones (``_simulate_replica``).
            rsizes = repository_sizes if self.memory else None
            total = INF if self.memory else sum(sizes)
            data = (pnids, pids, sizes, rsizes, total, repository_sizes)
        aware = self.memory and self.aware
        # (The sum is only needed with a fractional buffer factor and a ceiling.)
        bind = self.disk_ceilings is not None and self._ceiling_may_bind(
            data[4] if data[3] is None else sum(data[2])
        )
        ceilings = self.disk_ceilings if bind else None
        zoned = self.zoning
        if aware or bind or zoned:
            self._begin_attempt()
        fit = self.fits[aware]
        if missing == 1:
            # One replica (most namespaces): ``_simulate_replicas`` without its loop.
            try:
                if zoned:
                    self._avoid_zones(ns_plan, 0)
                stop = self._simulate_replica(ns_plan, 0, data, fit, ceilings)
                # ``finish`` has nothing to do (most replicas): no refusal, note or cap.
                if fit.skipped is None and fit.notes is None and stop == len(data[0]):
                    largest = -1
                else:
                    largest = fit.finish(ns_plan, 0, data, stop)
            finally:
                self.exhausted.release()
        else:
            largest = self._simulate_replicas(ns_plan, data, missing, fit, ceilings)
        if ns_plan.errors and (aware or ceilings is not None or zoned):
            largest = self._plan_again(ns_plan, namespace, data, missing, aware, ceilings)
        self.undo = None
        if self.memory:
            self._note_largest(largest, data)

    def _plan_again(
        self,
        ns_plan: NamespacePlan,
        namespace: Namespace,
        data: tuple,
        missing: int,
        aware: bool,
        ceilings: list[int] | None,
    ) -> int:
        """The failed attempt tried again one rule less at a time: memory never
        makes a namespace fail where the disk rules place it, nor the disk
        ceiling where GitLab's rule does. Returns the largest size placed."""
        largest = -1
        given_up: list[PlanIssue] = []
        if aware and ns_plan.errors:
            error = self._abandon_attempt(ns_plan, namespace)
            largest = self._simulate_replicas(ns_plan, data, missing, self.fits[False], ceilings)
            given_up.append(self._abandoned_warning(ns_plan, error, True))
        if ceilings is not None and ns_plan.errors:
            error = self._abandon_attempt(ns_plan, namespace)
            largest = self._simulate_replicas(ns_plan, data, missing, self.fits[False], None)
            given_up.append(self._abandoned_warning(ns_plan, error, False))
        if self.zoning and ns_plan.errors:
            # The last rule given up: replicas in distinct zones.
            error = self._abandon_attempt(ns_plan, namespace)
            self.zoning = False
            if self.log is not None:
                for replica_idx in range(missing):
                    self.log.zone_excluded.pop((ns_plan.namespace_id, replica_idx), None)
            largest = self._simulate_replicas(ns_plan, data, missing, self.fits[False], None)
            given_up.append(self._zones_abandoned(ns_plan, error))
        if given_up and not ns_plan.errors:
            ns_plan.warnings.extend(given_up)
        return largest

    def _simulate_replicas(
        self,
        ns_plan: NamespacePlan,
        data: tuple,
        missing: int,
        fit: DiskFit,
        ceilings: list[int] | None = None,
    ) -> int:
        """Every missing replica; the largest repository size placed (-1: all
        were, or memory is off)."""
        simulate = self._simulate_replica
        try:
            largest = 0
            zoning = self.zoning
            for replica_idx in range(missing):
                if zoning:
                    self._avoid_zones(ns_plan, replica_idx)
                stop = simulate(ns_plan, replica_idx, data, fit, ceilings)
                biggest = fit.finish(ns_plan, replica_idx, data, stop)
                if biggest < 0 or largest < 0:
                    largest = -1
                elif biggest > largest:
                    largest = biggest
            return largest
        finally:
            self.exhausted.release()

    def _simulate_replica(
        self,
        ns_plan: NamespacePlan,
        replica_idx: int,
        data: tuple,
        fit: DiskFit,
        ceilings: list[int] | None = None,
    ) -> int:
        """Plan one replica of ``data`` (``_plan_projects``); returns how many
        projects it went through (fewer than all: the index cap stopped it).
        GitLab's newest planner: before each project the index cap is checked;
        a project that fits the replica's last index joins it with no node
        search; otherwise a new index opens on the node ``fit`` chooses,
        excluded at once. ``ceilings``: ``max_index_storage_fraction``. With
        memory (``MemoryFit``) an index may hold less than its
        max_storage_bytes, and a project that fits it on disk but not in
        memory is the fit's to decide."""
        pnids, _, sizes, rsizes, total, _ = data
        nonlinear, memory, cap = rsizes is not None, fit.memory, self.cap
        indices: list[PlannedIndex] = []
        stop = len(pnids)
        # The last index: node, max_storage_bytes, limits, its node's room when it opened, fill.
        last: PlannedIndex | None = None
        last_pos = last_max = last_lim = -1
        last_rlim: int | float = INF
        last_open = last_mopen = last_req = last_to = last_r = opened = 0
        for k in range(stop):
            size = sizes[k]
            if opened >= cap:
                self._index_limit(ns_plan, replica_idx)
                stop = k
                break
            if last_req + size > last_lim or (nonlinear and last_r + rsizes[k] > last_rlim):
                position, bound, warning = -1, None, None
                if last_req + size <= last_max:
                    # Fits the last index on disk but not in memory (memory-aware only).
                    last_index = (last, last_pos, last_open, last_req, last_to, last_r, last_mopen)
                    position, bound, last_lim, last_rlim = fit.bound(
                        ns_plan, replica_idx, data, k, last_index, last_max, opened
                    )
                if position >= 0 or last_req + size > last_max:
                    # A new index: the replica's first, a rollover, or a memory rollover.
                    if last is not None:
                        fit.close(last, last_pos, last_open, last_req, last_to, last_r, last_mopen)
                    if position < 0:
                        position, warning = fit.choose(ns_plan, replica_idx, opened, data, k)
                        if position is None:
                            if k == 0:
                                self._scale_rest(data)
                            continue
                    if self.log is not None:
                        cause = memory and fit.cause(bound, last, last_req + size, last_open)
                        self.decisions.append(_decision(Decision, (NEW_INDEX,
                            ns_plan.namespace_id, replica_idx, opened, data[1][k], data[0][k],
                            fit.demand(data, k), position, self.exhausted.frozen(),
                            cause or None, warning)))  # fmt: skip
                    last_open = self.disk[position]
                    start = None if last is None else last_to + 1
                    last = self._open_index(ns_plan, indices, position, start, size, fit, ceilings)
                    last_pos, last_max, opened = position, last.max_storage_bytes, opened + 1
                    if memory:
                        last_lim, last_rlim, last_mopen = fit.limits(position, last_max)
                    else:
                        last_lim = last_max
                    if k == 0:
                        if cap > 1 and total <= last_lim:
                            # Everything fits the first index: all join it, as one by one.
                            last_req, last_to = total, pnids[-1]
                            break
                        self._scale_rest(data)
                    last_req = last_r = 0
            # Joins the last index (the fit test comes before any node search).
            last_req += size
            last_to = pnids[k]
            if nonlinear:
                last_r += rsizes[k]
        if last is not None:
            fit.close(last, last_pos, last_open, last_req, None, last_r, last_mopen)
        ns_plan.replicas.append(ReplicaPlan(indices))
        return stop

    def _scale_rest(self, data: tuple) -> None:
        """Every scaled size of ``data``, in place, when only the first is there yet
        (``_plan_projects`` scales the first only, for the disk rule): the replica
        goes past its first project."""
        sizes = data[2]
        if len(sizes) < len(data[5]):
            num = self.factor[0]
            sizes[:] = [r * num for r in data[5]]

    def _index_limit(self, ns_plan: NamespacePlan, replica_idx: int) -> None:
        """The replica reached the index cap: GitLab's error, the rest of it unplanned."""
        ns_plan.errors.append(
            PlanIssue(
                ns_plan.namespace_id,
                replica_idx,
                INDEX_LIMIT_EXCEEDED,
                f"Replica reached maximum index limit ({self.cap})",
            )
        )

    def _open_index(
        self,
        ns_plan: NamespacePlan,
        indices: list[PlannedIndex],
        position: int,
        start: int | None,
        size: int,
        fit: DiskFit,
        ceilings: list[int] | None,
    ) -> PlannedIndex:
        """A new index of the replica (``indices``) on the node at ``position``,
        its range starting at ``start``, opened by a project of ``size`` scaled
        bytes; the node is excluded for the namespace.

        Its max_storage_bytes is what the node has unclaimed, or with
        ``ceilings`` at most the node's ceiling, never below ``size``.
        """
        max_bytes = self.disk[position]
        if ceilings is not None and ceilings[position] < max_bytes:
            max_bytes = ceilings[position] if ceilings[position] >= size else size
        index = PlannedIndex(
            self.node_ids[position],
            ns_plan.namespace_id,
            start,
            None,
            0,
            max_bytes,
            fit.zero,
            fit.shown[position],
        )
        if self.names is not None:
            index.node_name = self.names[position]
        # One index per namespace and node, from the first index on: ``Exhausted.add``
        # written out (once per index), the position new to it (a search never
        # returns an excluded one).
        exhausted = self.exhausted
        exhausted.positions.add(position)
        exhausted.pending.append(position)
        exhausted.snapshot = None
        indices.append(index)
        self.node_indices[position].append(index)
        return index

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

    def _zones_abandoned(self, ns_plan: NamespacePlan, error: PlanIssue) -> PlanIssue:
        """The warning of a namespace planned without the zone rule, after the
        placement in distinct zones failed (the other zones lack the room)."""
        return PlanIssue(
            ns_plan.namespace_id,
            None,
            ZONE_SPREAD_ABANDONED,
            f"The placement of the replicas in distinct zones would have failed "
            f"({error.type} in replica {error.replica_idx}: {error.details}); the namespace "
            "is planned without the zone rule, so replicas may share a zone",
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
        if max(self.disk, default=NEG) >= size:
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
            self._record(
                NO_NODE,
                ns_plan,
                replica_idx,
                index_idx,
                project_id,
                project_namespace_id,
                {DISK: size} if memory is None else {DISK: size, MEMORY: memory},
                None,
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
            self._record(
                EMPTY_REPLICA,
                ns_plan,
                replica_idx,
                0 if best >= 0 else None,
                None,
                None,
                {DISK: 0},
                best if best >= 0 else None,
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
            index.max_memory_bytes = None if ceiling == INF else ceiling
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
        bounds = self._memory_result(nodes) if self.memory else None
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
