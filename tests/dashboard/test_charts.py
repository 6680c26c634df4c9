"""The server-side SVG charts: shapes where the figures say, text escaped."""

from __future__ import annotations

import re

from dashboard import charts

GIB = 1024**3
LIMITS = (0.60, 0.75, 0.85)


def rects(svg: str) -> list[dict[str, str]]:
    return [
        dict(re.findall(r'(\w+)="([^"]*)"', attrs)) | {"title": title}
        for attrs, title in re.findall(r"<rect ([^>]*)><title>([^<]*)</title>", svg)
    ]


def test_disk_bar_stacks_others_reserved_and_used_over_the_total():
    svg = charts.disk_bar(
        total_bytes=100 * GIB,
        used_bytes=40 * GIB,
        indexed_bytes=10 * GIB,
        reserved_bytes=20 * GIB,
        usable_bytes=70 * GIB,
        limits=LIMITS,
        width=200,
    )

    def shape(prefix: str) -> dict[str, str]:
        (found,) = [s for s in rects(svg) if s["title"].startswith(prefix)]
        return found

    assert shape("total")["width"] == "200.0"
    assert shape("used by others")["width"] == "60.0"  # used − indexed: 30 GiB of 100
    assert (shape("reserved")["x"], shape("reserved")["width"]) == ("60.0", "40.0")
    assert shape("used 40")["width"] == "80.0"  # the inner used bar: 40 % of 200
    assert re.findall(r'<line x1="([\d.]+)"', svg) == ["120.0", "150.0", "170.0"]
    assert "over-committed" not in svg


def test_disk_bar_marks_reservations_beyond_the_usable_storage():
    svg = charts.disk_bar(
        total_bytes=100 * GIB,
        used_bytes=50 * GIB,
        indexed_bytes=0,
        reserved_bytes=80 * GIB,
        usable_bytes=50 * GIB,
        limits=LIMITS,
        width=100,
    )
    over = [s for s in rects(svg) if s["title"].startswith("over-committed")]
    assert over and over[0]["fill"] == charts.OVERCOMMITTED
    assert over[0]["width"] == "30.0"


def test_disk_bar_of_a_node_without_disk_says_so():
    svg = charts.disk_bar(
        total_bytes=0,
        used_bytes=0,
        indexed_bytes=0,
        reserved_bytes=0,
        usable_bytes=0,
        limits=LIMITS,
    )
    assert "no disk reported" in svg


def test_memory_bars_share_one_scale_and_leave_unknown_figures_empty():
    svg = charts.memory_bars(
        estimated_bytes=2 * GIB,
        rss_bytes=None,
        budget_bytes=8 * GIB,
        limit_bytes=4 * GIB,
        scale_bytes=8 * GIB,
        width=160,
    )
    widths = {s["title"].split(" ")[0]: s["width"] for s in rects(svg) if s["fill"] != charts.FREE}
    assert widths == {"estimated": "40.0", "budget": "160.0"}
    assert "observed RSS: not known" in svg
    assert re.findall(r'<line x1="([\d.]+)"', svg) == ["80.0"]


def test_memory_watermarks_are_drawn_on_the_rss_bar_only():
    # They apply to observed RSS against the budget: a mark across the estimate would put
    # an estimate at 85 % of the budget on the critical tick while RSS is "normal".
    bar, gap = 6, 2
    svg = charts.memory_bars(
        estimated_bytes=int(6.8 * GIB),
        rss_bytes=int(2.8 * GIB),
        budget_bytes=8 * GIB,
        limit_bytes=None,
        scale_bytes=8 * GIB,
        watermark_limits=(0.60, 0.75, 0.85),
        width=160,
        bar=bar,
    )
    marks = re.findall(r'<line x1="[\d.]+" y1="([\d.]+)" x2="[\d.]+" y2="([\d.]+)"', svg)
    assert len(marks) == 3
    assert {(float(y1), float(y2)) for y1, y2 in marks} == {(bar + gap, 2 * bar + gap)}
    assert "RSS watermark 85.0% of the budget" in svg


def test_labels_are_escaped():
    svg = charts.state_bar({"<b>": 1}, {})
    assert "<b>" not in svg
    assert "&lt;b&gt;" in svg
