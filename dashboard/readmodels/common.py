"""What the dashboard's read models share: state names, counts by state, and small helpers.

The state names (``INDEX_STATE_NAMES`` ...) turn the models' integer states into
the labels the pages and ``/metrics`` show; ``by_state`` and ``grouped`` count
rows by state in one query; ``indices_by_node_and_state`` counts indices by node and state;
``SPLIT`` tells a split index (nodes sort by ``zoekt.models.natural_key``: ``node-2``
before ``node-10``); ``UnknownChoice`` is a filter or a sort the page does not offer.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.db.models import Count, Exists, OuterRef

from zoekt.models import Index, Replica, Repository, Task

INDEX_STATE_NAMES = {state.value: state.label for state in Index.State}
REPLICA_STATE_NAMES = {state.value: state.label for state in Replica.State}
REPOSITORY_STATE_NAMES = {state.value: state.label for state in Repository.State}
TASK_STATE_NAMES = {state.value: state.label for state in Task.State}
WATERMARK_LEVEL_NAMES = {level.value: level.label for level in Index.WatermarkLevel}


def by_state(rows: Iterable[tuple[int, int]], names: dict[int, str]) -> dict[str, int]:
    """``{state name: count}`` for every state of the enum, zeros included, in enum order."""
    counts = dict.fromkeys(names.values(), 0)
    for value, count in rows:
        counts[names.get(value, str(value))] = counts.get(names.get(value, str(value)), 0) + count
    return counts


#: An enabled namespace is split when one of its replicas has more than one index
#: (each index on its own node, a range of its projects).
SPLIT = Exists(
    Index.objects.filter(zoekt_replica__zoekt_enabled_namespace=OuterRef("pk"))
    .order_by()
    .values("zoekt_replica_id")
    .annotate(n=Count("id"))
    .filter(n__gt=1)
)


def indices_by_node_and_state() -> tuple[dict[int, Counter], Counter]:
    """Indices by state per node id, and over the fleet (one grouped query)."""
    per_node: dict[int, Counter] = defaultdict(Counter)
    fleet: Counter = Counter()
    for node_id, state, count in (
        Index.objects.order_by()
        .values_list("zoekt_node_id", "state")
        .annotate(count=Count("id"))
        .values_list("zoekt_node_id", "state", "count")
    ):
        per_node[node_id][state] += count
        fleet[state] += count
    return per_node, fleet


def seconds_since(then: datetime | None, now: datetime) -> int | None:
    return None if then is None else max(0, int((now - then).total_seconds()))


def future(at: datetime | None, now: datetime) -> datetime | None:
    return at if at is not None and at > now else None


def grouped(queryset, field: str) -> list[tuple[int, int]]:
    return list(
        queryset.order_by()
        .values_list(field)
        .annotate(count=Count("pk"))
        .values_list(field, "count")
    )


class UnknownChoice(ValueError):
    """A query parameter outside its choices: the page answers 400 and names them."""

    def __init__(self, field: str, value: str, choices: Iterable[str]) -> None:
        self.field = field
        self.value = value
        self.choices = [choice for choice in choices if choice]
        super().__init__(f"unknown {field} {value!r}: one of {', '.join(self.choices)} (or none)")
