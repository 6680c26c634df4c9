"""Where a search of one root namespace fans out to, or why it cannot.

Search routes by **coverage**, not by replica state. A namespace is
searchable while its ready indices on searchable nodes
(``Node.objects.searchable``: online, for_search, and healthy by
``zoekt.search_health``) cover every project: every project-namespace id,
from the lowest to the highest, falls in the range
(``project_namespace_id_from`` .. ``_to``, open ends unbounded) of one of
them. The answer names, for each part of the id space, exactly one such
index, and the range it is asked for, so no project is searched twice and
a node that still holds repositories being moved away is asked only for
the range it still serves. A live move's replacement, built in a replica of
its own, is never a target until its swap.

Which indices, of several that could serve (``cover``):

1. the lowest-id replica whose ready indices on searchable nodes cover
   everything by themselves: in a healthy fleet, exactly GitLab's choice of
   one replica, stable between calls;
2. else a cover drawn from every replica: at each point, the index that
   reaches furthest, ties to the lower (replica, node, index) id. A
   namespace whose replicas each lost a different node stays searchable.

A node an operator is restarting, within its allowed delay
(``Node.objects.in_restart``, docs/operations.md), is about to go away or has
just come back: the cover is first sought without it (the two rules above,
on the other nodes); only where nothing else covers a range is it asked, for
just that stretch (``cover_avoiding``), and only while it is searchable as
any node must be.

The replica's state is not asked: GitLab turns a whole replica ``pending``
as soon as one index is not ready (``ReplicaStateService``), which is why a
change inside a replica would take the namespace dark there. Replica states
keep GitLab's meaning for everything else.

Each target is one node with the one index of the namespace it holds (an
enabled namespace has at most one index per node); targets in node id
order. When there is none the answer says why, with a code from
``zoekt.reasons``, checked in this order:

``namespace_not_enabled``  no enabled namespace has this root namespace id
``search_disabled``        the enabled namespace has ``search = false``
``no_ready_replica``       its ready indices do not cover every project
``no_searchable_replica``  they do, but not those on searchable nodes

It costs the same four queries whatever the number of replicas, indices or
nodes: the enabled namespace, the ready indices with their nodes, and the
two of ``searchable`` (which also says which of them are being restarted).
``search_targets_many`` answers for many namespaces in those same four
queries (a namespace with no ready index needs fewer); ``search_targets`` is
it for one. ``dark_namespaces`` names, by reason, the namespaces with search
on that have no target, over the whole fleet in four queries of the same
kind: the figure ``/metrics`` exports and the fleet page shows
(docs/dashboard.md). Both decide through ``_cover`` on the same rows, so
they cannot disagree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from zoekt import clock
from zoekt.models import EnabledNamespace, Index, Move, Node
from zoekt.reasons import Reason

#: The open ends of a range, as numbers the cover can compare.
LOWEST = -(2**63)
HIGHEST = 2**63


@dataclasses.dataclass(frozen=True)
class Span:
    """A ready index as the cover sees it: which replica and node, and its range."""

    index_id: int
    replica_id: int
    node_id: int
    project_namespace_id_from: int | None = None
    project_namespace_id_to: int | None = None

    @property
    def low(self) -> int:
        lo = self.project_namespace_id_from
        return LOWEST if lo is None else int(lo)

    @property
    def high(self) -> int:
        hi = self.project_namespace_id_to
        return HIGHEST if hi is None else int(hi)

    @classmethod
    def of(cls, index: Index) -> Span:
        return cls.from_row(index.id, index.zoekt_replica_id, index.zoekt_node_id, index.metadata)

    @classmethod
    def from_row(cls, index_id: int, replica_id: int, node_id: int, metadata: dict | None) -> Span:
        metadata = metadata or {}
        return cls(
            index_id=index_id,
            replica_id=replica_id,
            node_id=node_id,
            project_namespace_id_from=metadata.get("project_namespace_id_from"),
            project_namespace_id_to=metadata.get("project_namespace_id_to"),
        )


@dataclasses.dataclass(frozen=True)
class Served:
    """One index of a cover and the part of its range it is asked for."""

    span: Span
    project_namespace_id_from: int | None
    project_namespace_id_to: int | None


def cover(spans: Sequence[Span]) -> list[Served] | None:
    """Exactly one span for every id, or None when some id has none (pure).

    The lowest-id replica that covers everything alone wins; else every
    replica's spans are drawn on (see the module's docstring)."""
    by_replica: dict[int, list[Span]] = {}
    for span in spans:
        by_replica.setdefault(span.replica_id, []).append(span)
    for replica_id in sorted(by_replica):
        pieces = _reach(by_replica[replica_id])
        if pieces is not None:
            return pieces
    return _reach(spans) if len(by_replica) > 1 else None


def cover_avoiding(spans: Sequence[Span], avoid: set[int]) -> list[Served] | None:
    """``cover``, asking the nodes in ``avoid`` only where nothing else covers (pure).

    Without them first (``cover``'s rules); else the greedy cover from the lowest
    id, where at each point a span on another node wins whatever its reach, and a
    span on an avoided node serves only up to where another node's span starts."""
    if not avoid or not any(span.node_id in avoid for span in spans):
        return cover(spans)
    preferred = [span for span in spans if span.node_id not in avoid]
    pieces = cover(preferred)
    if pieces is not None:
        return pieces
    ordered = sorted(spans, key=lambda s: (s.node_id in avoid, s.replica_id, s.node_id, s.index_id))
    point, out = LOWEST, []
    while True:
        here = [span for span in ordered if span.low <= point <= span.high]
        if not here:
            return None
        others = [span for span in here if span.node_id not in avoid]
        best = max(others or here, key=lambda s: (s.high, -ordered.index(s)))
        high = best.high
        if not others:
            starts = [s.low for s in preferred if s.low > point]
            if starts:
                high = min(high, min(starts) - 1)
        out.append(
            Served(best, None if point == LOWEST else point, None if high == HIGHEST else high)
        )
        if high >= HIGHEST:
            return out
        point = high + 1


def _reach(spans: Sequence[Span]) -> list[Served] | None:
    """The greedy interval cover: from the lowest id, the span that reaches furthest."""
    ordered = sorted(spans, key=lambda s: (s.replica_id, s.node_id, s.index_id))
    point, out = LOWEST, []
    while True:
        best = None
        for span in ordered:
            if span.low <= point <= span.high and (best is None or span.high > best.high):
                best = span
        if best is None:
            return None
        out.append(
            Served(
                best,
                None if point == LOWEST else point,
                None if best.high == HIGHEST else best.high,
            )
        )
        if best.high >= HIGHEST:
            return out
        point = best.high + 1


@dataclasses.dataclass(frozen=True)
class TargetIndex:
    index_id: int
    #: The range this index is asked for (the whole of its range but where another
    #: index serves part of it); None is an open end.
    project_namespace_id_from: int | None
    project_namespace_id_to: int | None


@dataclasses.dataclass(frozen=True)
class SearchTarget:
    node_id: int
    node_name: str
    search_base_url: str
    replica_id: int
    indices: tuple[TargetIndex, ...]


@dataclasses.dataclass(frozen=True)
class SearchTargets:
    namespace_id: int
    targets: tuple[SearchTarget, ...] = ()
    reason: Reason | None = None

    @property
    def search_enabled(self) -> bool:
        """True when a search of the namespace has somewhere to go."""
        return bool(self.targets)

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace_id": self.namespace_id,
            "search_enabled": self.search_enabled,
            "targets": [dataclasses.asdict(target) for target in self.targets],
            "reason": None if self.reason is None else str(self.reason),
        }


def search_targets(root_namespace_id: int, now: datetime | None = None) -> SearchTargets:
    """The covering indices and their nodes for a search of ``root_namespace_id``."""
    return search_targets_many([root_namespace_id], now)[root_namespace_id]


def routable_indices(enabled_namespace_ids: Iterable[int]):
    """The ready indices search may route to: in a replica, not a live move's build
    replica (a partial copy until it joins the serving replica at the swap)."""
    return Index.objects.filter(
        zoekt_enabled_namespace_id__in=list(enabled_namespace_ids),
        state=Index.State.READY,
        zoekt_replica_id__isnull=False,
    ).exclude(
        zoekt_replica_id__in=Move.objects.live()
        .filter(replacement_replica_id__isnull=False)
        .values("replacement_replica_id")
    )


def search_targets_many(
    root_namespace_ids: Iterable[int], now: datetime | None = None
) -> dict[int, SearchTargets]:
    """``search_targets`` of each root namespace id, in the same four queries for any number."""
    now = now or clock.now()
    ids = sorted(set(root_namespace_ids))
    enabled = {
        row.root_namespace_id: row
        for row in EnabledNamespace.objects.filter(root_namespace_id__in=ids).only(
            "id", "root_namespace_id", "search"
        )
    }
    searching = [row.id for row in enabled.values() if row.search]
    indices: list[Index] = (
        list(
            routable_indices(searching)
            .select_related("zoekt_node")
            .order_by("zoekt_replica_id", "zoekt_node_id", "id")
        )
        if searching
        else []
    )
    by_namespace: dict[int, list[Index]] = {}
    for index in indices:
        by_namespace.setdefault(index.zoekt_enabled_namespace_id, []).append(index)
    searchable, restarting = _searchable_nodes({index.zoekt_node_id for index in indices}, now)

    answers: dict[int, SearchTargets] = {}
    for root_id in ids:
        row = enabled.get(root_id)
        if row is None:
            answers[root_id] = SearchTargets(root_id, reason=Reason.NAMESPACE_NOT_ENABLED)
        elif not row.search:
            answers[root_id] = SearchTargets(root_id, reason=Reason.SEARCH_DISABLED)
        else:
            answers[root_id] = _answer(
                root_id, by_namespace.get(row.id, []), searchable, restarting
            )
    return answers


#: Why a namespace with search on has no target: its projects are not all searchable.
DARK_REASONS = (Reason.NO_READY_REPLICA, Reason.NO_SEARCHABLE_REPLICA)


def dark_namespaces(now: datetime | None = None) -> dict[Reason, list[int]]:
    """The root namespace ids, lowest first, of the enabled namespaces with search on
    that a search finds no target for, by reason (each of ``DARK_REASONS``, empty
    ones included): ``search_targets``' rule (``_cover``) over every such namespace,
    in four queries whatever their number (the namespaces, their routable indices as
    bare rows, and the two of ``_searchable_nodes``)."""
    now = now or clock.now()
    roots = dict(
        EnabledNamespace.objects.filter(search=True).values_list("id", "root_namespace_id")
    )
    spans: dict[int, list[Span]] = {namespace_id: [] for namespace_id in roots}
    rows = routable_indices(list(spans)).values_list(
        "zoekt_enabled_namespace_id", "id", "zoekt_replica_id", "zoekt_node_id", "metadata"
    )
    for namespace_id, *row in rows:  # no query for no namespace (an empty IN)
        spans[namespace_id].append(Span.from_row(*row))
    searchable, restarting = _searchable_nodes(
        {span.node_id for own in spans.values() for span in own}, now
    )
    dark: dict[Reason, list[int]] = {reason: [] for reason in DARK_REASONS}
    for namespace_id, own in spans.items():
        reason = _cover(own, searchable, restarting)[1]
        if reason is not None:
            dark[reason].append(roots[namespace_id])
    return {reason: sorted(ids) for reason, ids in dark.items()}


def _searchable_nodes(node_ids: set[int], now: datetime) -> tuple[set[int], set[int]]:
    """Which of the nodes a search may go to, and which of those an operator is
    restarting within its allowed delay (the two queries of ``searchable``; none
    for no node)."""
    searchable: set[int] = set()
    restarting: set[int] = set()
    if node_ids:
        rows = (
            Node.objects.filter(pk__in=node_ids)
            .searchable(now)
            .annotate(restarting=Node.objects.restart_hold(now))
            .values_list("id", "restarting")
        )
        for node_id, in_restart in rows:
            searchable.add(node_id)
            if in_restart:
                restarting.add(node_id)
    return searchable, restarting


def _cover(
    spans: list[Span], searchable: set[int], restarting: set[int]
) -> tuple[list[Served] | None, Reason | None]:
    """The cover on searchable nodes of one namespace's ready spans, or why there is none."""
    pieces = cover_avoiding([span for span in spans if span.node_id in searchable], restarting)
    if pieces is None:
        # Not covered on searchable nodes: by ready indices at all, or only elsewhere.
        reason = Reason.NO_READY_REPLICA if cover(spans) is None else Reason.NO_SEARCHABLE_REPLICA
        return None, reason
    return pieces, None


def _answer(
    root_id: int, indices: list[Index], searchable: set[int], restarting: set[int] = frozenset()
) -> SearchTargets:
    pieces, reason = _cover([Span.of(index) for index in indices], searchable, restarting)
    if pieces is None:
        return SearchTargets(root_id, reason=reason)
    by_id = {index.id: index for index in indices}
    targets = []
    for piece in sorted(pieces, key=lambda p: (p.span.node_id, p.span.index_id)):
        index = by_id[piece.span.index_id]
        targets.append(
            SearchTarget(
                node_id=index.zoekt_node_id,
                node_name=index.zoekt_node.name,
                search_base_url=index.zoekt_node.search_base_url,
                replica_id=index.zoekt_replica_id,
                indices=(
                    TargetIndex(
                        index_id=index.id,
                        project_namespace_id_from=piece.project_namespace_id_from,
                        project_namespace_id_to=piece.project_namespace_id_to,
                    ),
                ),
            )
        )
    return SearchTargets(root_id, targets=tuple(targets))
