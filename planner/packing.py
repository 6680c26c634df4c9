"""The packing strategies: how a planning run finds a node for a new index.

Each is a search over the candidates in candidate order (positions), fast
enough for a million projects over hundreds of nodes without changing a
single choice:

* ``FirstFit``: the leftmost candidate with room (GitLab's first fit), a
  max-tree whose entries may be stale-high, because unclaimed bytes only
  fall during a run;
* ``FitBoth``: first fit in disk and memory at once (one key per node, the
  largest repository size it can take);
* ``Roomiest`` and ``RoomiestBoth``: the ``balanced`` strategy, the
  candidate with the largest share of its capacity left (in both
  dimensions: the smaller share);
* ``Exhausted``: the positions one namespace's plan may no longer use, and
  their blocks in those trees;
* ``DiskFit``: what the replica simulation (``planner.core``) asks when a
  project does not join the replica's last index, by disk alone (GitLab's
  rule); ``planner.memory.MemoryFit`` answers the same questions with memory
  counted too.

Pure: no Django, clock or randomness.
"""

from __future__ import annotations

from typing import Any

from planner.filters import share_left
from planner.scenario import DISK

__all__ = [
    "INF",
    "NEG",
    "DiskFit",
    "Exhausted",
    "FirstFit",
    "FitBoth",
    "Roomiest",
    "RoomiestBoth",
]

NEG = float("-inf")
INF = float("inf")
#: No position excluded (one shared empty set).
_NONE_EXCLUDED: frozenset[int] = frozenset()


class FirstFit:
    """The leftmost candidate with at least ``need`` bytes, skipping blocked ones.

    A max-tree over candidate positions. ``values`` is the run's live list of
    unclaimed bytes (shared, not copied); the tree's leaves may be stale but
    never below the live value, because unclaimed bytes only fall. Blocked
    (exhausted) positions hold minus infinity.
    """

    __slots__ = ("plain", "size", "tree", "values")

    def __init__(self, values: list[int]) -> None:
        self.values = values
        #: The key is ``values`` itself (not computed by a subclass): the search
        #: reads it with the list's own lookup, no Python frame per candidate.
        self.plain = type(self).current is FirstFit.current
        size = 1
        while size < len(values):
            size *= 2
        self.size = size
        tree: list[float] = [NEG] * (2 * size)
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
        self._set(position, NEG)

    def unblock(self, position: int) -> None:
        self._set(position, self.values[position])

    def current(self, position: int) -> int:
        """The node's key now (the tree may hold a stale, higher one)."""
        return self.values[position]

    def find(self, need: int) -> int | None:
        tree = self.tree
        size = self.size
        current = self.values.__getitem__ if self.plain else self.current
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


class FitBoth(FirstFit):
    """The leftmost candidate with room for a project in *both* dimensions.

    A project of repository size ``r`` needs ``ceil(r × buffer_factor)``
    disk bytes and ``ceil(r × memory_ratio)`` memory bytes; a node with
    ``d`` unclaimed disk and ``m`` unclaimed memory fits it exactly when
    ``min(floor(d / buffer_factor), floor(m / memory_ratio)) >= r`` (the
    factors as exact fractions). That key is one number per node and only
    falls during a run, so the max-tree of ``FirstFit`` answers the
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
        if m == INF:
            return d
        m = m * self.md // self.mn
        return d if d <= m else m

    def unblock(self, position: int) -> None:
        self._set(position, self.key(position))

    current = key


class Roomiest(FirstFit):
    """The ``balanced`` strategy's search: among the candidates with room for
    ``need``, the one with the largest share of its capacity left (the least
    allocated, as Kubernetes' scheduler scores nodes); ties go to the earlier
    position, the candidate order. ``capacity`` is each node's disk size (for
    want of it, what it had unclaimed at the start of the run).

    A max-tree over that share. The share only falls during a run, so leaves
    may be stale-high exactly as in ``FirstFit``: the search descends towards
    the larger child (the left one on a tie); a leaf whose stored share is its
    live share is the true maximum; a stale one is brought down and the search
    starts again. The best-scored node may lack the room for ``need`` (a small
    node with a large share left): it is set aside for this search and the next
    best is looked at; the ones set aside are put back before returning.
    ``fit`` is the run's max-tree of room (``FirstFit`` or ``FitBoth``): its
    root says at once when no candidate has the room.
    """

    __slots__ = ("fit", "start")

    def __init__(self, fit: FirstFit, capacity: list[int]) -> None:
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
        while tree[1] != NEG:
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
            self._set(position, NEG)
        if aside is not None:
            for position in aside:
                self._set(position, current(position))
        return found


class RoomiestBoth(Roomiest):
    """``Roomiest`` in two dimensions: the share left is the smaller of the
    disk share and the memory share (unclaimed memory over the budget): the
    dominant resource decides. A node without a budget scores by disk alone.
    Room for ``need`` (repository bytes) is ``FitBoth``'s key."""

    __slots__ = ("mem", "mem_start")

    def __init__(self, fit: FitBoth, start: list[int], mem_start: list[int | float]) -> None:
        self.mem = fit.mem
        self.mem_start = mem_start
        super().__init__(fit, start)

    def score(self, position: int) -> float:
        """``planner.filters.node_score`` of the node (disk and memory)."""
        share = share_left(self.fit.disk[position], self.start[position])  # type: ignore[attr-defined]
        budget = self.mem_start[position]
        if budget == INF:
            return share
        memory_share = share_left(self.mem[position], budget)
        return share if share <= memory_share else memory_share

    current = score


class Exhausted:
    """One namespace plan's excluded positions, and their blocks in the search trees.

    A position is excluded when its node holds an index of the namespace: in
    the database, in a replica planned earlier in the run, or in the replica
    being planned (GitLab's newest planner; ``zoekt_indices`` is unique on
    enabled namespace and node). The trees are blocked lazily: ``add`` only
    records the position, and ``flush`` (called before every search) blocks
    what was added since, so the many namespaces that never search again
    after their first index cost no tree update at all.
    """

    __slots__ = ("blocked", "pending", "positions", "snapshot", "trees")

    def __init__(self, trees: list[FirstFit]) -> None:
        self.trees = trees
        self.positions: set[int] = set()
        self.pending: list[int] = []
        self.blocked: list[int] = []
        #: Every excluded position as a frozenset, or None until ``frozen`` builds it.
        self.snapshot: frozenset[int] | None = _NONE_EXCLUDED

    def __contains__(self, position: int) -> bool:
        return position in self.positions

    def add(self, position: int) -> None:
        if position not in self.positions:
            self.positions.add(position)
            self.pending.append(position)
            self.snapshot = None

    def discard(self, position: int) -> None:
        """The namespace may use ``position`` again (the zone rule lifting an
        exclusion of its own; never a node that holds an index of the namespace)."""
        if position in self.positions:
            self.positions.discard(position)
            self.snapshot = None
            if position in self.pending:
                self.pending.remove(position)
            else:
                self.blocked.remove(position)
                for tree in self.trees:
                    tree.unblock(position)

    def flush(self) -> None:
        """Block in the trees every position added since the last flush."""
        pending = self.pending
        if pending:
            self._each_tree("block", pending)
            self.blocked.extend(pending)
            pending.clear()

    def _each_tree(self, change: str, positions: list[int]) -> None:
        """``block`` or ``unblock`` each of ``positions`` in every tree."""
        for tree in self.trees:
            apply = getattr(tree, change)
            for position in positions:
                apply(position)

    def frozen(self) -> frozenset[int]:
        """Every excluded position, as an immutable set (shared while it does not change)."""
        if self.snapshot is None:
            self.snapshot = frozenset(self.positions)
        return self.snapshot

    def release(self) -> None:
        """The namespace is planned: its excluded nodes are candidates again."""
        if self.positions:
            if self.blocked:
                self._each_tree("unblock", self.blocked)
                self.blocked.clear()
            self.positions.clear()
            self.pending.clear()
            self.snapshot = _NONE_EXCLUDED


class DiskFit:
    """How one replica's projects are fitted to nodes by disk alone (GitLab's rule).

    The replica simulation (``planner.core``) is one loop whatever the run
    counts; a project that joins the replica's last index needs nothing from
    here. When one does not, the loop asks its fit:

    * ``choose``: the node of a new index: the run's pick (first fit, or the
      roomiest for ``balanced``) among the candidates the namespace may still
      use. A size that found no node fails for the rest of the replica:
      within a namespace's plan room only shrinks and exclusions only grow.
    * ``close``: the index ends with its projects' scaled bytes, taken from
      its node's unclaimed storage.
    * ``limits``: what an index opened on a node may hold: its
      max_storage_bytes, and no memory limit.
    * ``demand`` and ``cause``: what a decision record says was asked for.
    * ``finish``: after the replica; what memory would track (nothing here).
      It also readies the fit for the next replica.

    ``planner.memory.MemoryFit`` answers the same questions with memory too.
    ``run`` is the planning run (``planner.core._Run``).
    """

    __slots__ = ("run", "search_fail", "shown", "skipped")

    #: Memory-aware choices (never, by disk alone).
    aware = False
    #: Memory counted (``limits`` asked; by disk alone an index holds its max).
    memory = False
    #: A new index's estimated memory (none counted).
    zero: int | None = None
    #: The replica's memory warnings (none by disk alone).
    notes: dict[str, list] | None = None

    def __init__(self, run: Any) -> None:
        self.run = run
        #: The smallest size the disk search could not place in this replica.
        self.search_fail: int | float = INF
        #: The projects (positions) no node could take in this replica.
        self.skipped: list[int] | None = None
        #: Per candidate position, the max_memory_bytes an index there shows.
        self.shown: list[int | None] = [None] * len(run.node_ids)

    def choose(
        self, ns_plan: Any, replica_idx: int, index_idx: int, data: tuple, k: int
    ) -> tuple[int | None, str | None]:
        """The node of the index project ``k`` opens, and no warning; ``None``: no
        node (a ``node_unavailable`` error is recorded and the project skipped)."""
        size = data[2][k]
        run = self.run
        if run.exhausted.pending:
            run.exhausted.flush()
        position = run.pick(size) if size < self.search_fail else None
        if position is None:
            if size < self.search_fail:
                self.search_fail = size
            run._unavailable(ns_plan, replica_idx, index_idx, data[1][k], data[0][k], size)
            self.refuse(k)
        return position, None

    def refuse(self, k: int) -> None:
        if self.skipped is None:
            self.skipped = []
        self.skipped.append(k)

    def demand(self, data: tuple, k: int) -> dict[str, int]:
        return {DISK: data[2][k]}

    def cause(self, bound: str | None, last: Any, need: int, last_open: int) -> str | None:
        return None

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
        """The index holds ``required`` scaled bytes up to ``to``; its node gives them."""
        index.required_storage_bytes = required
        index.project_namespace_id_to = to
        run = self.run
        if run.undo is None and run.log is None:
            # Nothing to log or roll back: the write alone (most namespaces).
            run.disk[position] = opened - required
        else:
            run._write(position, opened - required)

    def limits(self, position: int, max_bytes: int) -> tuple[int | float, int | float, int]:
        """A new index's (scaled-bytes limit, repository-bytes limit, unclaimed memory)."""
        return max_bytes, INF, 0

    def finish(self, ns_plan: Any, replica_idx: int, data: tuple, stop: int) -> int:
        """The replica is planned; the largest repository size placed (-1: not tracked)."""
        self.search_fail = INF
        self.skipped = None
        return -1
