"""An operator deletes a node's row: refused while it holds the last ready copy of a range.

Deleting a node's row deletes its indices and their repositories
(``zoekt.scheduling.handlers.delete_node_rows``, lost-node handling's own
path): whatever they served is re-placed and re-indexed from nothing by the
rollout. Where another ready copy serves each of their project ranges that
costs no dark minute; where none does, the range goes dark until the
re-index. So an operator's delete (the admin's delete and bulk delete,
``manage.py zoekt_node delete``) is refused while the node holds the **last
ready copy** of any project range, unless forced:

* a range is the project-namespace id range of a ready index on the node
  (``project_namespace_id_from`` .. ``_to``, open ends unbounded) in a
  replica, not a live move's build replica (a partial copy that serves
  nothing yet);
* another copy of a stretch of it is a ready index of the same enabled
  namespace, in a replica and not a build replica, on another node that is
  **searchable** now (online, for search, healthy): the copy that would
  serve once the node is gone;
* ``last_copies`` lists each stretch no other copy covers, by namespace and
  index. The check runs again in the delete's transaction, with the node's
  row locked (a drain's pass and lost-node handling lock it too).

A forced delete is recorded: a ``remove`` record, complete at once with
``forced_delete``, who deleted the row, and the ranges it took dark in
``details.dark_ranges``. Any live record of the node completes
(``shutdown_node_deleted``) first. Lost-node handling (the beat job) keeps
GitLab's behaviour and is not this path. The way to delete a node without a
dark minute is to drain it first (``remove``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction

from zoekt import clock
from zoekt.audit import Action, Actor, Target, audited
from zoekt.logging import get_logger
from zoekt.models import Index, Node, NodeShutdown
from zoekt.operator_actions import ObjectNotFound, OperatorError, Rejected
from zoekt.reasons import Reason
from zoekt.scheduling.handlers import delete_node_rows
from zoekt.search_targets import HIGHEST, LOWEST, Span, routable_indices

log = get_logger(__name__)

Status = NodeShutdown.Status


class HoldsLastCopy(OperatorError):
    """The node holds the last ready copy of some project ranges: not deleted."""

    code = Reason.NODE_HOLDS_LAST_COPY

    def __init__(self, node: Node, ranges: list[dict[str, Any]]):
        namespaces = len({item["namespace_id"] for item in ranges})
        super().__init__(
            f"node {node.id} ({node.name}) holds the last ready copy of {len(ranges)} project "
            f"range(s) of {namespaces} namespace(s) ({Reason.NODE_HOLDS_LAST_COPY}): deleting "
            "it takes them dark until they are re-indexed elsewhere. Drain it first "
            "(zoekt_node remove), or force the delete."
        )
        self.field = "force"
        self.ranges = ranges


def uncovered(span: Span, others: Sequence[Span]) -> list[tuple[int, int]]:
    """The stretches of ``span``'s range that no span of ``others`` covers, as
    ``(low, high)`` with ``LOWEST``/``HIGHEST`` for the open ends (pure)."""
    point, gaps = span.low, []
    for other in sorted(others, key=lambda s: (s.low, s.high)):
        if other.high < point:
            continue
        if other.low > span.high:
            break
        if other.low > point:
            gaps.append((point, other.low - 1))
        if other.high >= span.high:
            return gaps
        point = max(point, other.high + 1)
    gaps.append((point, span.high))
    return gaps


def last_copies(node_id: int, now: datetime | None = None) -> list[dict[str, Any]]:
    """Each project range the node holds the last ready copy of (empty when every range
    of its ready indices has another ready copy on a searchable node)."""
    now = now or clock.now()
    mine = list(
        routable_indices(
            Index.objects.filter(zoekt_node_id=node_id, state=Index.State.READY)
            .exclude(zoekt_enabled_namespace_id=None)
            .values_list("zoekt_enabled_namespace_id", flat=True)
        )
        .filter(zoekt_node_id=node_id)
        .order_by("id")
    )
    if not mine:
        return []
    searchable = Node.objects.searchable(now).exclude(pk=node_id).values("id")
    spans_by_namespace: dict[int, list[Span]] = {}
    for index in routable_indices({i.zoekt_enabled_namespace_id for i in mine}).filter(
        zoekt_node_id__in=searchable
    ):
        spans_by_namespace.setdefault(index.zoekt_enabled_namespace_id, []).append(Span.of(index))
    out = []
    for index in mine:
        for low, high in uncovered(
            Span.of(index), spans_by_namespace.get(index.zoekt_enabled_namespace_id, [])
        ):
            out.append(
                {
                    "namespace_id": index.namespace_id,
                    "enabled_namespace_id": index.zoekt_enabled_namespace_id,
                    "index_id": index.id,
                    "project_namespace_id_from": None if low == LOWEST else low,
                    "project_namespace_id_to": None if high == HIGHEST else high,
                }
            )
    return out


def do_delete_node(
    node_id: int,
    *,
    deleted_by: str,
    force: bool = False,
    now: datetime | None = None,
    actor: Actor | None = None,
) -> dict[str, Any]:
    """``_delete_node``, recorded in the audit trail: ``node_deleted``, or
    ``node_force_deleted`` when it took ranges dark; refused when it would have."""
    with audited(
        actor or Actor.internal(deleted_by),
        Action.NODE_DELETED,
        Target("node", node_id),
        force=force,
    ) as entry:
        result = _delete_node(node_id, deleted_by=deleted_by, force=force, now=now)
        entry.target = Target("node", node_id, result["node_name"])
        if result["forced"]:
            entry.action = Action.NODE_FORCE_DELETED
        entry.details.update(
            dark_ranges=result["dark_ranges"],
            indices_deleted=result["indices_deleted"],
            repositories_deleted=result["repositories_deleted"],
            shutdowns_completed=result["shutdowns_completed"],
        )
    return result


def _delete_node(
    node_id: int, *, deleted_by: str, force: bool = False, now: datetime | None = None
) -> dict[str, Any]:
    """Delete the node's row with its indices and repositories, in one transaction.

    ``HoldsLastCopy`` (nothing written) when it holds the last ready copy of a
    range and ``force`` is off; ``ObjectNotFound`` when there is no such node.
    Returns what was deleted and the records it completed."""
    if not deleted_by:
        raise Rejected({"deleted_by": ["the operator's name is required"]})
    now = now or clock.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(pk=node_id).first()
        if node is None:
            raise ObjectNotFound("node_id", f"Zoekt node {node_id} not found.")
        dark = last_copies(node.id, now)
        if dark and not force:
            raise HoldsLastCopy(node, dark)
        completed = _close_records(node, deleted_by, dark, now)
        repositories, indices = delete_node_rows(node.id)
    log.warning(
        "node_deleted",
        node_id=node_id,
        node_name=node.name,
        deleted_by=deleted_by,
        forced=bool(dark),
        dark_ranges=len(dark),
        indices_deleted=indices,
    )
    return {
        "node_id": node_id,
        "node_name": node.name,
        "forced": bool(dark),
        "dark_ranges": dark,
        "repositories_deleted": repositories,
        "indices_deleted": indices,
        "shutdowns_completed": completed,
    }


def _close_records(
    node: Node, deleted_by: str, dark: list[dict[str, Any]], now: datetime
) -> list[int]:
    """The node's live record completes (``shutdown_node_deleted``); a forced delete
    is recorded as a ``remove`` record complete at once (``forced_delete``)."""
    completed = []
    live = NodeShutdown.objects.live().select_for_update().filter(node=node).first()
    if live is not None:
        live.transition(
            Status.COMPLETE,
            now,
            status_reason=Reason.SHUTDOWN_NODE_DELETED,
            details={**live.details, "deleted_by": deleted_by},
        )
        completed.append(live.id)
    if dark:
        record = NodeShutdown.objects.create(
            node=node,
            node_ref=node.id,
            node_name=node.name,
            type=NodeShutdown.Type.REMOVE,
            reason="forced delete of the node's row",
            requested_by=deleted_by,
            requested_at=now,
            created_at=now,
            updated_at=now,
        )
        record.transition(
            Status.COMPLETE,
            now,
            status_reason=Reason.FORCED_DELETE,
            details={
                "deleted_by": deleted_by,
                "dark_namespaces": len({item["namespace_id"] for item in dark}),
                "dark_ranges": dark,
            },
        )
        completed.append(record.id)
    return completed
