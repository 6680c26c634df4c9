"""The evictions page's read model: ``eviction_page``, the nodes over the high
watermark and in cooldown (``eviction.queries.eviction_overview``) and a page of
eviction decisions.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from django.core.paginator import Page

from dashboard.readmodels.common import future, page_of
from eviction.models import EvictionDecision
from eviction.queries import EvictionOverview, eviction_overview
from zoekt import app_settings, capacity, clock


@dataclasses.dataclass(frozen=True)
class DecisionRow:
    id: int
    created_at: datetime
    last_seen_at: datetime
    repeats: int
    node_id: int | None
    node_name: str
    trigger: str
    mode: str
    reason: str
    applied_at: datetime | None
    namespaces_affected: int
    #: Used bytes of the indices it took off the node (0 for a skipped decision).
    evicted_bytes: int
    used_bytes: int
    total_bytes: int
    projected_used_bytes: int | None
    #: The cooldown it started: ended (when, why), or still running until.
    cooldown_ended_at: datetime | None
    cooldown_end_reason: str
    cooldown_until: datetime | None
    details: dict[str, Any]

    @property
    def applied(self) -> bool:
        return self.applied_at is not None

    @property
    def used_percent(self) -> float | None:
        return self.used_bytes / self.total_bytes if self.total_bytes else None

    @property
    def projected_percent(self) -> float | None:
        if self.projected_used_bytes is None or not self.total_bytes:
            return None
        return self.projected_used_bytes / self.total_bytes


@dataclasses.dataclass(frozen=True)
class EvictionPage:
    now: datetime
    settings: app_settings.ZoektSettings
    overview: EvictionOverview
    page: Page
    decisions: list[DecisionRow]
    watermark_limits: tuple[float, float, float]

    @property
    def high_watermark(self) -> float:
        return self.watermark_limits[1]

    @property
    def hysteresis_floor(self) -> float:
        """Under this the sustain clock is cleared (high − ``EVICTION_HYSTERESIS``)."""
        return capacity.hysteresis_floor(self.watermark_limits[1])

    @property
    def applied_total(self) -> int:
        return sum(self.overview.applied.values())

    @property
    def namespaces_affected_total(self) -> int:
        return sum(self.overview.namespaces_affected.values())

    @property
    def skipped_total(self) -> int:
        return sum(self.overview.skipped.values())


def eviction_page(
    *,
    page: int | str = 1,
    per_page: int = 50,
    now: datetime | None = None,
    settings: app_settings.ZoektSettings | None = None,
) -> EvictionPage:
    """The nodes over the high watermark and in cooldown, and a page of decisions.

    Newest first (by when a decision was last seen, so a skip that keeps
    repeating stays at the top). Queries: ``eviction_overview``'s counts and
    watched nodes (3), the count and the page with each decision's node (2).
    """
    now = now or clock.now()
    settings = settings or app_settings.current()
    overview = eviction_overview(recent=0, now=now)
    rows = EvictionDecision.objects.select_related("node").order_by("-last_seen_at", "-id")
    page_obj = page_of(rows, per_page, page)
    decisions = []
    for row in page_obj.object_list:
        running = (
            row.applied_at is not None
            and row.cooldown_ended_at is None
            and row.node is not None
            and row.mode == EvictionDecision.Mode.SAFEGUARDS
        )
        decisions.append(
            DecisionRow(
                id=row.id,
                created_at=row.created_at,
                last_seen_at=row.last_seen_at,
                repeats=row.repeats,
                node_id=row.node_id,
                node_name=row.node_name or (row.node.name if row.node else f"node-{row.node_id}"),
                trigger=row.trigger,
                mode=row.mode,
                reason=row.reason,
                applied_at=row.applied_at,
                namespaces_affected=row.namespaces_affected,
                evicted_bytes=row.chosen_bytes,
                used_bytes=row.used_bytes,
                total_bytes=row.total_bytes,
                projected_used_bytes=row.projected_used_bytes,
                cooldown_ended_at=row.cooldown_ended_at,
                cooldown_end_reason=row.cooldown_end_reason,
                cooldown_until=future(row.node.eviction_cooldown_until, now) if running else None,
                details=row.details or {},
            )
        )
    return EvictionPage(
        now=now,
        settings=settings,
        overview=overview,
        page=page_obj,
        decisions=decisions,
        watermark_limits=capacity.watermark_limits(app_settings.development_watermarks()),
    )
