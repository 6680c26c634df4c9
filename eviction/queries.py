"""What eviction has done and is waiting for, for the dashboard, ``/metrics`` and ``zoekt_info``.

A handful of statements whatever the number of decisions or nodes.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from django.db.models import Count, Q, Sum

from eviction.models import EvictionDecision
from zoekt import capacity, clock
from zoekt.models import Node, natural_key


@dataclasses.dataclass(frozen=True)
class NodeEvictionState:
    node_id: int
    node_name: str
    percent_used: float
    #: Seconds the node has been over the high watermark (its sustain clock); None: under.
    over_high_seconds: int | None
    cooldown_until: datetime | None


@dataclasses.dataclass(frozen=True)
class EvictionOverview:
    #: (trigger, mode) → applied decisions, and the namespaces they affected.
    applied: dict[tuple[str, str], int]
    namespaces_affected: dict[tuple[str, str], int]
    #: (trigger, reason) → skipped decisions, each repeat folded into a row counted.
    skipped: dict[tuple[str, str], int]
    nodes: list[NodeEvictionState]
    recent: list[EvictionDecision]

    @property
    def cooling(self) -> list[NodeEvictionState]:
        return [n for n in self.nodes if n.cooldown_until is not None]

    @property
    def over_high(self) -> list[NodeEvictionState]:
        return [n for n in self.nodes if n.over_high_seconds is not None]


def eviction_overview(*, recent: int = 50, now: datetime | None = None) -> EvictionOverview:
    now = now or clock.now()
    applied: dict[tuple[str, str], int] = {}
    namespaces: dict[tuple[str, str], int] = {}
    for trigger, mode, count, affected in (
        EvictionDecision.objects.filter(applied_at__isnull=False)
        .values_list("trigger", "mode")
        .annotate(count=Count("id"), affected=Sum("namespaces_affected"))
        .order_by("trigger", "mode")
    ):
        applied[(trigger, mode)] = count
        namespaces[(trigger, mode)] = affected or 0
    skipped = {
        (trigger, reason): total or 0
        for trigger, reason, total in EvictionDecision.objects.filter(applied_at__isnull=True)
        .values_list("trigger", "reason")
        .annotate(total=Sum("repeats"))
        .order_by("trigger", "reason")
    }
    nodes = []
    watched = Node.objects.filter(
        Q(high_watermark_exceeded_at__isnull=False) | Q(eviction_cooldown_until__gt=now)
    )
    for node in watched:
        exceeded = node.high_watermark_exceeded_at
        cooling = node.eviction_cooldown_until
        nodes.append(
            NodeEvictionState(
                node.id,
                node.name,
                capacity.storage_percent_used(node.used_bytes, node.total_bytes),
                None if exceeded is None else max(0, int((now - exceeded).total_seconds())),
                cooling if cooling is not None and cooling > now else None,
            )
        )
    # By name, as every list of nodes (zoekt.models.natural_key).
    nodes.sort(key=lambda state: (natural_key(state.node_name), state.node_id))
    rows = list(EvictionDecision.objects.order_by("-last_seen_at", "-id")[:recent])
    return EvictionOverview(applied, namespaces, skipped, nodes, rows)
