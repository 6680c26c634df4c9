"""Re-splitting a hot index with moves: no reindex window, no dark minute.

A namespace placed by disk alone can sit whole on one node with most of the
fleet's webserver memory (the seed's 27× imbalance). Re-planning it the
GitLab way means destroying its replica and indexing it again: a
maintenance window. Here ``start_resplit`` re-plans **one index** of the
namespace's serving replica (its hottest, by memory estimate, unless one is
named) with the real planner, memory-aware, as if that index were not
there yet: its node takes part with the index's reservation and memory
estimate given back, and the nodes holding the namespace's other indices
are left out (one index per namespace and node). The plan's pieces of the
index's project range then become **carves**, one move each, one after the
other:

* the piece the plan put on the index's own node stays there (if the plan
  put none there, its first piece stays: the namespace has to keep a copy
  serving, and the rest of the plan still holds);
* every other piece is built on its planned node as the replacement of that
  part of the range (a build replica of its own, invisible to search), and
  at the swap, in one transaction, it joins the serving replica while the
  source index's range is narrowed to what it keeps and its repositories of
  the carved range are marked for deletion (GitLab's deletion pipeline takes
  them off the node). Search asks the source only for the range it keeps
  from that instant (``zoekt.search_targets``), so no project is lost or
  found twice.

Pieces above the kept one are carved from the top down, the ones below from
the bottom up, so the source's range stays one contiguous range at every
step. The queue of carves lives in the live move's ``details["resplit"]``;
the swap of one starts the next (a namespace has one live move at a time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from zoekt import app_settings, clock, memory
from zoekt.models import EnabledNamespace, Index, Move, Namespace, Node, Repository, in_range

RESPLIT = "resplit"


class ResplitError(ValueError):
    """The namespace cannot be re-split now; the message says why."""

    code = "resplit_refused"


# --------------------------------------------------------------------------- #
# Pure: the plan's pieces as carves
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Piece:
    """One index of the plan: its node and the range it covers (None: open end)."""

    node_id: int
    project_namespace_id_from: int | None
    project_namespace_id_to: int | None
    estimated_memory_bytes: int = 0


@dataclass(frozen=True)
class Carve:
    """One move of a re-split: the part of the source's range built on ``node_id``."""

    node_id: int
    project_namespace_id_from: int | None
    project_namespace_id_to: int | None
    #: ``top`` or ``bottom``: which end of the source's range it takes.
    end: str
    estimated_memory_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "project_namespace_id_from": self.project_namespace_id_from,
            "project_namespace_id_to": self.project_namespace_id_to,
            "end": self.end,
            "estimated_memory_bytes": self.estimated_memory_bytes,
        }

    @classmethod
    def of(cls, data: dict[str, Any]) -> Carve:
        return cls(**data)


def carves(
    low: int | None, high: int | None, source_node_id: int, pieces: list[Piece]
) -> tuple[list[Carve], int]:
    """The carves that turn the source's range ``low..high`` into ``pieces`` (in id
    order), and the position of the piece that stays on the source node.

    The pieces' ranges are made to tile ``low..high`` exactly: each piece runs
    from its start to the start of the next less one, the first from ``low``
    and the last to ``high``, so ids without a project yet have an owner too.
    """
    if len(pieces) < 2:
        return [], 0
    starts = [low] + [piece.project_namespace_id_from for piece in pieces[1:]]
    if any(start is None for start in starts[1:]):
        raise ResplitError("the plan's pieces do not have a start each")
    tiled = []
    for i, piece in enumerate(pieces):
        end = high if i == len(pieces) - 1 else starts[i + 1] - 1
        tiled.append((piece, starts[i], end))
    kept = next((i for i, p in enumerate(pieces) if p.node_id == source_node_id), 0)
    out = [
        Carve(p.node_id, lo, hi, "top", p.estimated_memory_bytes)
        for p, lo, hi in reversed(tiled[kept + 1 :])
    ]
    out += [
        Carve(p.node_id, lo, hi, "bottom", p.estimated_memory_bytes) for p, lo, hi in tiled[:kept]
    ]
    return out, kept


def narrowed(low: int | None, high: int | None, carve: Carve) -> tuple[int | None, int | None]:
    """The source's range once ``carve`` has left it."""
    if carve.end == "top":
        return low, carve.project_namespace_id_from - 1
    return carve.project_namespace_id_to + 1, high


# --------------------------------------------------------------------------- #
# The database edge: plan, start
# --------------------------------------------------------------------------- #


@dataclass
class ResplitPlan:
    namespace_id: int
    source_index_id: int
    source_node_id: int
    pieces: list[Piece] = field(default_factory=list)
    carves: list[Carve] = field(default_factory=list)
    kept: int = 0
    warnings: list[str] = field(default_factory=list)
    move_id: int | None = None
    #: The source index's range before the re-split (None: an open end).
    source_project_namespace_id_from: int | None = None
    source_project_namespace_id_to: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace_id": self.namespace_id,
            "source_index_id": self.source_index_id,
            "source_node_id": self.source_node_id,
            "source_project_namespace_id_from": self.source_project_namespace_id_from,
            "source_project_namespace_id_to": self.source_project_namespace_id_to,
            "pieces": [piece.__dict__ for piece in self.pieces],
            "kept_piece": self.kept,
            "carves": [carve.as_dict() for carve in self.carves],
            "warnings": self.warnings,
            "move_id": self.move_id,
        }


def plan_resplit(
    root_namespace_id: int,
    *,
    index_id: int | None = None,
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
) -> ResplitPlan:
    """Re-plan one index of the namespace memory-aware; read-only."""
    from planner.core import plan as run_planner
    from planner.loader import load_scenario
    from planner.scenario import parse_scenario
    from planner.selection import ResourcePool, SelectedNamespace, SelectedNode, SelectionService

    settings = settings or app_settings.current()
    now = now or clock.now()
    if settings.node_memory_budget_bytes is None:
        raise ResplitError(
            "memory planning is off (zoekt_node_memory_budget_bytes is unset): "
            "a re-split is planned memory-aware"
        )
    enabled = EnabledNamespace.objects.filter(root_namespace_id=root_namespace_id).first()
    if enabled is None:
        raise ResplitError(_not_enabled(root_namespace_id))
    if Move.objects.live().filter(zoekt_enabled_namespace=enabled).exists():
        raise ResplitError("the namespace has a live move already; try again when it ends")
    source = _source_index(enabled, index_id, settings.memory_ratio)
    pool_nodes = SelectionService(settings=settings, now=now).nodes()
    others = set(
        Index.objects.filter(zoekt_enabled_namespace=enabled)
        .exclude(id=source.id)
        .values_list("zoekt_node_id", flat=True)
    )
    nodes = [
        node for node in pool_nodes if node.id not in others and node.id != source.zoekt_node_id
    ]
    home = (
        Node.objects.for_search()
        .online(now)
        .not_in_shutdown(now)
        .with_unclaimed_storage_bytes()
        .filter(id=source.zoekt_node_id)
        .values_list("id", "annotated_unclaimed_storage_bytes", "metadata", "total_bytes")
        .first()
    )
    if home is None:
        raise ResplitError(
            f"the index's node {source.zoekt_node_id} is not online for search, or is "
            "restarting or being drained"
        )
    # The source's node takes part as if the index were not there: its reservation back.
    nodes.append(
        SelectedNode(
            home[0],
            int(home[1] or 0) + (source.reserved_storage_bytes or 0),
            home[2] or {},
            home[3],
        )
    )
    pool = ResourcePool(
        namespaces=(SelectedNamespace(enabled.id, enabled.root_namespace_id, 1, 0),),
        nodes=tuple(sorted(nodes, key=lambda n: (-n.unclaimed_storage_bytes, n.id))),
    )
    scenario = load_scenario(pool, settings=settings)
    namespace = scenario["namespaces"][0]
    low, high = _range(source)
    namespace["projects"] = [
        p for p in namespace["projects"] if in_range(p["project_namespace_id"], low, high)
    ]
    namespace["existing_replicas"] = []
    namespace["existing_node_ids"] = sorted(others)
    ratio = settings.memory_ratio
    own = memory.estimate_memory_bytes(
        sum(p["repository_size"] or 0 for p in namespace["projects"]), ratio
    )
    for node in scenario["nodes"]:
        if node["id"] == source.zoekt_node_id and "reserved_memory_bytes" in node:
            node["reserved_memory_bytes"] = max(0, node["reserved_memory_bytes"] - own)
    result = run_planner(parse_scenario(scenario), record_decisions=False)
    planned = result.create[0] if result.create else None
    out = ResplitPlan(
        enabled.root_namespace_id,
        source.id,
        source.zoekt_node_id,
        source_project_namespace_id_from=low,
        source_project_namespace_id_to=high,
    )
    if planned is None or not planned.replicas:
        failure = result.failures[0] if result.failures else None
        why = "; ".join(e.details for e in failure.errors) if failure else "no plan"
        raise ResplitError(f"the planner could not place the index's range: {why}")
    out.warnings = [f"{w.type}: {w.details}" for w in planned.warnings]
    out.pieces = [
        Piece(
            i.node_id,
            i.project_namespace_id_from,
            i.project_namespace_id_to,
            i.estimated_memory_bytes or 0,
        )
        for i in planned.replicas[0].indices
    ]
    out.carves, out.kept = carves(low, high, source.zoekt_node_id, out.pieces)
    if out.pieces and out.pieces[out.kept].node_id != source.zoekt_node_id:
        out.warnings.append(NO_PIECE_AT_HOME)
    return out


#: The plan's warning when it put no piece on the source index's node (``carves``).
NO_PIECE_AT_HOME = "the plan put no piece on the index's node; its first piece stays there"


def _not_enabled(root_namespace_id: int) -> str:
    """Why there is no enabled namespace of this id, in words the operator can act on:
    no such namespace, not a root, or a root not enabled."""
    found = Namespace.objects.filter(id=root_namespace_id).only("parent", "traversal_ids").first()
    if found is None:
        return "no namespace has this id, so none is enabled for Zoekt"
    if not found.is_root:
        return (
            f"it exists but is not a root namespace (its root is {found.root_id}, the id to give)"
        )
    return "it exists but is not enabled for Zoekt"


def create_carve(source: Index, queue: list[Carve], *, now: datetime) -> Move:
    """The planned move of ``queue[0]``; the rest of the queue rides in its details."""
    first, rest = queue[0], queue[1:]
    return Move.objects.create(
        **{**Move.fields_from_source(source, RESPLIT, now), "bytes": carved_bytes(source, first)},
        state=Move.State.PLANNED,
        project_namespace_id_from=first.project_namespace_id_from,
        project_namespace_id_to=first.project_namespace_id_to,
        details={
            "critical": False,
            "target_ceiling": 1.0,
            "carve": first.as_dict(),
            "resplit": {"remaining": [carve.as_dict() for carve in rest]},
        },
    )


def carved_bytes(source: Index, carve: Carve) -> int:
    """The used bytes of the source's repositories in the carve's range."""
    return sum(carved_repositories(source, carve).values_list("size_bytes", flat=True))


def carved_repositories(index: Index, carve: Carve):
    """The index's repositories whose project namespace lies in the carve's range."""
    rows = Repository.objects.filter(zoekt_index=index)
    if carve.project_namespace_id_from is not None:
        rows = rows.filter(project__project_namespace_id__gte=carve.project_namespace_id_from)
    if carve.project_namespace_id_to is not None:
        rows = rows.filter(project__project_namespace_id__lte=carve.project_namespace_id_to)
    return rows


def _source_index(enabled: EnabledNamespace, index_id: int | None, ratio: float) -> Index:
    indices = Index.objects.filter(
        zoekt_enabled_namespace=enabled, state=Index.State.READY, zoekt_replica__isnull=False
    )
    if index_id is not None:
        index = indices.filter(id=index_id).first()
        if index is None:
            raise ResplitError(f"index {index_id} is not a ready index of the namespace")
        return index
    rows = list(indices.order_by("id"))
    if not rows:
        raise ResplitError("the namespace has no ready index")
    sizes = memory.repository_bytes_by_index([index.id for index in rows])
    return max(rows, key=lambda i: (memory.estimate_memory_bytes(sizes.get(i.id, 0), ratio), -i.id))


def _range(index: Index) -> tuple[int | None, int | None]:
    metadata = index.metadata or {}
    return metadata.get("project_namespace_id_from"), metadata.get("project_namespace_id_to")
