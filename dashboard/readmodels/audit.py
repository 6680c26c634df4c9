"""The Audit page's read model: ``audit_page``, the audit trail (``zoekt.audit``) newest
first, filtered by action, surface (via), outcome, who and a time range, a page at a time.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, time

from django.core.paginator import Page
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from dashboard.readmodels.common import UnknownChoice, page_of
from zoekt.audit import Action
from zoekt.models import AuditEvent

AUDIT_ACTIONS = {"": "all", **{str(action): str(action) for action in Action}}
AUDIT_VIAS = {"": "all", **{str(via): via.label for via in AuditEvent.Via}}
AUDIT_OUTCOMES = {"": "all", **{str(o): o.label for o in AuditEvent.Outcome}}


class BadFilterValue(ValueError):
    """A filter value the page cannot read (a time that is not one): a 400 naming it."""

    def __init__(self, field: str, value: str, expected: str) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field} {value!r} is not {expected}")


@dataclasses.dataclass(frozen=True)
class AuditFilters:
    action: str = ""
    via: str = ""
    outcome: str = ""
    who: str = ""
    since: str = ""
    until: str = ""

    def query(self) -> str:
        """The filters as a query string, for the pager's links."""
        from urllib.parse import urlencode

        return urlencode({k: v for k, v in dataclasses.asdict(self).items() if v})


@dataclasses.dataclass(frozen=True)
class AuditPage:
    page: Page
    rows: list[AuditEvent]
    filters: AuditFilters


def _moment(field: str, value: str, *, end: bool) -> datetime | None:
    """A time filter: an ISO date (the whole day: from its start, or to its end) or an ISO
    date and time (UTC unless it says otherwise)."""
    if not value:
        return None
    parsed = None
    try:
        parsed = parse_datetime(value)
        if parsed is None and (day := parse_date(value)) is not None:
            parsed = datetime.combine(day, time.max if end else time.min)
    except ValueError:
        parsed = None
    if parsed is None:
        raise BadFilterValue(field, value, "a date (2026-12-05) or a date and time")
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, UTC)
    return parsed


def audit_page(filters: AuditFilters, *, page: int | str = 1, per_page: int = 50) -> AuditPage:
    """One page of audit events, newest first. An action, via or outcome outside its
    choices raises ``UnknownChoice``, an unreadable time ``BadFilterValue``; ``who`` matches
    part of the author's name, case-insensitively. Queries: the count and the page (2)."""
    for field, choices in (
        ("action", AUDIT_ACTIONS),
        ("via", AUDIT_VIAS),
        ("outcome", AUDIT_OUTCOMES),
    ):
        value = getattr(filters, field)
        if value not in choices:
            raise UnknownChoice(field, value, choices)
    since = _moment("since", filters.since, end=False)
    until = _moment("until", filters.until, end=True)
    rows = AuditEvent.objects.all()
    if filters.action:
        rows = rows.filter(event_name=filters.action)
    if filters.via:
        rows = rows.filter(via=filters.via)
    if filters.outcome:
        rows = rows.filter(outcome=filters.outcome)
    if filters.who.strip():
        rows = rows.filter(author_name__icontains=filters.who.strip())
    if since is not None:
        rows = rows.filter(created_at__gte=since)
    if until is not None:
        rows = rows.filter(created_at__lte=until)
    current = page_of(rows.order_by("-created_at", "-id"), per_page, page)
    return AuditPage(page=current, rows=list(current.object_list), filters=filters)
