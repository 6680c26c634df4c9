"""Filters the dashboard templates format figures with (``{% load zoekt_dashboard %}``)."""

from __future__ import annotations

import json

from django import template
from django.urls import reverse
from django.utils.html import format_html

from zoekt.admin import human_bytes
from zoekt.units import binary_size_in, binary_unit, project_namespace_range

register = template.Library()


@register.filter(name="bytes")
def bytes_filter(value: int | None) -> str:
    """``1.5 GiB`` (binary units), ``-`` for None."""
    return human_bytes(value)


@register.filter
def bytes_in(value: int | None, unit: str) -> str:
    """A size in a row's common unit (``binary_size_in``): ``0.8 GiB`` beside ``1.0 GiB``."""
    return human_bytes(None) if value is None else binary_size_in(value, unit)


@register.filter
def over_bytes(used: int | None, reserved: int | None) -> str:
    """``used / reserved`` in one unit, the larger's: ``0.3 GiB / 1.0 GiB``."""
    if used is None or reserved is None:
        return f"{human_bytes(used)} / {human_bytes(reserved)}"
    unit = binary_unit(max(abs(used), abs(reserved)))
    return f"{binary_size_in(used, unit)} / {binary_size_in(reserved, unit)}"


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
def project_range(index) -> str:
    """An index's project-namespace range (a dict or an object with
    ``project_namespace_id_from`` and ``_to``) in words: ``all projects``, ``from 900336``,
    ``up to 900335``, ``900278–900335`` (``zoekt.units.project_namespace_range``)."""
    if isinstance(index, dict):
        low, high = index.get("project_namespace_id_from"), index.get("project_namespace_id_to")
    else:
        low = getattr(index, "project_namespace_id_from", None)
        high = getattr(index, "project_namespace_id_to", None)
    return project_namespace_range(low, high)


@register.filter
def sum_values(values) -> int:
    return sum(values or ())


@register.filter
def fleet_total(overview, attr: str) -> int:
    """``FleetOverview.totals(attr)``: a column summed over every node."""
    return overview.totals(attr)


@register.filter
def duration(seconds: int | float | None) -> str:
    """Seconds as an operator reads them: ``3 h 12 min``, ``2 d 4 h``, ``45 s``; ``-`` for None."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min"
    return f"{secs} s"


@register.filter
def seconds_until(at, now) -> int | None:
    """Seconds from ``now`` to ``at`` (0 once it has passed); None without ``at``."""
    if at is None or now is None:
        return None
    return max(0, int((at - now).total_seconds()))


@register.filter
def minus(value: int | float | None, other: int | float | None):
    """``value - other``; None when either is None."""
    if value is None or other is None:
        return None
    return value - other


@register.filter
def audit_details(value: dict | None) -> str:
    """An audit event's details as compact sorted JSON (``-`` when empty)."""
    if not value:
        return "-"
    return json.dumps(value, sort_keys=True, default=str, separators=(", ", ": "))


@register.simple_tag
def node_link(name: str | None, node_id: int | None = None) -> str:
    """A node's name linking to its page: by id when the row has one, else by name
    (``dashboard-node-named`` finds the node); ``-`` without a name."""
    if not name:
        return "-"
    url = (
        reverse("dashboard-node", args=[node_id])
        if node_id is not None
        else reverse("dashboard-node-named", args=[name])
    )
    return format_html('<a class="node-name" href="{}">{}</a>', url, name)
