"""The fleet's desired balance: where every index should be, and the moves that get there.

    manage.py zoekt_balance                  # per node now → desired, the moves, converged?
    manage.py zoekt_balance --json           # the same as JSON: GET /api/v1/balance's body
    manage.py zoekt_balance --margin 0.1     # another margin (default 0.05)
    manage.py zoekt_balance --max-moves 20   # plan at most 20 moves
    manage.py zoekt_balance --explain 412    # one index: where it is, where the balance
                                             # wants it and why, and per node yes or no
    manage.py zoekt_balance --explain 412 --json   # GET /api/v1/indices/412/balance's body

Read-only: nothing is started or written; the moves are what the rebalance
reconciler (``eviction.rebalance``) starts, a few at a time (docs/balance.md). The
figures are dominant shares: per node the larger of its disk share and, while memory
planning is on, its memory share. Progress of a long computation goes to stderr
(``-v 0`` silences it).
"""

from __future__ import annotations

import json
import time

from django.core.management.base import BaseCommand, CommandError

from eviction.balance_data import BalanceInput
from eviction.rebalance import balance_report, index_balance_report
from planner.balance import YES, Balance, BalanceError, IndexExplain, NodeFigures
from zoekt.operator_errors import ObjectNotFound
from zoekt.reasons import Reason
from zoekt.units import binary_size


class Command(BaseCommand):
    help = (
        "Show the fleet's desired balance: per node now and desired, the moves that would "
        "get there, and whether the fleet has converged. Starts nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the balance as JSON")
        parser.add_argument(
            "--margin",
            type=float,
            default=None,
            help="a move must leave its target this share below its source (default 0.05)",
        )
        parser.add_argument(
            "--max-moves", type=int, default=None, help="plan at most this many moves"
        )
        parser.add_argument(
            "--explain",
            type=int,
            default=None,
            metavar="INDEX_ID",
            help="explain one index: where it is, where the desired balance wants it and "
            "why, and for every other node whether it could go there now",
        )

    def handle(self, *args, **options):
        progress = _Progress(self.stderr, options["verbosity"])
        if options["explain"] is not None:
            self._explain(options, progress)
            return
        try:
            fleet, balance, report = balance_report(
                margin=options["margin"], max_moves=options["max_moves"], progress=progress
            )
        except BalanceError as error:
            raise CommandError(_option_error(error)) from error
        progress.finish()
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2, sort_keys=True))
            return
        self.stdout.write(render(fleet, balance, report["reconciler"]))

    def _explain(self, options, progress: _Progress) -> None:
        try:
            _fleet, explain, report = index_balance_report(
                options["explain"],
                margin=options["margin"],
                max_moves=options["max_moves"],
                progress=progress,
            )
        except BalanceError as error:
            raise CommandError(_option_error(error)) from error
        except ObjectNotFound as error:
            raise CommandError(f"--explain: {error.message}") from error
        progress.finish()
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2, sort_keys=True))
            return
        self.stdout.write(render_explain(explain, report["namespace_id"], report["reconciler"]))


def _option_error(error: BalanceError) -> str:
    """``--margin: must be ...`` for an option the command passed, else the field."""
    if error.field.startswith("options."):
        return f"--{error.field.removeprefix('options.').replace('_', '-')}: {error.message}"
    return str(error)


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _figures(now: NodeFigures, desired: NodeFigures, memory: bool) -> list[str]:
    pairs = [(now.disk_share, desired.disk_share)]
    if memory:
        pairs.append((now.memory_share, desired.memory_share))
    pairs.append((now.dominant_share, desired.dominant_share))
    cells = [f"{_share(before)} → {_share(after)}" for before, after in pairs]
    return [*cells, f"{now.index_count} → {desired.index_count}"]


def _node_rows(balance: Balance, why_not: dict[int, str | None]) -> list[str]:
    memory = balance.options.memory
    header = ["node", "receives", "disk", *(["memory"] if memory else []), "dominant", "indices"]
    rows = [header]
    for entry in balance.nodes:
        receives = "yes" if entry.receiving else f"no: {why_not.get(entry.node_id)}"
        node = f"{entry.name} ({entry.node_id})"
        rows.append([node, receives, *_figures(entry.now, entry.desired, memory)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return [
        "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in rows
    ]


def render(fleet: BalanceInput, balance: Balance, reconciler: dict | None = None) -> str:
    """The balance for an operator: the verdict, the bounds, per node, the moves, and what
    the reconciler is doing about it."""
    options = balance.options
    names = {node.id: node.name for node in fleet.nodes}
    why_not = {node.id: node.not_receiving_reason for node in fleet.nodes if not node.receiving}
    memory = "on" if options.memory else "off"
    lines = [
        f"Desired balance (margin {options.margin:.0%}, disk ceiling {options.disk_ceiling:.0%}, "
        f"memory {memory}): {_count(len(fleet.nodes), 'node')}, "
        f"{_count(len(fleet.indices), 'index', 'indices')}.",
    ]
    if balance.converged:
        lines.append("Converged: yes. No move is needed.")
    else:
        lines.append(
            f"Converged: no. {_count(len(balance.moves), 'move')}, "
            f"{binary_size(balance.bytes_to_move)} to move; "
            f"{_count(len(balance.misplaced), 'index', 'indices')} not where "
            f"{'it' if len(balance.misplaced) == 1 else 'they'} should be."
        )
    bounds = balance.over_lower_bound()
    lines.append(
        f"Busiest node over the lower bound ({_share(balance.lower_bound)}): now "
        f"{_ratio(bounds['now'])}, when converged {_ratio(bounds['desired'])}."
    )
    if not balance.complete:
        lines.append(f"The plan stops at the cap of {options.max_moves} moves; more would qualify.")
    lines += ["", "Per node, now → desired:", *_node_rows(balance, why_not)]
    if balance.moves:
        lines += ["", "Moves, in order:"]
    for k, move in enumerate(balance.moves, 1):
        namespace = fleet.namespace_ids.get(move.index_id)
        lines.append(
            f"  {k}. index {move.index_id} (namespace {namespace}), "
            f"{binary_size(move.bytes)}: {names[move.from_node_id]} ({move.from_node_id}) → "
            f"{names[move.to_node_id]} ({move.to_node_id}); {move.reason}: source "
            f"{_share(move.source_before)} → {_share(move.source_after)}, target "
            f"{_share(move.target_before)} → {_share(move.target_after)}, busiest "
            f"{_share(move.busiest_before)} → {_share(move.busiest_after)}"
        )
    for index_id in balance.held_back:
        lines.append(
            f"  index {index_id} is held back where the plan puts it: it could only move on by "
            "moving twice; the next computation moves it."
        )
    lines += ["", *_reconciler_lines(reconciler)]
    return "\n".join(lines)


#: Why the desired balance leaves an index where it is, in words (the other codes are
#: the index's own refusals, listed with it).
STAYS = {
    Reason.BALANCE_NO_TARGET_QUALIFIES: "no other node could take it now",
    Reason.BALANCE_OTHER_MOVES_PREFERRED: "the plan's other moves balance its node first",
    Reason.BALANCE_PLAN_CAPPED: "the plan stops at its cap of moves before it",
}


def render_explain(explain: IndexExplain, namespace_id: int | None, reconciler: dict) -> str:
    """One index for an operator: where it is, where the desired balance wants it and why,
    and per other node yes or no for a move there now, with the codes refusing it."""
    e = explain
    lines = [
        f"Index {e.index_id} (namespace {namespace_id}), {binary_size(e.bytes)}, memory "
        f"estimate {binary_size(e.memory_bytes)}: on {e.node_name} ({e.node_id}), at "
        f"{_share(e.node_share)} ({_share(e.node_share_without)} without it); lower bound "
        f"{_share(e.lower_bound)}, margin {e.margin:.0%}.",
    ]
    move = e.move
    if move is not None:
        lines.append(
            f"Desired: {e.desired_node_name} ({e.desired_node_id}), move {e.move_order} of "
            f"{e.moves_planned}; {move.reason}: source {_share(move.source_before)} → "
            f"{_share(move.source_after)}, target {_share(move.target_before)} → "
            f"{_share(move.target_after)}, busiest {_share(move.busiest_before)} → "
            f"{_share(move.busiest_after)}."
        )
        if e.held_back:
            lines.append("Held back there: it would move on; the next computation moves it.")
    else:
        words = STAYS.get(e.stays_reason or "")
        lines.append(f"Desired: stays; {e.stays_reason}" + (f" ({words})." if words else "."))
    if e.index_refusals:
        lines.append(f"It may move to no node now: {', '.join(e.index_refusals)}.")
    rows = [["node", "move now", "share now → with it", "refused by"]]
    for entry in e.nodes:
        why = ", ".join(entry.refusals) or ("the desired node" if entry.desired else "")
        rows.append(
            [
                f"{entry.name} ({entry.node_id})",
                entry.decision,
                f"{_share(entry.share_now)} → {_share(entry.share_with)}",
                why,
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    yes = sum(1 for entry in e.nodes if entry.decision == YES)
    lines += [
        "",
        f"Other nodes, for a move now ({yes} of {len(e.nodes)} could take it):",
        *(
            "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
            for row in rows
        ),
        "",
        *_reconciler_lines(reconciler),
    ]
    return "\n".join(lines)


def _reconciler_lines(reconciler: dict | None) -> list[str]:
    if reconciler is None:
        return ["Nothing was started."]
    if not reconciler["enabled"]:
        state = "off (zoekt_rebalance_enabled)"
    elif reconciler["standing_aside"]:
        state = f"standing aside: {reconciler['standing_aside_reason']}"
    else:
        state = f"on, at most {reconciler['max_moves']} moves at once"
    return [
        f"Reconciler: {state}; {_count(reconciler['moves_in_flight'], 'move')} in flight.",
        "Nothing was started by this command.",
    ]


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _ratio(entry: dict[str, float | None]) -> str:
    ratio = entry["ratio"]
    busiest = entry["busiest"]
    if ratio is None:
        return f"{_share(busiest)} (no bound)"
    return f"{ratio:.2f}× ({_share(busiest)})"


class _Progress:
    """A progress line on stderr for a long computation: after a second, once a second."""

    def __init__(self, stream, verbosity: int, *, delay: float = 1.0) -> None:
        self.stream = stream
        self.verbosity = verbosity
        self.started = time.monotonic()
        self.delay = 0.0 if verbosity >= 2 else delay
        self.last = float("-inf")
        self.shown = False

    def __call__(self, planned: int) -> None:
        now = time.monotonic()
        if self.verbosity <= 0 or now - self.started < self.delay or now - self.last < 1.0:
            return
        self.last = now
        self.shown = True
        self.stream.write(f"computing the desired balance: moves planned so far: {planned:,}")
        self.stream.flush()

    def finish(self) -> None:
        if self.shown:
            elapsed = time.monotonic() - self.started
            self.stream.write(f"computed the desired balance in {elapsed:.1f} s")
