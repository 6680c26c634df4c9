"""GitLab's ``gitlab:zoekt:info`` (reference 9), with each node's memory beside its disk.

    manage.py zoekt_info                    # every section, Node Details included
    manage.py zoekt_info --watch 10         # reprint every 10 s (Node Details off by default)
    manage.py zoekt_info --watch 10 --extended
    manage.py zoekt_info --no-extended
    manage.py zoekt_info --json             # the same data as one JSON document

Sections, in GitLab's order: Exact Code Search (version and every setting),
Nodes, Indexing status, Feature Flags (this project has none: "none"), and in
extended mode Node Details; after Indexing status, this project's Eviction
(``docs/eviction.md``): its settings, the nodes over the high watermark and
for how long, the nodes in cooldown, the applied decisions by trigger and
mode, the skipped ones by trigger and reason, and the last few decisions.
Per node, after the disk utilisation line comes
the memory utilisation (webserver RSS over the node's memory budget, with
its memory watermark), and after GitLab's webserver RSS line the *estimated*
memory of the node's indices (repository bytes × ``memory_ratio``) next to
it, the shards loaded, and the observed ratios (``docs/memory.md``):
``observed_memory_ratio`` (RSS ÷ used storage of ready indices) and RSS per
repository byte (the quantity ``memory_ratio`` estimates) — neither is
``memory_ratio`` itself.

The figures are the read models' (the fleet page's for the nodes, their memory
and the counts by state; eviction's overview; the GitLab page's status), with a
query of its own only where the figure is this report's alone. ``--json`` prints
the same figures typed (bytes as integers, durations in seconds, times in ISO
8601, snake_case keys): ``docs/zoekt_info.md`` documents every key.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count, Sum

from dashboard.readmodels.fleet import FleetOverview, NodeRow, fleet_overview
from dashboard.templatetags.zoekt_dashboard import duration
from eviction.queries import EvictionOverview, eviction_overview
from gitlab_sync.status import status as gitlab_status
from planner.core import CONCURRENCY_FACTOR
from zoekt import admission, app_settings, capacity, clock, memory
from zoekt.capacity import NodeWatermark
from zoekt.models import (
    ApplicationSetting,
    EnabledNamespace,
    Index,
    Namespace,
    Node,
    Task,
)

#: Clears the terminal before each report in watch mode.
CLEAR_SCREEN = "\x1b[H\x1b[2J"
NEVER = "(never)"
NONE = "(none)"
#: Decisions the Eviction section lists, newest first.
RECENT_DECISIONS = 5

_RED = {"critical", "failed", "evicted", "high", "critical_watermark_exceeded"}
_RED |= {"high_watermark_exceeded", "pending_eviction", "offline"}
_YELLOW = {"low", "overprovisioned", "low_watermark_exceeded", "unknown"}
_GREEN = {"ready", "done", "healthy", "normal", "online"}


class Command(BaseCommand):
    help = (
        "GitLab's gitlab:zoekt:info: settings, nodes, indexing status and (extended) node "
        "details, with each node's estimated and observed memory beside its disk."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--watch",
            type=float,
            default=0,
            metavar="SECONDS",
            help="reprint the report every SECONDS until interrupted (default: print once)",
        )
        parser.add_argument(
            "--extended",
            action="store_true",
            default=None,
            help="include Node Details (the default without --watch)",
        )
        parser.add_argument(
            "--no-extended",
            action="store_false",
            dest="extended",
            help="leave out Node Details (the default with --watch)",
        )
        parser.add_argument(
            "--json", action="store_true", help="print the report as one JSON document"
        )

    def handle(self, *args, **options):
        watch = options["watch"] or 0
        if watch < 0:
            raise CommandError("--watch must be a positive number of seconds")
        extended = options["extended"]
        if extended is None:
            extended = not watch
        if options["json"]:
            if watch:
                raise CommandError("--json prints one report; it cannot be combined with --watch")
            report = as_json(collect(extended=extended))
            self.stdout.write(json.dumps(report, indent=2, sort_keys=True))
            return
        if not watch:
            self.stdout.write(self.render(collect(extended=extended)))
            return
        try:
            while True:
                report = collect(extended=extended)
                self.stdout.write(CLEAR_SCREEN, ending="")
                stamp = report["generated_at"]
                self.stdout.write(f"Every {watch:g}s: gitlab:zoekt:info at {stamp}\n")
                self.stdout.write(self.render(report))
                self.stdout.flush()
                time.sleep(watch)
        except KeyboardInterrupt:
            self.stdout.write("")

    # ------------------------------------------------------------------ #
    # Text

    def render(self, report: Mapping[str, Any]) -> str:
        lines: list[str] = []
        lines += self._section("Exact Code Search", report["exact_code_search"]["rows"])
        lines += self._section("Nodes", report["nodes"]["rows"])
        lines += self._section("Indexing status", report["indexing_status"]["rows"])
        lines += self._eviction(report["eviction"])
        lines += self._section("Node maintenance", report["node_maintenance"]["rows"])
        lines += self._section("GitLab", report["gitlab"]["rows"])
        flags = report["feature_flags"]["rows"]
        lines += self._section("Feature Flags (Non-Default Values)", flags)
        defaults = report["feature_flags_default"]["rows"]
        lines += self._section("Feature Flags (Default Values)", defaults)
        if "node_details" in report:
            lines.append(self.style.MIGRATE_HEADING("Node Details"))
            for node in report["node_details"]:
                lines.append(f"Node {node['id']} - {node['name']}")
                lines += self._rows(node["rows"], indent="  ")
            if not report["node_details"]:
                lines.append("  none")
            lines.append("")
        return "\n".join(lines)

    def _eviction(self, eviction: Mapping[str, Any]) -> list[str]:
        out = self._section("Eviction", eviction["rows"])[:-1]
        out.append("  Recent decisions:" if eviction["recent"] else "  Recent decisions: (none)")
        for decision in eviction["recent"]:
            verdict = "applied" if decision["applied"] else "skipped"
            text = (
                f"#{decision['id']} {_utc(decision['last_seen_at'])} {decision['node_name']} "
                f"{decision['trigger']}/{decision['mode']} {verdict}: {decision['reason']}"
            )
            if decision["repeats"] > 1:
                text += f" (x{decision['repeats']} since {_utc(decision['created_at'])})"
            if decision["applied"]:
                text += (
                    f"; {decision['namespaces_affected']} namespace(s), "
                    f"{_size(decision['evicted_bytes'])} evicted, disk "
                    f"{_percent(decision['used_bytes'], decision['total_bytes'])} -> "
                    f"{_percent(decision['projected_used_bytes'], decision['total_bytes'])}"
                )
            if decision["cooldown_end_reason"]:
                text += (
                    f"; cooldown ended {_utc_or_none(decision['cooldown_ended_at'])} "
                    f"({decision['cooldown_end_reason']})"
                )
            out.append(f"    {self._colour('high' if decision['applied'] else '', text)}")
        out.append("")
        return out

    def _section(self, title: str, rows: list[tuple[str, Any]]) -> list[str]:
        out = [self.style.MIGRATE_HEADING(title)]
        out += self._rows(rows, indent="  ") if rows else ["  none"]
        out.append("")
        return out

    def _rows(self, rows: Iterable[tuple[str, Any]], *, indent: str) -> list[str]:
        rows = list(rows)
        width = max((len(label) for label, _ in rows), default=0) + 1
        return [
            f"{indent}{(label + ':').ljust(width)} {self._value(value)}" for label, value in rows
        ]

    def _value(self, value: Any) -> str:
        if isinstance(value, Counts):
            if not value.items:
                return f"{value.total} - {NONE}" if value.total is not None else NONE
            parts = ", ".join(
                f"{self._colour(key, key)}: {count}" for key, count in sorted(value.items.items())
            )
            return parts if value.total is None else f"{value.total} - {parts}"
        if isinstance(value, Level):
            return self._colour(value.level, value.text)
        if value is None:
            return NEVER
        if isinstance(value, bool):
            return "yes" if value else "no"
        return str(value)

    def _colour(self, key: str, text: str) -> str:
        if key in _RED:
            return self.style.ERROR(text)
        if key in _YELLOW:
            return self.style.WARNING(text)
        if key in _GREEN:
            return self.style.SUCCESS(text)
        return text


class Counts:
    """A total with counts per key: ``total - key: n, key: n`` (keys sorted)."""

    def __init__(self, total: int | None, items: Mapping[str, int]) -> None:
        self.total = total
        self.items = dict(items)

    def as_json(self) -> dict[str, Any]:
        return {"total": self.total, "counts": dict(sorted(self.items.items()))}


class Level:
    """A value whose colour follows a level name (a watermark, online/offline)."""

    def __init__(self, level: str, text: str) -> None:
        self.level = level
        self.text = text


# --------------------------------------------------------------------------- #
# The data
# --------------------------------------------------------------------------- #


def collect(*, extended: bool) -> dict[str, Any]:
    """The report: per section, ``rows`` of ``(label, value)`` for the text and ``data``
    with the same figures as typed values (``as_json`` makes it the JSON document).

    The nodes, their memory and the fleet's counts by state are the fleet page's read
    model (``dashboard.readmodels.fleet.fleet_overview``), restricted to the search
    nodes; the eviction figures are ``eviction.queries.eviction_overview`` (the
    evictions page's), the GitLab ones ``gitlab_sync.status`` (the GitLab page's).
    """
    now = clock.now()
    settings = app_settings.current()
    row = app_settings.load_row()
    overview = fleet_overview(now=now, settings=settings)
    # In the fleet's order (by name, zoekt.models.natural_key), as every page lists them.
    nodes = [node for node in overview.nodes if node.for_search]
    out: dict[str, Any] = {
        "now": now,
        "generated_at": _utc(now),
        "exact_code_search": _settings_section(row, settings),
        "nodes": _nodes_section(nodes, now),
        "indexing_status": _indexing_section(settings, overview, now),
        "eviction": _eviction(settings, eviction_overview(recent=RECENT_DECISIONS, now=now), now),
        "node_maintenance": _maintenance_section(overview),
        "gitlab": _gitlab_section(now),
        "feature_flags": {"rows": [], "data": {}},
        "feature_flags_default": {"rows": [], "data": {}},
    }
    if extended:
        out["node_details"] = [_node_details(node, now) for node in nodes]
    return out


#: The report's sections in the JSON document's order (``docs/zoekt_info.md``).
SECTIONS = (
    "exact_code_search",
    "nodes",
    "indexing_status",
    "eviction",
    "node_maintenance",
    "gitlab",
    "feature_flags",
    "feature_flags_default",
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Counts):
        return value.as_json()
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, Mapping):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return value


def as_json(report: Mapping[str, Any]) -> dict[str, Any]:
    """Each section's ``data``: snake_case keys, bytes and counts as integers, durations
    in seconds, booleans, times as ISO 8601 strings (``docs/zoekt_info.md``)."""
    out: dict[str, Any] = {"generated_at": _iso(report["now"])}
    for key in SECTIONS:
        out[key] = _jsonable(report[key]["data"])
    if "node_details" in report:
        out["node_details"] = [_jsonable(node["data"]) for node in report["node_details"]]
    return out


def _counts(counts: Mapping[str, int]) -> Counts:
    """Every state's count (zeros included) for the JSON; the text shows those present."""
    return Counts(sum(counts.values()), counts)


def _present(counts: Counts) -> Counts:
    return Counts(counts.total, {key: n for key, n in counts.items.items() if n})


def _maintenance_section(overview: FleetOverview) -> dict[str, Any]:
    """Nodes with a live shutdown record (docs/operations.md): the fleet overview's rows."""
    rows: list = [("Nodes in maintenance", overview.in_maintenance)]
    live = []
    for node in overview.nodes:
        record = node.shutdown
        if record is None:
            continue
        left = record.left
        if record.delay_seconds_left is not None:
            what = f"{_duration(record.delay_seconds_left)} of the delay left"
        elif left is not None:
            what = (
                f"{_count(left.indices, 'index', 'indices')}, {_size(left.bytes)} left, "
                f"{_count(left.moves_in_flight, 'move', 'moves')} in flight"
            )
        else:
            what = "-"
        target = f" to {record.target_node_name}" if record.target_node_name else ""
        rows.append(
            (
                f"  {node.name}",
                f"{record.type}{target}, {record.status.replace('_', ' ')}: {what} "
                f"(record {record.id}, by {record.requested_by}: {record.reason})",
            )
        )
        live.append(
            {
                "id": record.id,
                "node_id": record.node_id,
                "node_name": record.node_name,
                "node_online": record.node_online,
                "type": record.type,
                "status": record.status,
                "status_reason": record.status_reason or None,
                "reason": record.reason,
                "requested_by": record.requested_by,
                "requested_at": record.requested_at,
                "target_node_name": record.target_node_name,
                "delay_seconds_left": record.delay_seconds_left,
                "indices_left": None if left is None else left.indices,
                "left_bytes": None if left is None else left.bytes,
                "moves_in_flight": None if left is None else left.moves_in_flight,
                "eta_seconds": None if left is None else left.eta_seconds,
            }
        )
    return {"rows": rows, "data": {"nodes_in_maintenance": overview.in_maintenance, "live": live}}


def _gitlab_section(now: datetime) -> dict[str, Any]:
    """Following GitLab (docs/gitlab.md): the sweeps and the system hooks."""
    current = gitlab_status(now)
    sweep = current.last_sweep
    hooks = Counts(sum(current.hooks.values()), current.hooks)
    rows: list = [
        ("Sweep configured", current.configured),
        ("System hook configured", current.hooks_configured),
        (
            "Last complete sweep",
            _utc(current.last_complete_sweep_at) if current.last_complete_sweep_at else "never",
        ),
    ]
    if sweep is not None:
        rows += [
            ("Last sweep", f"{sweep['id']} {sweep['state']} ({sweep['phase']})"),
            ("Last sweep projects written", sweep["projects"]),
            ("Last sweep projects skipped", sweep["skipped"]),
            ("Last sweep projects removed", sweep["removed_projects"]),
        ]
        if sweep["error"]:
            rows.append(("Last sweep error", sweep["error"]))
    rows += [
        ("Hook events", hooks),
        ("Hook lag", _duration(current.hook_lag_seconds)),
    ]
    data = {
        "sweep_configured": current.configured,
        "system_hook_configured": current.hooks_configured,
        "last_complete_sweep_at": current.last_complete_sweep_at,
        "last_sweep": None
        if sweep is None
        else {
            "id": sweep["id"],
            "state": sweep["state"],
            "phase": sweep["phase"],
            "started_at": sweep["started_at"],
            "finished_at": sweep["finished_at"],
            "projects_written": sweep["projects"],
            "projects_skipped": sweep["skipped"],
            "projects_removed": sweep["removed_projects"],
            "requests": sweep["requests"],
            "error": sweep["error"] or None,
        },
        "hook_events": hooks,
        "hook_lag_seconds": current.hook_lag_seconds,
    }
    return {"rows": rows, "data": data}


#: The duration settings (GitLab's strings, and seconds), printed as their parsed seconds.
_DURATION_SETTINGS = {
    "zoekt_indexing_timeout": "indexing_timeout_seconds",
    "zoekt_eviction_sustain_period": "eviction_sustain_seconds",
    "zoekt_eviction_cooldown": "eviction_cooldown_seconds",
    "zoekt_rollout_retry_interval": "rollout_retry_interval_seconds",
    "zoekt_lost_node_threshold": "lost_node_threshold_seconds",
    "zoekt_node_restart_delay_seconds": "node_restart_delay_seconds",
}
_LABEL_UNIT = re.compile(r" \((bytes|seconds)\)$")


def _settings_section(row: ApplicationSetting, settings: app_settings.ZoektSettings) -> dict:
    from zoekt.admin import SETTINGS_FIELDS

    version = _version()
    rows: list[tuple[str, Any]] = [("Version", f"zoekt-control {version}")]
    for name in SETTINGS_FIELDS:
        label = str(ApplicationSetting._meta.get_field(name).verbose_name)
        value = getattr(row, name)
        if name == "zoekt_node_memory_budget_bytes":
            value = "(not set: memory planning off)" if value is None else _size(value)
        elif name in _DURATION_SETTINGS:
            # As parsed and in force (an unparsable value falls back to the default).
            seconds = getattr(settings, _DURATION_SETTINGS[name])
            value = "(off)" if seconds is None else _duration(seconds)
        elif value is None or value == "":
            value = "(not set)"
        # The unit a label names is the admin form's; the value here is written out.
        label = _LABEL_UNIT.sub("", label)
        rows.append((label[:1].upper() + label[1:], value))
    budget = settings.node_memory_budget_bytes
    ceiling = None if budget is None else budget // CONCURRENCY_FACTOR
    rows.append(
        (
            "Memory concurrency factor (constant)",
            f"{CONCURRENCY_FACTOR} (max memory per index: budget / {CONCURRENCY_FACTOR} = "
            f"{'-' if ceiling is None else _size(ceiling)})",
        )
    )
    low, high, critical = memory.memory_watermark_limits()
    rows.append(
        (
            "Memory watermarks (RSS / budget)",
            f"low {low:.0%}, high {high:.0%} (no new index), critical {critical:.0%}",
        )
    )
    data = {
        "version": version,
        "settings": dataclasses.asdict(settings),
        "memory_concurrency_factor": CONCURRENCY_FACTOR,
        "max_memory_per_index_bytes": ceiling,
        "memory_watermarks": {"low": low, "high": high, "critical": critical},
    }
    return {"rows": rows, "data": data}


def _nodes_section(nodes: list[NodeRow], now: datetime) -> dict[str, Any]:
    online = [node for node in nodes if node.online]
    last_seen = max((node.last_seen_at for node in nodes), default=None)
    reserved = Index.objects.aggregate(total=Sum("reserved_storage_bytes"))["total"] or 0
    usable = sum(node.usable_storage_bytes for node in nodes)
    indexed = sum(node.indexed_bytes for node in nodes)
    used = sum(node.used_bytes for node in nodes)
    total = sum(node.total_bytes for node in nodes)
    disk_levels = {level.value: 0 for level in NodeWatermark}
    memory_levels = {level.value: 0 for level in NodeWatermark} | {"unknown": 0}
    estimated = observed = reporting = 0
    for node in online:
        disk_levels[node.watermark.value] += 1
        entry = node.memory
        level = entry.memory_watermark
        memory_levels["unknown" if level is None else level.value] += 1
        if entry.rss_bytes is not None:
            estimated += entry.estimated_memory_bytes
            observed += entry.rss_bytes
            reporting += 1
    schema_version = Node.objects.for_search().maximum_schema_version(now)
    count = Counts(len(nodes), {"online": len(online), "offline": len(nodes) - len(online)})
    disk = Counts(len(online), disk_levels)
    memory_counts = Counts(len(online), memory_levels)
    rows = [
        ("Node count", count),
        (
            "Last seen at",
            None if last_seen is None else f"{_utc(last_seen)} ({_ago(now, last_seen)})",
        ),
        ("Max schema_version", schema_version),
        ("Storage reserved / usable", _ratio(reserved, usable)),
        ("Storage indexed / reserved", _ratio(indexed, reserved)),
        ("Storage used / total", _ratio(used, total)),
        ("Online node watermark levels", disk),
        ("Online node memory watermark levels", memory_counts),
        (
            "Memory estimated / observed RSS",
            f"{_size(estimated)} / {_size(observed)} over {reporting} online node(s) reporting "
            "webserver RSS",
        ),
    ]
    data = {
        "node_count": count,
        "last_seen_at": last_seen,
        "max_schema_version": schema_version,
        "storage_reserved_bytes": reserved,
        "storage_usable_bytes": usable,
        "storage_indexed_bytes": indexed,
        "storage_used_bytes": used,
        "storage_total_bytes": total,
        "online_node_watermark_levels": disk,
        "online_node_memory_watermark_levels": memory_counts,
        "memory_estimated_bytes": estimated,
        "memory_observed_rss_bytes": observed,
        "online_nodes_reporting_rss": reporting,
    }
    return {"rows": rows, "data": data}


def _indexing_section(
    settings: app_settings.ZoektSettings, overview: FleetOverview, now: datetime
) -> dict[str, Any]:
    interval = settings.rollout_retry_interval_seconds
    without = EnabledNamespace.objects.with_missing_indices()
    enabled = Counts(
        overview.enabled_namespaces,
        {
            "without_indices": without.count(),
            "rollout_blocked": without.with_rollout_blocked(interval, now).count(),
            "with_search_disabled": overview.enabled_namespaces
            - overview.search_enabled_namespaces,
        },
    )
    groups = Namespace.objects.top_level_groups().count()
    replicas = _counts(overview.replicas)
    indices = _counts(overview.indices)
    index_levels = _counts(overview.index_watermark_levels)
    repositories = _counts(overview.repositories)
    # Only the tasks of nodes that still exist (the fleet's read model counts them all).
    tasks = _by(Task.objects.join_nodes(), "state", Task.State)
    pending = _by(Task.objects.join_nodes().pending_or_processing(), "task_type", Task.TaskType)
    backlog, drain, drain_seconds = _backlog(overview, now)
    rows = [
        ("Group count", groups),
        (
            "EnabledNamespace count",
            Counts(
                enabled.total,
                {key.replace("_", " "): n for key, n in enabled.items.items()},
            ),
        ),
        ("Replicas count", _present(replicas)),
        ("Indices count", _present(indices)),
        ("Indices watermark levels", _present(index_levels)),
        ("Repositories count", _present(repositories)),
        ("Tasks count", _present(tasks)),
        ("Tasks pending/processing by type", _present(pending)),
        ("Indexing admission", settings.indexing_admission),
        ("Indexing backlog by priority", backlog),
        ("Indexing backlog expected drain time", drain),
    ]
    data = {
        "group_count": groups,
        "enabled_namespaces": enabled,
        "replicas": replicas,
        "indices": indices,
        "index_watermark_levels": index_levels,
        "repositories": repositories,
        "tasks": tasks,
        "tasks_pending_or_processing_by_type": pending,
        "indexing_admission": settings.indexing_admission,
        "indexing_backlog_by_priority": backlog,
        "indexing_backlog_drain_seconds": drain_seconds,
    }
    return {"rows": rows, "data": data}


#: The window over which the fleet's recent pace of finished tasks is measured.
DRAIN_WINDOW_SECONDS = 15 * 60


def _backlog(overview: FleetOverview, now: datetime) -> tuple[Counts, str, int | None]:
    """The nodes' pending tasks by admission priority (docs/scheduling.md), and how long
    they take to drain at the pace tasks finished over the last 15 minutes."""
    by_priority: dict[str, int] = {p.name.lower(): 0 for p in admission.Priority}
    for node in overview.nodes:
        for name, count in node.indexing.backlog.items():
            by_priority[name] += count
    total = sum(by_priority.values())
    done = Task.objects.filter(
        state=Task.State.DONE, updated_at__gte=now - timedelta(seconds=DRAIN_WINDOW_SECONDS)
    ).count()
    if not total:
        return Counts(0, by_priority), "nothing pending", 0
    if not done:
        return Counts(total, by_priority), "unknown (no task finished in 15 min)", None
    seconds = int(total * DRAIN_WINDOW_SECONDS / done)
    return Counts(total, by_priority), f"{_duration(seconds)} at the last 15 min's pace", seconds


def _eviction(
    settings: app_settings.ZoektSettings, overview: EvictionOverview, now: datetime
) -> dict[str, Any]:
    """The Eviction section: rows for the text, and the same figures as plain data."""
    low, high, critical = capacity.watermark_limits(app_settings.development_watermarks())
    over_high = [
        {
            "id": node.node_id,
            "name": node.node_name,
            "percent_used": node.percent_used,
            "over_high_seconds": node.over_high_seconds,
            "over_high": node.percent_used >= high,
            "cooldown_until": node.cooldown_until,
        }
        for node in overview.over_high
    ]
    cooling = [
        {
            "id": node.node_id,
            "name": node.node_name,
            "percent_used": node.percent_used,
            "cooldown_until": node.cooldown_until,
            "cooldown_seconds_left": max(0, int((node.cooldown_until - now).total_seconds())),
        }
        for node in overview.cooling
    ]
    applied = {f"{t}/{m}": count for (t, m), count in overview.applied.items()}
    affected = {f"{t}/{m}": count for (t, m), count in overview.namespaces_affected.items()}
    skipped = {f"{t}/{r}": count for (t, r), count in overview.skipped.items()}
    kept_down_to = capacity.hysteresis_floor(high)
    rows: list[tuple[str, Any]] = [
        ("Node-level eviction", "on" if settings.node_level_eviction_enabled else "off"),
        (
            "Safeguards",
            "on"
            if settings.node_eviction_safeguards
            else Level("high", "off (GitLab's legacy behaviour)"),
        ),
        ("Sustain period", _duration(settings.eviction_sustain_seconds)),
        ("Cooldown", _duration(settings.eviction_cooldown_seconds)),
        ("Order", settings.eviction_order),
        (
            "Watermarks (disk)",
            f"low {low:.0%}, high {high:.0%}, critical {critical:.0%}; sustain clock kept "
            f"down to {kept_down_to:.0%}",
        ),
        (
            "Nodes over high watermark",
            _listing(
                f"{n['name']} {n['percent_used'] * 100:.1f}% for "
                f"{_duration(n['over_high_seconds'])}"
                + ("" if n["over_high"] else " (under high, clock kept)")
                + (
                    ""
                    if n["cooldown_until"] is None
                    else f", cooling until {_utc(n['cooldown_until'])}"
                )
                for n in over_high
            ),
        ),
        (
            "Nodes in cooldown",
            _listing(
                f"{n['name']} until {_utc(n['cooldown_until'])} "
                f"({_duration(n['cooldown_seconds_left'])} left)"
                for n in cooling
            ),
        ),
        ("Applied decisions", Counts(sum(applied.values()), applied)),
        ("Namespaces affected", Counts(sum(affected.values()), affected)),
        ("Skipped decisions", Counts(sum(skipped.values()), skipped)),
    ]
    recent = [
        {
            "id": row.id,
            "created_at": row.created_at,
            "last_seen_at": row.last_seen_at,
            "repeats": row.repeats,
            "node_id": row.node_id,
            "node_name": row.node_name,
            "trigger": row.trigger,
            "mode": row.mode,
            "reason": row.reason,
            "applied": row.applied_at is not None,
            "namespaces_affected": row.namespaces_affected,
            "evicted_bytes": row.chosen_bytes,
            "used_bytes": row.used_bytes,
            "total_bytes": row.total_bytes,
            "projected_used_bytes": row.projected_used_bytes,
            "cooldown_ended_at": row.cooldown_ended_at,
            "cooldown_end_reason": row.cooldown_end_reason or None,
        }
        for row in overview.recent
    ]
    data = {
        "settings": {
            "node_level_eviction_enabled": settings.node_level_eviction_enabled,
            "node_eviction_safeguards": settings.node_eviction_safeguards,
            "eviction_sustain_seconds": settings.eviction_sustain_seconds,
            "eviction_cooldown_seconds": settings.eviction_cooldown_seconds,
            "eviction_order": settings.eviction_order,
            "watermarks": {
                "low": low,
                "high": high,
                "critical": critical,
                "sustain_clock_kept_down_to": kept_down_to,
            },
        },
        "nodes_over_high_watermark": over_high,
        "nodes_in_cooldown": cooling,
        "applied": applied,
        "namespaces_affected": affected,
        "skipped": skipped,
        "recent": recent,
    }
    return {"rows": rows, "data": data, "recent": recent}


def _listing(items: Iterable[str]) -> str:
    items = list(items)
    return f"{len(items)} - {'; '.join(items)}" if items else "0"


def _by(queryset, field: str, choices) -> Counts:
    """Rows of ``queryset`` by ``field``: every choice's count, zeros included."""
    rows = queryset.order_by().values(field).annotate(n=Count("pk")).values_list(field, "n")
    items: dict[str, int] = {choice.label: 0 for choice in choices}
    for value, count in rows:
        try:
            label = choices(value).label
        except ValueError:
            label = str(value)
        items[label] = items.get(label, 0) + count
    return Counts(sum(items.values()), items)


def _node_details(node: NodeRow, now: datetime) -> dict[str, Any]:
    entry = node.memory
    disk = node.watermark
    mem_level = entry.memory_watermark
    memory_value: Any
    if entry.memory_budget_bytes is None:
        memory_value = "- (no memory budget: zoekt_node_memory_budget_bytes is not set)"
    elif entry.memory_percent_used is None:
        memory_value = (
            f"- (no webserver RSS reported; budget {_size(entry.memory_budget_bytes)}, "
            f"{entry.budget_source})"
        )
    else:
        note = "" if entry.memory_planning else "; not enforced: the budget setting is not set"
        excluded = "; takes no new index" if entry.excluded_from_placement else ""
        memory_value = Level(
            mem_level.value,
            f"{entry.memory_percent_used * 100:.1f}% of {_size(entry.memory_budget_bytes)} "
            f"({entry.budget_source} budget) - {mem_level.value}{excluded}{note}",
        )
    indexer_rss = node.indexer_rss_bytes
    rss_line = "(not reported)" if entry.rss_bytes is None else _size(entry.rss_bytes)
    rss_line += f" | estimated for its indices: {_size(entry.estimated_memory_bytes)}"
    if entry.observed_to_estimated is not None:
        rss_line += f" (observed {entry.observed_to_estimated:.2f}× the estimate)"
    status = "online" if node.online else "offline"
    rows: list[tuple[str, Any]] = [
        ("Status", Level(status, status.capitalize())),
        ("Last seen at", f"{_utc(node.last_seen_at)} ({_ago(now, node.last_seen_at)})"),
        (
            "Disk utilization",
            Level(disk.value, f"{node.storage_percent_used * 100:.1f}% - {disk.value}"),
        ),
        ("Memory utilization", memory_value),
        ("Unclaimed storage", _size(node.unclaimed_storage_bytes)),
        ("Zoekt version", node.version or NEVER),
        ("Schema version", node.schema_version),
        ("Indexer RSS", "(not reported)" if indexer_rss is None else _size(indexer_rss)),
        ("Webserver RSS", rss_line),
        (
            "Estimated memory",
            f"{_size(entry.estimated_memory_bytes)} = repository {_size(entry.repository_bytes)} "
            f"of its ready and pre-ready indices × memory_ratio {entry.memory_ratio:g}",
        ),
        ("Shards loaded", "(not reported)" if entry.shards_loaded is None else entry.shards_loaded),
        (
            "Observed memory ratio",
            _observed(
                entry.observed_memory_ratio, "RSS / used storage of ready indices; not memory_ratio"
            ),
        ),
        (
            "RSS per repository byte",
            _observed(
                entry.rss_per_repository_byte,
                "RSS / repository of ready indices; what memory_ratio estimates",
            ),
        ),
    ]
    data = {
        "id": node.id,
        "name": node.name,
        "online": node.online,
        "last_seen_at": node.last_seen_at,
        "storage_percent_used": node.storage_percent_used,
        "disk_watermark": disk.value,
        "unclaimed_storage_bytes": node.unclaimed_storage_bytes,
        "version": node.version,
        "schema_version": node.schema_version,
        "indexer_rss_bytes": indexer_rss,
        "memory": entry.as_dict(),
    }
    return {"id": node.id, "name": node.name, "rows": rows, "data": data}


def _observed(value: float | None, what: str) -> str:
    if value is None:
        return f"- (nothing to observe; {what})"
    return f"{value:.3f} ({what})"


# --------------------------------------------------------------------------- #
# Formatting
# --------------------------------------------------------------------------- #


def _version() -> str:
    try:
        return importlib.metadata.version("zoekt-control")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return str(getattr(django_settings, "SPECTACULAR_SETTINGS", {}).get("VERSION", "unknown"))


def _utc(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _utc_or_none(value: datetime | None) -> str:
    return "None" if value is None else _utc(value)


def _iso(value: datetime | None) -> str | None:
    """ISO 8601 in UTC (``2026-03-01T12:00:00+00:00``), for the JSON document."""
    return None if value is None else value.astimezone(UTC).isoformat()


def _ago(now: datetime, then: datetime) -> str:
    seconds = int((now - then).total_seconds())
    if seconds < 0:
        return "in the future"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''} ago"
    return f"{seconds} second{'s' if seconds != 1 else ''} ago"


def _duration(seconds: int | None) -> str:
    """``3 h 12 min``, ``2 d 4 h``, ``45 s``: the dashboard's form."""
    return NEVER if seconds is None else duration(seconds)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _percent(part: int | None, whole: int) -> str:
    return "-" if part is None or not whole else f"{part / whole * 100:.1f}%"


def _size(value: int | None) -> str:
    """Binary units, one decimal (``136.0 GiB``); bytes below 1 KiB; sign kept."""
    if value is None:
        return NEVER
    size = abs(value)
    sign = "-" if value < 0 else ""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor:
            return f"{sign}{size / factor:.1f} {unit}"
    return f"{sign}{size} B"


def _ratio(part: int, whole: int) -> str:
    share = f"{part / whole * 100:.1f}%" if whole else "-"
    return f"{_size(part)} / {_size(whole)} ({share})"
