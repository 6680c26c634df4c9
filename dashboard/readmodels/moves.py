"""The moves page's read model: ``move_page``, the live moves and a page of recent
ones, with durations.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from django.core.paginator import Page

from dashboard.readmodels.common import grouped, page_of
from zoekt import clock
from zoekt.models import Move, Namespace


@dataclasses.dataclass(frozen=True)
class MoveRow:
    id: int
    trigger: str
    state: str
    reason: str
    namespace_id: int
    namespace_path: str | None
    source_node: str
    target_node: str | None
    bytes: int
    created_at: datetime
    deadline_at: datetime | None
    #: Planned to done (or to now, while live; to parked or fallen back).
    seconds: int
    live: bool


@dataclasses.dataclass(frozen=True)
class MovePage:
    live: list[MoveRow]
    recent: Page
    rows: list[MoveRow]
    #: ``{state: count}`` over every move kept.
    states: dict[str, int]


def _move_row(move: Move, paths: dict[int, str], now: datetime) -> MoveRow:
    end = move.done_at or move.parked_at or move.fallen_back_at or move.cancelled_at or now
    return MoveRow(
        id=move.id,
        trigger=move.trigger,
        state=move.state,
        reason=move.reason,
        namespace_id=move.namespace_id,
        namespace_path=paths.get(move.namespace_id),
        source_node=move.source_node.name if move.source_node else "(gone)",
        target_node=move.target_node.name if move.target_node else None,
        bytes=move.bytes,
        created_at=move.created_at,
        deadline_at=move.deadline_at,
        seconds=max(0, int((end - move.created_at).total_seconds())),
        live=move.live,
    )


def move_page(*, page: int | str = 1, per_page: int = 50, now: datetime | None = None) -> MovePage:
    """The live moves (oldest first) and a page of the finished ones (newest first).

    Queries: states (1), live (1), the count and the page (2), paths (1).
    """
    now = now or clock.now()
    states = dict(grouped(Move.objects, "state"))
    related = Move.objects.select_related("source_node", "target_node")
    live = list(related.live().order_by("id"))
    recent = page_of(related.exclude(state__in=Move.LIVE).order_by("-id"), per_page, page)
    finished = list(recent.object_list)
    paths = dict(
        Namespace.objects.filter(id__in={m.namespace_id for m in [*live, *finished]}).values_list(
            "id", "path"
        )
    )
    return MovePage(
        live=[_move_row(m, paths, now) for m in live],
        recent=recent,
        rows=[_move_row(m, paths, now) for m in finished],
        states=states,
    )
