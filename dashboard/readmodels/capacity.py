"""The Capacity page's read model: the provisioning status now and in 30 and 90 days
(``dashboard.capacity.capacity_report``, the report behind ``GET /api/v1/capacity`` and
``zoekt_capacity --json``) and a chart of the fleet's disk share over the history window
with the forecast line to 90 days against the low watermark."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils.safestring import SafeString

from dashboard import charts
from dashboard.capacity import capacity_report
from zoekt import clock


@dataclasses.dataclass(frozen=True)
class CapacityPage:
    report: dict[str, Any]
    chart: SafeString
    #: Bytes a day (None: not enough history).
    disk_growth_per_day: int | None


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def forecast_chart(report: dict[str, Any], now: datetime) -> SafeString:
    """The fleet's disk share per history sample, and the forecast from now to the last
    horizon, under the low watermark."""
    disk = report["fleet"]["disk_bytes"]
    history = [(_at(s["at"]), s["used_bytes"] / disk if disk else None) for s in report["history"]]
    forecast = [
        (now + timedelta(days=h["days"]), h["disk_share"])
        for h in report["horizons"]
        if h["disk_share"] is not None and (h["days"] == 0 or h["status"] != "UNDECIDED")
    ]
    end = now + timedelta(days=max(report["options"]["horizons_days"]))
    start = history[0][0] if history else now - timedelta(days=1)
    low = report["options"]["low_watermark"]
    peak = max([low, *(v for _, v in history + forecast if v is not None)])
    return charts.time_series(
        [
            ("disk used ÷ disk", charts.INDEXED, history),
            ("forecast", charts.ESTIMATED, forecast),
        ],
        start=start,
        end=end,
        y_max=max(1.0, peak),
        y_label=lambda v: f"{v:.0%}",
        gap_seconds=(end - start).total_seconds(),
        guides=[(low, charts.WATERMARK_COLOURS[0], f"low watermark {low:.0%}")],
        label="The fleet's disk share over the history and the forecast to 90 days",
    )


def capacity_page() -> CapacityPage:
    now = clock.now()
    report = capacity_report(now=now)
    rate = report["growth"]["used_bytes_per_day"]
    return CapacityPage(
        report=report,
        chart=forecast_chart(report, now),
        disk_growth_per_day=None if rate is None else round(rate),
    )
