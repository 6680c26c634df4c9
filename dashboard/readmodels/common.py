"""What the dashboard's read models share: state names, counts by state, and small helpers.

The state names (``INDEX_STATE_NAMES`` ...) turn the models' integer states into
the labels the pages and ``/metrics`` show; ``by_state`` and ``grouped`` count
rows by state in one query; ``indices_by_node_and_state`` counts indices by node and state;
``SPLIT`` tells a split index (nodes sort by ``zoekt.models.natural_key``: ``node-2``
before ``node-10``); ``UnknownChoice`` is a filter or a sort the page does not offer;
``page_of`` is one page of a list, and ``BadPage`` a page number that is none of its pages.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.core.paginator import EmptyPage, InvalidPage, Page, Paginator
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


class BadPage(ValueError):
    """A ``?page=`` that names none of the list's pages: not a whole number from 1 (a 400),
    or past the last page (a 404). The page says which and links to the first and last."""

    def __init__(self, value: str, num_pages: int) -> None:
        self.field = "page"
        self.value = value
        self.num_pages = num_pages
        number = int(value) if value.lstrip("-").isdigit() else None
        self.past_the_end = number is not None and number > num_pages
        self.status = 404 if self.past_the_end else 400
        super().__init__(
            f"there is no page {value}: the list has {num_pages} page"
            f"{'' if num_pages == 1 else 's'}"
            if self.past_the_end
            else f"page {value!r} is not a page number (a whole number from 1)"
        )


def page_of(rows, per_page: int, page: int | str) -> Page:
    """One page of ``rows``; ``BadPage`` for ``abc``, ``-1``, ``0`` or past the last page,
    rather than quietly showing the first or the last (Django's ``get_page``)."""
    paginator = Paginator(rows, per_page)
    try:
        return paginator.page(page)
    except InvalidPage as error:
        value = str(page)
        if isinstance(error, EmptyPage) or not value.lstrip("-").isdigit():
            raise BadPage(value, paginator.num_pages) from None
        raise
