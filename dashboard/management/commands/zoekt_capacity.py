"""How many nodes the fleet needs, now and later, and what a change would do.

    manage.py zoekt_capacity                          # status now, in 30 and 90 days
    manage.py zoekt_capacity --json                   # GET /api/v1/capacity's body
    manage.py zoekt_capacity --add-nodes 2 [--disk-gib 500] [--memory-budget-gib 64]
    manage.py zoekt_capacity --remove 3               # node id; repeat for several
    manage.py zoekt_capacity --replicas 2

The forecast fits the growth of the node history (disk and the memory estimate) over
``--window-days`` (7). A what-if runs the real planner and the desired balance on a
copy of the fleet and prints the per-node figures and the moves; nothing is written
(docs/capacity.md, "Provisioning and what-if"). Progress goes to stderr.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError

from dashboard.capacity import capacity_report
from planner.balance import BalanceError
from planner.provisioning import WhatIf
from zoekt.capacity import GIB
from zoekt.units import binary_size


def _size(value: int | None) -> str:
    return "—" if value is None else binary_size(value)


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in rows
    ]


def _when(mark: dict) -> str:
    if mark["days"] is None:
        return "not growing"
    if mark["days"] == 0:
        return "already reached"
    at = datetime.fromtimestamp(mark["at"], tz=UTC)
    return f"in {mark['days']:.1f} days ({at:%Y-%m-%d %H:%M} UTC)"


def render(report: dict) -> str:
    fleet = report["fleet"]
    growth = report["growth"]
    memory = fleet["memory_budget_bytes"] is not None
    lines = [
        f"Provisioning: {report['status']}. {fleet['nodes']} nodes, "
        f"{_size(fleet['disk_bytes'])} disk, {_size(fleet['used_bytes'])} used; median node "
        f"{_size(fleet['node_size']['disk_bytes'])}"
        + (f", {_size(fleet['node_size']['memory_budget_bytes'])} memory" if memory else "")
        + f"; replicas {fleet['replicas']} (factor {fleet['replica_factor']:.2f}).",
        f"Growth over {growth['window_days']:g} days ({growth['samples']} samples): "
        + (
            "not enough history"
            if growth["used_bytes_per_day"] is None
            else f"disk {_size(round(growth['used_bytes_per_day']))}/day"
            + (
                f", memory {_size(round(growth['memory_bytes_per_day'] or 0))}/day"
                if memory
                else ""
            )
        )
        + ".",
        "",
    ]
    header = ["in", "disk demand", "share", *(["memory", "share"] if memory else [])]
    header += ["nodes needed", "status", "recommendation"]
    rows = [header]
    for h in report["horizons"]:
        row = ["now" if h["days"] == 0 else f"{h['days']} days"]
        row += [_size(h["disk_demand_bytes"]), _share(h["disk_share"])]
        if memory:
            row += [_size(h["memory_demand_bytes"]), _share(h["memory_share"])]
        needed = h["nodes_needed"]
        row += [
            "—" if needed is None else f"{needed} of {h['nodes_present']}",
            h["status"],
            h["recommendation"],
        ]
        rows.append(row)
    lines += _table(rows)
    lines.append("")
    for mark in report["low_watermark"]:
        lines.append(
            f"Low watermark ({mark['watermark']:.0%}) on {mark['dimension']}: now "
            f"{_share(mark['share_now'])}, {_when(mark)}."
        )
    if report["what_if"] is not None:
        lines += ["", *_what_if_lines(report["what_if"])]
    return "\n".join(lines)


def _what_if_lines(w: dict) -> list[str]:
    change = w["change"]
    parts = []
    if change["add_nodes"]:
        parts.append(f"add {change['add_nodes']} nodes")
    if change["remove_node_ids"]:
        ids = change["remove_node_ids"]
        parts.append(f"remove node{'s' if len(ids) > 1 else ''} " + ", ".join(map(str, ids)))
    if change["replicas"]:
        parts.append(f"{change['replicas']} replicas")
    after = w["provisioning_after"]
    lines = [
        f"What if: {'; '.join(parts) or 'no change'}. Nothing was written.",
        f"  {w['move_count']} moves, {_size(w['bytes_to_move'])} to move; "
        f"{len(w['builds'])} copies to build, {_size(w['bytes_to_build'])}; "
        f"{len(w['unplaced'])} indices with no place; status after: {after['status']}.",
        "",
    ]
    rows = [["node", "disk before → after", "dominant before → after", "indices"]]
    for n in w["nodes"]:
        b, a = n["before"] or {}, n["after"] or {}
        rows.append(
            [
                f"{n['name']} ({n['node_id']})"
                + ("" if n["before"] else " new")
                + ("" if n["after"] else " removed"),
                f"{_share(b.get('disk_share'))} → {_share(a.get('disk_share'))}",
                f"{_share(b.get('dominant_share'))} → {_share(a.get('dominant_share'))}",
                f"{b.get('index_count', 0)} → {a.get('index_count', 0)}",
            ]
        )
    lines += _table(rows)
    if w["moves"]:
        lines += ["", "  Moves, in order:"]
    for k, m in enumerate(w["moves"], 1):
        lines.append(
            f"  {k}. index {m['index_id']}, {_size(m['bytes'])}: node {m['from_node_id']} → "
            f"{m['to_node_id']} ({m['reason']})"
        )
    for m in w["unplaced"]:
        lines.append(f"  index {m['index_id']} on node {m['from_node_id']}: {m['reason']}")
    return lines


class Command(BaseCommand):
    help = (
        "Show the provisioning status now and in 30 and 90 days, and what adding or "
        "removing nodes or changing the replicas would do. Starts nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--add-nodes", type=int, default=0, help="add this many nodes")
        parser.add_argument("--disk-gib", type=float, help="disk of an added node (GiB)")
        parser.add_argument(
            "--memory-budget-gib", type=float, help="memory budget of an added node (GiB)"
        )
        parser.add_argument(
            "--remove", type=int, action="append", default=[], help="remove this node (id)"
        )
        parser.add_argument("--replicas", type=int, help="replicas of every namespace")
        parser.add_argument(
            "--window-days", type=float, default=7.0, help="history the growth is fitted on"
        )

    def handle(self, *args, **options):
        change = _change(options)
        started = time.monotonic()
        if change is not None and options["verbosity"] > 0:
            self.stderr.write("running the planner and the desired balance on a copy ...")
        try:
            report = capacity_report(change, window_days=options["window_days"])
        except BalanceError as error:
            raise CommandError(str(error)) from error
        if change is not None and options["verbosity"] > 0:
            self.stderr.write(f"done in {time.monotonic() - started:.1f} s")
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2, sort_keys=True))
            return
        self.stdout.write(render(report))


def _change(options) -> WhatIf | None:
    if options["add_nodes"] < 0:
        raise CommandError("--add-nodes: must be at least 0")
    if options["replicas"] is not None and options["replicas"] < 1:
        raise CommandError("--replicas: must be at least 1")
    if options["window_days"] <= 0:
        raise CommandError("--window-days: must be above 0")
    for name in ("disk_gib", "memory_budget_gib"):
        if options[name] is not None and options[name] <= 0:
            raise CommandError(f"--{name.replace('_', '-')}: must be above 0")
    if not (options["add_nodes"] or options["remove"] or options["replicas"]):
        return None
    return WhatIf(
        add_nodes=options["add_nodes"],
        disk_bytes=None if options["disk_gib"] is None else int(options["disk_gib"] * GIB),
        memory_budget_bytes=(
            None
            if options["memory_budget_gib"] is None
            else int(options["memory_budget_gib"] * GIB)
        ),
        remove_node_ids=tuple(options["remove"]),
        replicas=options["replicas"],
    )
