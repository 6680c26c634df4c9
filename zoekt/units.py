"""Figures as people read them: byte counts in binary units labelled as such (KiB, MiB,
GiB...), project-namespace ranges in words."""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_NBSP = "\u00a0"


def binary_size(value: int | float) -> str:
    """``1.5 GiB``, ``512.0 MiB``, ``100 bytes``, ``1 byte``; negative counts keep their sign.

    One decimal from KiB up; number and unit are joined by a no-break space
    so a table cell never wraps between them.
    """
    value = int(value)
    if value < 0:
        return "-" + binary_size(-value)
    if value < 1024:
        return f"{value}{_NBSP}{'byte' if value == 1 else 'bytes'}"
    size = float(value)
    for unit in _UNITS:
        size /= 1024
        if size < 1024 or unit == _UNITS[-1]:
            return f"{size:.1f}{_NBSP}{unit}"
    raise AssertionError("unreachable")


def binary_unit(value: int | float) -> str:
    """The unit ``binary_size`` writes ``value`` in: ``GiB`` for 1.5 GiB, ``bytes`` under 1 KiB."""
    size = float(abs(int(value)))
    if size < 1024:
        return "bytes"
    for unit in _UNITS:
        size /= 1024
        if size < 1024 or unit == _UNITS[-1]:
            return unit
    raise AssertionError("unreachable")


def binary_size_in(value: int | float, unit: str) -> str:
    """``value`` in a given ``unit`` (one decimal), so figures side by side compare at a
    glance: 805.3 MiB beside 1.0 GiB reads ``0.8 GiB`` (``binary_unit`` of the largest)."""
    if unit not in _UNITS:
        return binary_size(value)
    size = float(value) / 1024 ** (_UNITS.index(unit) + 1)
    return f"{size:.1f}{_NBSP}{unit}"


def project_namespace_range(low: int | None, high: int | None) -> str:
    """An index's project-namespace id range, its open ends in words: ``all projects``,
    ``from 900336``, ``up to 900335``, ``900278–900335`` (None is an open end, as in
    ``zoekt_indices``; JSON keeps the nulls)."""
    if low is None:
        return "all projects" if high is None else f"up to {high}"
    return f"from {low}" if high is None else f"{low}–{high}"
