"""Filters the dashboard templates format figures with (``{% load zoekt_dashboard %}``)."""

from __future__ import annotations

from django import template

from zoekt.admin import human_bytes

register = template.Library()


@register.filter(name="bytes")
def bytes_filter(value: int | None) -> str:
    """``1.5 GB`` (binary units), ``-`` for None."""
    return human_bytes(value)


@register.filter
def percent(value: float | None, digits: int = 1) -> str:
    """A ratio as a percentage: 0.5 → ``50.0%``; ``-`` for None."""
    if value is None:
        return "-"
    return f"{value * 100:.{int(digits)}f}%"


@register.filter
def decimal(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{int(digits)}f}"


@register.filter
def words(value: str | None) -> str:
    """A snake_case code in words: ``node_unavailable`` → ``node unavailable``."""
    return "" if value is None else str(value).replace("_", " ")


@register.filter
def nonzero(counts: dict | None) -> list[tuple[str, int]]:
    """The ``(key, count)`` items of a mapping whose count is not 0."""
    return [(key, count) for key, count in (counts or {}).items() if count]


@register.filter
def get(mapping: dict | None, key):
    return (mapping or {}).get(key)


@register.filter
def open_end(value: int | None) -> str:
    """A project-namespace range end; ``…`` when open."""
    return "…" if value is None else str(value)


@register.filter
def sum_values(values) -> int:
    return sum(values or ())


@register.filter
def fleet_total(overview, attr: str) -> int:
    """``FleetOverview.totals(attr)``: a column summed over every node."""
    return overview.totals(attr)
