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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.plan import (
    CREATE,
    DESTROY,
    INDEX_LIMIT_EXCEEDED,
    NODE_REUSED_IN_NAMESPACE,
    NODE_UNAVAILABLE,
    UNCHANGED,
    Decision,
    DecisionLog,
    NamespacePlan,
    NodeChange,
    Plan,
    PlanIssue,
    PlannedIndex,
    ReplicaPlan,
)
from planner.scenario import DISK, Namespace, Scenario, _factor_ratio, gc_paused, parse_scenario

_NEG = float("-inf")
_INF = float("inf")

NEW_INDEX = "new_index"
NO_NODE = "no_node"
EMPTY_REPLICA = "empty_replica"


def plan(scenario: Scenario, *, record_decisions: bool = True) -> Plan:
    """Plan every namespace of the scenario, in order, over the shared nodes."""
    with gc_paused():
        run = _Run(scenario, record_decisions=record_decisions)
        for namespace in scenario.namespaces:
            run.plan_namespace(namespace)
        return run.result()


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

    def find(self, need: int) -> int | None:
        tree = self.tree
        values = self.values
        size = self.size
        while True:
            if tree[1] < need:
                return None
            i = 1
            while i < size:
                i <<= 1
                if tree[i] < need:
                    i += 1
            position = i - size
            actual = values[position]
            if actual >= need:
                return position
            self._set(position, actual)


class _Run:
    """The shared node records of one planning run, and the namespace plans so far."""

    def __init__(self, scenario: Scenario, *, record_decisions: bool) -> None:
        self.node_ids = [node.id for node in scenario.nodes]
        #: Live unclaimed bytes per candidate position (the disk dimension).
        #: The node of a replica's open index is brought up to date lazily
        #: (``_write``) before anything reads it.
        self.disk = [node.unclaimed_storage_bytes for node in scenario.nodes]
        self.before = list(self.disk)
        self.node_indices: list[list[PlannedIndex]] = [[] for _ in self.node_ids]
        self.first_fit = _FirstFit(self.disk)
        self.exhausted = _Exhausted(self.first_fit)
        self.cap = scenario.options.max_indices_per_replica
        self.factor = _factor_ratio(scenario.options.buffer_factor)
        self.plans: list[NamespacePlan] = []
        self.log: DecisionLog | None = None
        self.decisions: list[Decision] = []
        self.disk_history: list[tuple[list[int], list[int]]] = []
        if record_decisions:
            self.disk_history = [([-1], [value]) for value in self.disk]
            self.log = DecisionLog(tuple(self.node_ids), self.decisions, {DISK: self.disk_history})

    def _write(self, position: int, value: int) -> None:
        """Set a node's unclaimed bytes, and log the change for explain."""
        if self.disk[position] != value:
            self.disk[position] = value
            if self.log is not None:
                sequences, values = self.disk_history[position]
                sequences.append(len(self.decisions))
                values.append(value)

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

        try:
            if namespace.projects:
                projects = [p for p in namespace.projects if p.repository_size is not None]
                pnids = [p.project_namespace_id for p in projects]
                pids = [p.project_id for p in projects]
                num, den = self.factor
                if den == 1:
                    sizes = [p.repository_size * num for p in projects]
                else:
                    sizes = [-(-p.repository_size * num // den) for p in projects]
                missing = desired - existing
                for replica_idx in range(missing):
                    self._simulate_replica(
                        ns_plan, replica_idx, pnids, pids, sizes, more=replica_idx < missing - 1
                    )
            else:
                for replica_idx in range(desired - existing):
                    self._empty_replica(ns_plan, replica_idx)
        finally:
            self.exhausted.release()
        if len(ns_plan.errors) > 1:
            # GitLab keeps the unique errors, first occurrence first.
            ns_plan.errors = list(dict.fromkeys(ns_plan.errors))

    # ------------------------------------------------------------------ #

    def _simulate_replica(
        self,
        ns_plan: NamespacePlan,
        replica_idx: int,
        pnids: list[int],
        pids: list[int],
        sizes: list[int],
        *,
        more: bool,
    ) -> None:
        """Plan one replica; ``more`` when another replica of the namespace follows."""
        disk = self.disk
        write = self._write
        find = self.first_fit.find
        exhausted = self.exhausted
        cap = self.cap
        namespace_id = ns_plan.namespace_id
        errors = ns_plan.errors
        indices: list[PlannedIndex] = []

        last: PlannedIndex | None = None
        last_pos = -1
        last_max: int | float = -1  # no last index: nothing fits it
        last_req = 0
        last_to = 0
        first_pos = -1
        gated = False  # the last index is not the first: its node is exhausted
        gate_ok: int | float = -1  # largest size known to pass the gate
        gate_fail: int | float = _INF  # smallest size known to fail it (or find nothing)

        for k in range(len(sizes)):
            size = sizes[k]
            if len(indices) >= cap:
                errors.append(
                    PlanIssue(
                        namespace_id,
                        replica_idx,
                        INDEX_LIMIT_EXCEEDED,
                        f"Replica reached maximum index limit ({cap})",
                    )
                )
                break

            if last_req + size <= last_max:
                # Fits the last index. GitLab still asks find_best_node first
                # and fails the project if no candidate has room (10.1, 10.3).
                if gated and size > gate_ok:
                    if size < gate_fail and find(size) is not None:
                        gate_ok = size
                    else:
                        if size < gate_fail:
                            gate_fail = size
                        write(last_pos, last_max - last_req)
                        self._unavailable(
                            ns_plan,
                            replica_idx,
                            len(indices),
                            pids[k],
                            pnids[k],
                            size,
                            fits_last_index_node_id=self.node_ids[last_pos],
                        )
                        continue
                last_req += size
                last_to = pnids[k]
                continue

            # A new index (or the replica's first) on the first-fit node.
            if last is not None:
                write(last_pos, last_max - last_req)
            position = find(size) if size < gate_fail else None
            if position is None:
                # Room only shrinks within a namespace plan: a bigger project
                # cannot pass where this one failed.
                if size < gate_fail:
                    gate_fail = size
                self._unavailable(ns_plan, replica_idx, len(indices), pids[k], pnids[k], size)
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
            max_bytes = disk[position]
            if last is None:
                index = PlannedIndex(
                    self.node_ids[position], namespace_id, None, None, 0, max_bytes
                )
                first_pos = position
            else:
                last.required_storage_bytes = last_req
                last.project_namespace_id_to = last_to
                index = PlannedIndex(
                    self.node_ids[position], namespace_id, last_to + 1, None, 0, max_bytes
                )
                if position == first_pos:
                    errors.append(
                        PlanIssue(
                            namespace_id,
                            replica_idx,
                            NODE_REUSED_IN_NAMESPACE,
                            f"Index {len(indices)} of replica {replica_idx} is planned on node "
                            f"{self.node_ids[position]}, which already holds index 0 of this "
                            "replica; provisioning would violate the unique "
                            "(enabled namespace, node) index",
                        )
                    )
                # GitLab exhausts the *new* node of a second-or-later index (10.1).
                exhausted.add(position)
                gated = True
            indices.append(index)
            self.node_indices[position].append(index)
            last = index
            last_pos = position
            last_max = max_bytes
            last_req = size
            last_to = pnids[k]
            # A node took bytes and maybe joined the exhausted set: what
            # passed the gate may no longer pass. (What failed still fails.)
            gate_ok = -1

        if last is not None:
            last.required_storage_bytes = last_req
            last.project_namespace_id_to = None
            write(last_pos, last_max - last_req)
            # The replica's nodes are exhausted for the namespace's later
            # replicas (the later indices' nodes already are). Nothing reads
            # the set after the last replica, so skip the bookkeeping then.
            if more:
                exhausted.add(first_pos)
        ns_plan.replicas.append(ReplicaPlan(indices))

    def _unavailable(
        self,
        ns_plan: NamespacePlan,
        replica_idx: int,
        index_idx: int,
        project_id: int,
        project_namespace_id: int,
        size: int,
        *,
        fits_last_index_node_id: int | None = None,
    ) -> None:
        ns_plan.errors.append(
            PlanIssue(
                ns_plan.namespace_id,
                replica_idx,
                NODE_UNAVAILABLE,
                f"No node can accommodate project {project_id} with size {size}",
            )
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
                    {DISK: size},
                    None,
                    self.exhausted.frozen(),
                    fits_last_index_node_id,
                )
            )

    def _empty_replica(self, ns_plan: NamespacePlan, replica_idx: int) -> None:
        """One index with no projects on the roomiest usable node (first on ties)."""
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
        self.node_indices[best].append(index)
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
        nodes = [
            NodeChange(self.node_ids[pos], self.before[pos], self.disk[pos], indices)
            for pos, indices in enumerate(self.node_indices)
            if indices
        ]
        return Plan(
            create=create,
            destroy=destroy,
            unchanged=unchanged,
            failures=failures,
            nodes=nodes,
            namespaces_in_order=self.plans,
            log=self.log,
        )


class _Exhausted:
    """One namespace plan's exhausted positions, mirrored as blocks in the first-fit tree."""

    __slots__ = ("_frozen", "first_fit", "positions")

    def __init__(self, first_fit: _FirstFit) -> None:
        self.first_fit = first_fit
        self.positions: set[int] = set()
        self._frozen: frozenset[int] | None = frozenset()

    def __contains__(self, position: int) -> bool:
        return position in self.positions

    def add(self, position: int) -> None:
        if position not in self.positions:
            self.positions.add(position)
            self.first_fit.block(position)
            self._frozen = None

    def frozen(self) -> frozenset[int]:
        if self._frozen is None:
            self._frozen = frozenset(self.positions)
        return self._frozen

    def release(self) -> None:
        """The namespace is planned: its exhausted nodes are candidates again."""
        if self.positions:
            for position in self.positions:
                self.first_fit.unblock(position)
            self.positions.clear()
            self._frozen = frozenset()
