"""Moves an operator starts by hand.

    manage.py zoekt_move --index INDEX_ID --to NODE [--reason "..."] [--by NAME] [--json]
    manage.py zoekt_move --resplit ROOT_NAMESPACE_ID            # plan and start at once
    manage.py zoekt_move --resplit ROOT_NAMESPACE_ID --dry-run  # the plan only
    manage.py zoekt_move --resplit ROOT_NAMESPACE_ID --index 42 # index id 42, not the hottest
    manage.py zoekt_move --json ...                             # the plan (or the move) as JSON

Two modes, ``--index`` shared. ``--to`` moves one index to the named node
(its id or the name it reports; ``eviction.manual``, the API's ``POST
/api/v1/indices/<id>/move``): an ordinary move, built on that node while
the index serves and swapped in once ready, recorded with the operator's
name (``--by``, default the login name) and ``--reason``; refused with a
stable code and a sentence, nothing written, when the index or the node
cannot take part (docs/operations.md, "Moving one index by hand").

A re-split re-plans one index of the namespace (its hottest by memory
estimate, unless ``--index`` names one) with the planner, memory-aware, and
moves towards that layout range by range (``eviction.resplit``): each
carve is built on its node while the index serves, then swapped in. The
first carve starts at once when the move throttles allow; the next one
starts at the swap of the one before. Follow them on the dashboard's Moves
page.
"""

from __future__ import annotations

import getpass
import json

from django.core.management.base import BaseCommand, CommandError

from eviction import manual, moves, resplit
from zoekt import shutdowns
from zoekt.audit import Actor
from zoekt.models import Node
from zoekt.operator_actions import OperatorError, error_text
from zoekt.units import binary_size, project_namespace_range

USAGE = "give --index ID --to NODE (a move by hand) or --resplit ROOT_NAMESPACE_ID (a re-split)"


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


class Command(BaseCommand):
    help = (
        "Move one index to a named node (--index INDEX_ID --to NODE), or re-split a hot "
        "namespace (--resplit ROOT_NAMESPACE_ID), with moves: no reindex window, no dark "
        "minute. Nothing asks for confirmation: without --dry-run the first move starts at once "
        "(when the move throttles allow), so look at a re-split's plan with --dry-run first."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--resplit",
            metavar="ROOT_NAMESPACE_ID",
            help="re-split an index of this root namespace; without --dry-run its first move "
            "starts at once",
        )
        parser.add_argument(
            "--index",
            type=int,
            metavar="INDEX_ID",
            help="the id of the index (zoekt_indices.id, as the dashboard shows it) to move "
            "(--to) or re-split (default: the namespace's hottest)",
        )
        parser.add_argument("--to", metavar="NODE", help="move --index to this node (id or name)")
        parser.add_argument("--reason", default="", help="why, for the move's record (--to)")
        parser.add_argument("--by", default=None, help="the operator's name (--to; default: login)")
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="print the re-split's plan and start nothing (without it, the first move "
            "starts at once)",
        )
        parser.add_argument("--json", action="store_true", help="print the plan as JSON")

    def handle(self, *args, **options):
        if options["to"] is not None:
            return self._move_by_hand(options)
        if options["resplit"] is None:
            raise CommandError(USAGE)
        if options["reason"] or options["by"] is not None:
            raise CommandError("--reason and --by are for a move by hand (--index ID --to NODE)")
        try:
            root = int(options["resplit"])
        except ValueError as error:
            value = options["resplit"]
            raise CommandError(f"--resplit: {value!r} is not a namespace id") from error
        try:
            if options["dry_run"]:
                plan = resplit.plan_resplit(root, index_id=options["index"])
            else:
                plan = moves.start_resplit(root, index_id=options["index"], actor=Actor.command())
        except resplit.ResplitError as error:
            raise CommandError(f"namespace {root}: {error}") from error
        if options["json"]:
            self.stdout.write(json.dumps(plan.as_dict(), indent=2, sort_keys=True))
            return
        self.stdout.write(self._text(plan, dry_run=options["dry_run"]))

    def _move_by_hand(self, options) -> None:
        if options["resplit"] is not None:
            raise CommandError(f"--to and --resplit are two modes: {USAGE}")
        if options["index"] is None:
            raise CommandError("--to needs --index ID: the index to move")
        if options["dry_run"]:
            raise CommandError("--dry-run is for --resplit; a move by hand is checked as it starts")
        try:
            node = shutdowns.find_node(options["to"], field="to_node_id")
            done = manual.do_move_index(
                options["index"],
                node.id,
                requested_by=options["by"] or _operator(),
                reason=options["reason"],
                actor=Actor.command(options["by"]),
            )
        except OperatorError as error:
            raise CommandError(error_text(error)) from error
        described = done.as_dict()
        if options["json"]:
            self.stdout.write(json.dumps(described, indent=2, sort_keys=True, default=str))
            return
        self.stdout.write(_hand_text(described))

    def _text(self, plan: resplit.ResplitPlan, *, dry_run: bool) -> str:
        names = dict(
            (node.id, node.name)
            for node in Node.objects.filter(
                id__in={plan.source_node_id, *(p.node_id for p in plan.pieces)}
            )
        )

        def node(node_id: int) -> str:
            return f"node {node_id} ({names.get(node_id) or '?'})"

        source = project_namespace_range(
            plan.source_project_namespace_id_from, plan.source_project_namespace_id_to
        )
        lines = [
            f"Re-split of index {plan.source_index_id} ({source}) "
            f"of namespace {plan.namespace_id} on {node(plan.source_node_id)}: "
            f"{len(plan.pieces)} piece(s)."
        ]
        for i, piece in enumerate(plan.pieces):
            where = f"to {node(piece.node_id)}"
            if i == plan.kept:
                # What happens: the kept piece stays where the index is, whatever node the
                # plan chose for it (resplit.carves); the plan's choice said beside it.
                where = f"stays on {node(plan.source_node_id)}"
                if piece.node_id != plan.source_node_id:
                    where += (
                        f", planned for {node(piece.node_id)}: the plan put no piece on the "
                        "index's node, and a re-split keeps one piece where the index is"
                    )
            ids = project_namespace_range(
                piece.project_namespace_id_from, piece.project_namespace_id_to
            )
            lines.append(
                f"  piece {i + 1} ({ids}): estimate "
                f"{binary_size(piece.estimated_memory_bytes)}, {where}"
            )
        if not plan.carves:
            lines.append("Nothing to carve: the plan keeps the index whole.")
        for i, carve in enumerate(plan.carves):
            ids = project_namespace_range(
                carve.project_namespace_id_from, carve.project_namespace_id_to
            )
            target = node(carve.node_id)
            lines.append(f"  carve {i + 1} ({ids}, the {carve.end} of the range) to {target}")
        for warning in plan.warnings:
            # Said on the kept piece's line already.
            if warning != resplit.NO_PIECE_AT_HOME:
                lines.append(f"  warning: {warning}")
        if dry_run:
            lines.append("This was a dry run: nothing started.")
        elif plan.move_id is not None:
            lines.append(f"Started: move {plan.move_id} (the next carve starts at its swap).")
        return "\n".join(lines)


def _hand_text(move: dict) -> str:
    lines = [
        move["message"],
        f"  index {move['index_id']} of namespace {move['namespace_id']}, "
        f"{binary_size(move['bytes'])}: node {move['source_node_id']} → node "
        f"{move['target_node_id']} ({move['target_node_name']})",
        f"  requested by {move['requested_by']}"
        + (f": {move['requested_reason']}" if move["requested_reason"] else ""),
    ]
    if move["deadline_at"] is not None:
        lines.append(f"  deadline: {move['deadline_at'].isoformat()}")
    lines.append("  Follow it on the dashboard's Moves page (/admin/dashboard/moves/).")
    return "\n".join(lines)
