"""Server-side SVG charts for the dashboard: no JavaScript, no CDN, nothing fetched.

Each function returns a small inline ``<svg>`` as safe markup. Every number
drawn is also written in the page's table next to the chart (the chart is a
picture of the figures, not their only source), and each shape carries a
``<title>`` so hovering shows its value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from zoekt.units import binary_size

# Colours: the admin's palette plus the watermark colours of zoekt.admin.
OTHER_USED = "#9e9e9e"  # disk used by anything but Zoekt's index files
INDEXED = "#546e7a"  # Zoekt's index files
RESERVED = "#64b5f6"  # reservations of the node's indices
OVERCOMMITTED = "#c62828"  # reservations beyond the usable storage
FREE = "#eceff1"
ESTIMATED = "#7e57c2"
OBSERVED = "#26a69a"
BUDGET = "#ffa000"
LIMIT = "#8d6e63"
WATERMARK_COLOURS = ("#b8860b", "#e65100", "#c62828")  # low, high, critical


def _bytes(value: int | None) -> str:
    return "-" if value is None else binary_size(value)


def _pct(ratio: float) -> str:
    return f"{ratio * 100:.1f}%"


def _rect(x: float, y: float, width: float, height: float, fill: str, title: str) -> str:
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(width, 0):.1f}" height="{height:.1f}" '
        f'fill="{fill}"><title>{escape(title)}</title></rect>'
    )


def _svg(width: int, height: int, label: str, body: Iterable[str], css_class: str) -> SafeString:
    return mark_safe(  # every interpolated text is escaped
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{css_class}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}">' + "".join(body) + "</svg>"
    )


def disk_bar(
    *,
    total_bytes: int,
    used_bytes: int,
    indexed_bytes: int,
    reserved_bytes: int,
    usable_bytes: int,
    limits: Sequence[float],
    width: int = 200,
    height: int = 20,
) -> SafeString:
    """One node's disk as a horizontal stacked bar over its total.

    From the left: disk used by anything but Zoekt (used − indexed, grey),
    then the index reservations (blue; they claim Zoekt's own files and free
    space), then what is left free. A dark inner bar is the disk used
    (``used_bytes``), which is what the watermark lines at ``limits`` (low,
    high, critical share of the total) are compared with. Reservations past
    the usable storage (an over-committed node) are drawn red at the end.
    """
    if total_bytes <= 0:
        body = [
            _rect(0, 0, width, height, FREE, "no disk reported"),
            f'<text x="4" y="{height - 7}" font-size="11" fill="#555">no disk reported</text>',
        ]
        return _svg(width, height, "no disk reported", body, "chart disk")
    scale = width / total_bytes
    other = max(used_bytes - indexed_bytes, 0)
    reserved_in = min(reserved_bytes, max(usable_bytes, 0))
    over = max(reserved_bytes - max(usable_bytes, 0), 0)
    body = [
        _rect(0, 0, width, height, FREE, f"total {_bytes(total_bytes)}"),
        _rect(0, 0, other * scale, height, OTHER_USED, f"used by others {_bytes(other)}"),
        _rect(
            other * scale,
            0,
            min(reserved_in * scale, width - other * scale),
            height,
            RESERVED,
            f"reserved {_bytes(reserved_bytes)}",
        ),
    ]
    if over:
        over_width = min(over * scale, width)
        body.append(
            _rect(
                width - over_width,
                0,
                over_width,
                height,
                OVERCOMMITTED,
                f"over-committed {_bytes(over)}",
            )
        )
    inner = height / 3
    body.append(
        _rect(
            0,
            inner,
            min(used_bytes * scale, width),
            inner,
            INDEXED,
            f"used {_bytes(used_bytes)} ({_pct(used_bytes / total_bytes)})",
        )
    )
    for limit, colour in zip(limits, WATERMARK_COLOURS, strict=False):
        x = min(limit * width, width - 1)
        body.append(
            f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height}" stroke="{colour}" '
            f'stroke-width="2" stroke-dasharray="3,2"><title>watermark {_pct(limit)}</title></line>'
        )
    label = (
        f"disk: used {_pct(used_bytes / total_bytes)} of {_bytes(total_bytes)}, "
        f"reserved {_bytes(reserved_bytes)}"
    )
    return _svg(width, height, label, body, "chart disk")


def memory_bars(
    *,
    estimated_bytes: int | None,
    rss_bytes: int | None,
    budget_bytes: int | None,
    limit_bytes: int | None,
    scale_bytes: int,
    watermark_limits: Sequence[float] = (),
    width: int = 160,
    bar: int = 6,
) -> SafeString:
    """Estimated memory, observed RSS and the budget as three bars on the fleet's common scale.

    ``scale_bytes`` is the largest figure drawn on the page, so bars compare
    across nodes. A missing figure is an empty track. The node's reported
    memory limit, when there is one, is a brown tick on the RSS track. With a
    budget, the memory watermarks (``watermark_limits``: low, high, critical
    shares of the budget) are dashed marks on the RSS track only, in the disk
    bar's watermark colours: they apply to observed RSS, not to the estimate.
    """
    scale = width / scale_bytes if scale_bytes > 0 else 0.0
    rows = (
        ("estimated", estimated_bytes, ESTIMATED),
        ("observed RSS", rss_bytes, OBSERVED),
        ("budget", budget_bytes, BUDGET),
    )
    body = []
    gap = 2
    for position, (label, value, colour) in enumerate(rows):
        y = position * (bar + gap)
        body.append(_rect(0, y, width, bar, FREE, f"{label}: not known"))
        if value is not None:
            body.append(
                _rect(0, y, min(value * scale, width), bar, colour, f"{label} {_bytes(value)}")
            )
    if limit_bytes is not None and scale:
        x = min(limit_bytes * scale, width - 1)
        body.append(
            f'<line x1="{x:.1f}" y1="{bar + gap}" x2="{x:.1f}" y2="{2 * bar + gap}" '
            f'stroke="{LIMIT}" stroke-width="2"><title>memory limit {_bytes(limit_bytes)}</title>'
            "</line>"
        )
    if budget_bytes and scale:
        for limit, colour in zip(watermark_limits, WATERMARK_COLOURS, strict=False):
            x = min(limit * budget_bytes * scale, width - 1)
            body.append(
                f'<line x1="{x:.1f}" y1="{bar + gap}" x2="{x:.1f}" y2="{2 * bar + gap}" '
                f'stroke="{colour}" stroke-width="1.5" stroke-dasharray="2,1" '
                'class="memory-watermark">'
                f"<title>RSS watermark {_pct(limit)} of the budget "
                f"({_bytes(int(limit * budget_bytes))})</title></line>"
            )
    height = 3 * bar + 2 * gap
    summary = ", ".join(f"{label} {_bytes(value)}" for label, value, _ in rows)
    return _svg(width, height, f"memory: {summary}", body, "chart memory")


def state_bar(
    counts: dict[str, int], colours: dict[str, str], *, width: int = 300, height: int = 14
) -> SafeString:
    """Counts by state as one stacked bar (e.g. indices by state)."""
    total = sum(counts.values())
    body = [_rect(0, 0, width, height, FREE, "none")]
    x = 0.0
    for state, count in counts.items():
        if not count:
            continue
        part = width * count / total
        body.append(_rect(x, 0, part, height, colours.get(state, OTHER_USED), f"{state}: {count}"))
        x += part
    label = ", ".join(f"{state} {count}" for state, count in counts.items() if count) or "none"
    return _svg(width, height, label, body, "chart states")


def legend(items: Sequence[tuple[str, str]], *, line: str | None = None) -> SafeString:
    """A one-line legend: ``[(colour, label), ...]`` swatches."""
    parts = []
    for colour, label in items:
        parts.append(
            f'<span class="legend-item"><svg width="12" height="12" aria-hidden="true">'
            f'<rect width="12" height="12" fill="{colour}"/></svg> {escape(label)}</span>'
        )
    if line:
        parts.append(f'<span class="legend-item">{escape(line)}</span>')
    return mark_safe(" ".join(parts))  # labels escaped


INDEX_STATE_COLOURS = {
    "pending": "#bdbdbd",
    "in_progress": "#90caf9",
    "initializing": "#64b5f6",
    "ready": "#2e7d32",
    "reallocating": "#ffb300",
    "pending_eviction": "#e65100",
    "evicted": "#8d6e63",
    "orphaned": "#757575",
    "pending_deletion": "#c62828",
}


# ----------------------------------------------------------------------------
# Time series (the node history, dashboard.history)
# ----------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Time axis marks: the first of these that gives at most eight marks (UTC-aligned).
_TICK_STEPS = tuple(hours * 3600 for hours in (1, 3, 6, 12, 24, 48, 72, 168))

#: ``(label, colour, [(time, value or None), ...] oldest first)``
Series = tuple[str, str, Sequence[tuple[datetime, float | None]]]


def _downsample(
    points: Sequence[tuple[datetime, float | None]], start: datetime, end: datetime, columns: int
) -> list[tuple[datetime, float]]:
    """At most one point per pixel column: the column's peak, at its last sample's time.

    Peaks, not means, so a short spike over a watermark still shows.
    """
    span = (end - start).total_seconds() or 1.0
    peaks: dict[int, tuple[datetime, float]] = {}
    for at, value in points:
        if value is None:
            continue
        column = min(int((at - start).total_seconds() / span * columns), columns - 1)
        previous = peaks.get(column)
        peaks[column] = (at, value if previous is None else max(previous[1], value))
    return [peaks[column] for column in sorted(peaks)]


def _path(
    points: Sequence[tuple[datetime, float]],
    x: Callable[[datetime], float],
    y: Callable[[float], float],
    gap_seconds: float,
) -> str:
    """An SVG path through the points, lifted over gaps longer than ``gap_seconds``."""
    parts = []
    previous: datetime | None = None
    for at, value in points:
        jump = previous is None or (at - previous).total_seconds() > gap_seconds
        parts.append(f"{'M' if jump else 'L'}{x(at):.1f},{y(value):.1f}")
        previous = at
    return " ".join(parts)


#: Up to this many points on a line, each is drawn as a dot too.
MARKED_POINTS = 48


def time_series(
    series: Sequence[Series],
    *,
    start: datetime,
    end: datetime,
    y_max: float,
    y_label: Callable[[float], str],
    gap_seconds: float,
    guides: Sequence[tuple[float, str, str]] = (),
    label: str,
    width: int = 720,
    height: int = 160,
) -> SafeString:
    """Lines over time between ``start`` and ``end``, on a y axis from 0 to ``y_max``.

    Each series is downsampled to its peak per pixel column and broken where
    no sample came for ``gap_seconds`` (the node was offline or nothing
    sampled). ``guides`` are dashed horizontal lines ``(value, colour,
    title)``, the watermarks say. The x axis is marked at UTC midnights (at
    most about eight labels), the y axis at 0, half and ``y_max``.
    """
    left, right, top, bottom = 64, 8, 6, 18
    plot_w, plot_h = width - left - right, height - top - bottom
    span = (end - start).total_seconds() or 1.0
    y_max = y_max if y_max > 0 else 1.0

    def x(at: datetime) -> float:
        return left + (at - start).total_seconds() / span * plot_w

    def y(value: float) -> float:
        return top + plot_h - min(max(value / y_max, 0.0), 1.0) * plot_h

    body = [
        _rect(left, top, plot_w, plot_h, "#fafafa", f"{start:%Y-%m-%d %H:%M} to {end:%H:%M} UTC")
    ]
    for fraction in (0.0, 0.5, 1.0):
        value = y_max * fraction
        body.append(
            f'<line x1="{left}" y1="{y(value):.1f}" x2="{left + plot_w}" y2="{y(value):.1f}" '
            'stroke="#e0e0e0" stroke-width="1"/>'
            f'<text x="{left - 4}" y="{y(value) + 4:.1f}" font-size="10" fill="#555" '
            f'text-anchor="end">{escape(y_label(value))}</text>'
        )
    hour = 3600
    step = next((step for step in _TICK_STEPS if span / step <= 8), _TICK_STEPS[-1])
    tick_format = "%H:%M" if step < 24 * hour else "%m-%d"
    epoch_seconds = (start - _EPOCH).total_seconds()
    tick = _EPOCH + timedelta(seconds=(epoch_seconds // step + 1) * step)
    while tick < end:
        body.append(
            f'<line x1="{x(tick):.1f}" y1="{top}" x2="{x(tick):.1f}" '
            f'y2="{top + plot_h}" stroke="#e0e0e0" stroke-width="1"/>'
            f'<text x="{x(tick):.1f}" y="{height - 4}" font-size="10" fill="#555" '
            f'text-anchor="middle">{tick.strftime(tick_format)}</text>'
        )
        tick += timedelta(seconds=step)
    for value, colour, title in guides:
        body.append(
            f'<line x1="{left}" y1="{y(value):.1f}" x2="{left + plot_w}" y2="{y(value):.1f}" '
            f'stroke="{colour}" stroke-width="1.5" stroke-dasharray="3,2">'
            f"<title>{escape(title)}</title></line>"
        )
    # Neighbouring pixel columns can be two columns' time apart: no gap at that scale.
    gap_seconds = max(gap_seconds, 2 * span / plot_w)
    for name, colour, points in series:
        drawn = _downsample(points, start, end, plot_w)
        if not drawn:
            continue
        peak = max(value for _, value in drawn)
        last_at, last = drawn[-1]
        title = f"{name}: last {y_label(last)} ({last_at:%m-%d %H:%M}), peak {y_label(peak)}"
        body.append(
            f'<path d="{_path(drawn, x, y, gap_seconds)}" fill="none" stroke="{colour}" '
            f'stroke-width="1.5" stroke-linejoin="round" data-series="{escape(name)}">'
            f"<title>{escape(title)}</title></path>"
        )
        if len(drawn) <= MARKED_POINTS:
            # Few samples (a node that just registered): each one a dot that can be seen.
            marked = drawn
        elif (last_at - drawn[-2][0]).total_seconds() > gap_seconds:
            marked = drawn[-1:]  # a lone last point draws no line: mark it
        else:
            marked = []
        for at, value in marked:
            body.append(
                f'<circle cx="{x(at):.1f}" cy="{y(value):.1f}" r="3.5" fill="{colour}" '
                f'data-series="{escape(name)}"><title>{escape(name)} {escape(y_label(value))} '
                f"({at:%m-%d %H:%M} UTC)</title></circle>"
            )
    return _svg(width, height, label, body, "chart history")


def sparkline(
    points: Sequence[tuple[datetime, float]],
    *,
    start: datetime,
    end: datetime,
    y_max: float = 1.0,
    limit: float | None = None,
    gap_seconds: float = 2 * 3600,
    width: int = 80,
    height: int = 16,
    label: str,
) -> SafeString:
    """A small line of one figure over time (the fleet page's disk share over a day).

    ``limit`` is drawn as a dashed line (the high watermark). No axes: the
    tooltip and the table beside it carry the figures.
    """
    span = (end - start).total_seconds() or 1.0

    def x(at: datetime) -> float:
        return (at - start).total_seconds() / span * (width - 2) + 1

    def y(value: float) -> float:
        return height - 1 - min(max(value / y_max, 0.0), 1.0) * (height - 2)

    body = [_rect(0, 0, width, height, FREE, label)]
    if limit is not None:
        body.append(
            f'<line x1="0" y1="{y(limit):.1f}" x2="{width}" y2="{y(limit):.1f}" '
            f'stroke="{WATERMARK_COLOURS[1]}" stroke-width="1" stroke-dasharray="2,2"/>'
        )
    if points:
        body.append(
            f'<path d="{_path(points, x, y, gap_seconds)}" fill="none" stroke="{INDEXED}" '
            f'stroke-width="1.2"><title>{escape(label)}</title></path>'
        )
        if len(points) == 1:
            at, value = points[0]
            body.append(f'<circle cx="{x(at):.1f}" cy="{y(value):.1f}" r="1.5" fill="{INDEXED}"/>')
    return _svg(width, height, label, body, "chart sparkline")
