"""Moves an operator starts by hand.

    manage.py zoekt_move --resplit ROOT_NAMESPACE_ID            # plan and start
    manage.py zoekt_move --resplit ROOT_NAMESPACE_ID --dry-run  # the plan only
    manage.py zoekt_move --resplit ROOT_NAMESPACE_ID --index 42 # that index, not the hottest
    manage.py zoekt_move --json ...                             # the plan as JSON

A re-split re-plans one index of the namespace (its hottest by memory
estimate, unless ``--index`` names one) with the planner, memory-aware, and
moves towards that layout range by range (``eviction.resplit``): each
carve is built on its node while the index serves, then swapped in. The
first carve starts at once when the move throttles allow; the next one
starts at the swap of the one before. Follow them on the dashboard's Moves
page.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from eviction import moves, resplit
from zoekt.models import Node
from zoekt.units import binary_size


class Command(BaseCommand):
    help = "Re-split a hot namespace with moves: no reindex window, no dark minute."

    def add_arguments(self, parser):
        parser.add_argument(
            "--resplit", metavar="ROOT_NAMESPACE_ID", required=True, help="the root namespace id"
        )
        parser.add_argument("--index", type=int, help="the index to re-split (default: hottest)")
        parser.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
        parser.add_argument("--json", action="store_true", help="print the plan as JSON")

    def handle(self, *args, **options):
        try:
            root = int(options["resplit"])
        except ValueError as error:
            value = options["resplit"]
            raise CommandError(f"--resplit: {value!r} is not a namespace id") from error
        try:
            if options["dry_run"]:
                plan = resplit.plan_resplit(root, index_id=options["index"])
            else:
                plan = moves.start_resplit(root, index_id=options["index"])
        except resplit.ResplitError as error:
            raise CommandError(f"namespace {root}: {error}") from error
        if options["json"]:
            self.stdout.write(json.dumps(plan.as_dict(), indent=2, sort_keys=True))
            return
        self.stdout.write(self._text(plan, dry_run=options["dry_run"]))

    def _text(self, plan: resplit.ResplitPlan, *, dry_run: bool) -> str:
        names = dict(
            (node.id, node.name)
            for node in Node.objects.filter(
                id__in={plan.source_node_id, *(p.node_id for p in plan.pieces)}
            )
        )

        def node(node_id: int) -> str:
            return f"node {node_id} ({names.get(node_id) or '?'})"

        def span(lo, hi) -> str:
            return f"{'…' if lo is None else lo}–{'…' if hi is None else hi}"

        lines = [
            f"Re-split of index {plan.source_index_id} of namespace {plan.namespace_id} "
            f"on {node(plan.source_node_id)}: {len(plan.pieces)} piece(s)."
        ]
        for i, piece in enumerate(plan.pieces):
            where = "stays on" if i == plan.kept else "to"
            ids = span(piece.project_namespace_id_from, piece.project_namespace_id_to)
            lines.append(
                f"  piece {i + 1}: project namespaces {ids}, "
                f"estimate {binary_size(piece.estimated_memory_bytes)}, {where} "
                f"{node(piece.node_id) if i != plan.kept else node(plan.source_node_id)}"
            )
        if not plan.carves:
            lines.append("Nothing to carve: the plan keeps the index whole.")
        for i, carve in enumerate(plan.carves):
            ids = span(carve.project_namespace_id_from, carve.project_namespace_id_to)
            target = node(carve.node_id)
            lines.append(f"  carve {i + 1}: {ids} ({carve.end} of the range) to {target}")
        for warning in plan.warnings:
            lines.append(f"  warning: {warning}")
        if dry_run:
            lines.append("This was a dry run: nothing started.")
        elif plan.move_id is not None:
            lines.append(f"Started: move {plan.move_id} (the next carve starts at its swap).")
        return "\n".join(lines)
