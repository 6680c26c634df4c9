"""Node maintenance's read model: ``node_maintenance`` (the fleet page's marks and
``/metrics``) and ``maintenance_page`` (the Maintenance page).

A row per node shutdown record (``zoekt_node_shutdowns``, docs/operations.md):
what was asked, by whom, its status, and what is left of it: a restart's
delay, and for a drain (``remove`` or ``replace``) the indices and bytes still
on the node, the moves in flight off it and when it should be done
(``zoekt.drains.drain_progress_many``, the API's figures). Every figure comes
from grouped queries, so the cost is fixed whatever the number of records or
nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime

from django.core.paginator import Page
from django.db.models import Count

from dashboard.readmodels.common import page_of
from zoekt import clock
from zoekt.drains import drain_progress_many
from zoekt.models import NodeShutdown


@dataclasses.dataclass(frozen=True)
class DrainLeft:
    """What a draining node still holds, and what is on its way off it."""

    indices: int
    #: ``used_storage_bytes`` of the indices still to move (not on their way out already).
    bytes: int
    moves_in_flight: int
    moves_done: int
    #: The bytes left at the drain's observed rate (None before its first move is done).
    eta_seconds: int | None


@dataclasses.dataclass(frozen=True)
class ShutdownRow:
    id: int
    node_id: int
    node_name: str
    #: The node row still exists, and it heartbeated in the last 30 s.
    node_exists: bool
    node_online: bool
    type: str
    status: str
    status_reason: str
    reason: str
    requested_by: str
    requested_at: datetime
    target_node_name: str | None
    #: A live restart's allowed delay left (whole seconds; 0 once it passed).
    delay_seconds_left: int | None
    #: A live drain's indices and bytes left on the node (None otherwise).
    left: DrainLeft | None
    ended_at: datetime | None
    cancelled_by: str
    #: Requested to completed or cancelled (to now while live).
    seconds: int
    live: bool

    @property
    def drain(self) -> bool:
        return self.type in NodeShutdown.DRAINS


@dataclasses.dataclass(frozen=True)
class MaintenancePage:
    live: list[ShutdownRow]
    recent: Page
    rows: list[ShutdownRow]
    #: ``{(type, status): count}`` over every record kept.
    counts: dict[tuple[str, str], int]


def drain_left(records: Iterable[NodeShutdown], now: datetime) -> dict[int, DrainLeft]:
    """What each live drain has left, by node id (``zoekt.drains.drain_progress_many``)."""
    drains = [record for record in records if record.drain and record.node_id is not None]
    progress = drain_progress_many(drains, now)
    return {
        record.node_id: DrainLeft(
            indices=progress[record.id]["indices_left"],
            bytes=progress[record.id]["bytes_left"],
            moves_in_flight=progress[record.id]["moves_in_flight"],
            moves_done=progress[record.id]["moves_done"],
            eta_seconds=progress[record.id]["eta_seconds"],
        )
        for record in drains
    }


def _row(record: NodeShutdown, left: dict[int, DrainLeft], now: datetime) -> ShutdownRow:
    node = record.node
    live = record.live
    ended = record.completed_at or record.cancelled_at
    return ShutdownRow(
        id=record.id,
        node_id=record.node_ref,
        node_name=node.name if node is not None else (record.node_name or str(record.node_ref)),
        node_exists=node is not None,
        node_online=node is not None and node.is_online(now),
        type=record.type,
        status=record.status,
        status_reason=record.status_reason,
        reason=record.reason,
        requested_by=record.requested_by,
        requested_at=record.requested_at,
        target_node_name=record.target_node.name if record.target_node else None,
        delay_seconds_left=record.delay_seconds_left(now)
        if record.type == NodeShutdown.Type.RESTART
        else None,
        left=left.get(record.node_id) if live and record.drain else None,
        ended_at=ended,
        cancelled_by=record.cancelled_by,
        seconds=max(0, int(((ended or now) - record.requested_at).total_seconds())),
        live=live,
    )


def _related():
    return NodeShutdown.objects.select_related("node", "target_node")


def _live_rows(now: datetime) -> list[ShutdownRow]:
    live = list(_related().live().order_by("requested_at", "id"))
    left = drain_left(live, now)
    return [_row(record, left, now) for record in live]


def node_maintenance(now: datetime | None = None) -> dict[int, ShutdownRow]:
    """The live record of each node in maintenance, by node id.

    Queries: the live records (1), and with a drain among them its indices
    and moves (2).
    """
    now = now or clock.now()
    return {row.node_id: row for row in _live_rows(now)}


def maintenance_page(
    *, page: int | str = 1, per_page: int = 50, now: datetime | None = None
) -> MaintenancePage:
    """The live records (oldest request first) and a page of the ended ones (newest first).

    Queries: counts (1), live (1, and 2 with a drain), the count and the page (2).
    """
    now = now or clock.now()
    counts = {
        (type_, status): count
        for type_, status, count in NodeShutdown.objects.order_by()
        .values("type", "status")
        .annotate(count=Count("id"))
        .values_list("type", "status", "count")
    }
    recent = page_of(
        _related().exclude(status__in=NodeShutdown.LIVE).order_by("-requested_at", "-id"),
        per_page,
        page,
    )
    return MaintenancePage(
        live=_live_rows(now),
        recent=recent,
        rows=[_row(record, {}, now) for record in recent.object_list],
        counts=counts,
    )
