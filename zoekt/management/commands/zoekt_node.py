"""Node maintenance from the command line: the node shutdown records (docs/operations.md).

    manage.py zoekt_node restart NODE --reason "Zoekt upgrade" [--delay SECONDS] [--by NAME]
    manage.py zoekt_node remove NODE --reason "shrink the fleet" [--by NAME]
    manage.py zoekt_node replace NODE --to NODE --reason "bigger volume" [--by NAME]
    manage.py zoekt_node status NODE [--json]
    manage.py zoekt_node cancel NODE [--by NAME]
    manage.py zoekt_node delete NODE [--force] [--by NAME]
    manage.py zoekt_node restart|remove --zone ZONE --reason "..." [--delay SECONDS] [--by NAME]
    manage.py zoekt_node status|cancel --zone ZONE [--by NAME]
    manage.py zoekt_node zone NODE [ZONE | --clear] [--by NAME]

``NODE`` is a node's id or the name it reports. ``restart`` records the
request (the API's ``PUT /api/v1/nodes/:id/shutdown``): for the allowed delay
(``--delay``, default the setting ``zoekt_node_restart_delay_seconds``) the
node keeps its indices while it is away, and the record completes by itself
when it comes back with its data. ``remove`` drains the node: every index is
moved off it by the drain job, and the record completes when it holds none;
``replace`` does the same with each move placed on the ``--to`` node where it
fits. ``status`` shows the live record, else the latest, with a drain's
progress (indices and bytes left, moves in flight and done, the observed rate
and an ETA). ``cancel`` cancels the live record (a drain's moves are wound
down), or returns a drained node to service. ``delete`` deletes the node's
row, refused while it holds the last ready copy of a project range unless
``--force`` (recorded). Each request, cancel and delete is recorded with the
operator's name (``--by``, default the login name).

``--zone ZONE`` in place of ``NODE`` acts on every node of the zone: one record
per node, all written or none (a zone drain is refused when no search node
outside the zone is in service to receive its indices); ``status`` and
``cancel`` then show or cancel each node's record. ``zone`` shows a node's zone,
sets it, or clears it (docs/planner.md, "Zones").
"""

from __future__ import annotations

import getpass
import json

from django.core.management.base import BaseCommand, CommandError

from zoekt import node_deletion, operator_actions, shutdowns
from zoekt.audit import Actor
from zoekt.operator_actions import OperatorError, error_text
from zoekt.units import binary_size, project_namespace_range


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


class Command(BaseCommand):
    help = (
        "Restart, drain (remove), replace or delete a node without taking its namespaces "
        "dark: request, watch, cancel (docs/operations.md)."
    )

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        restart = commands.add_parser("restart", help="request a restart of the node")
        restart.add_argument(
            "--delay", type=int, help="seconds the node is left alone (default: the setting)"
        )
        remove = commands.add_parser("remove", help="drain the node: move every index off it")
        replace = commands.add_parser(
            "replace", help="drain the node onto another: move every index to --to"
        )
        replace.add_argument("--to", required=True, help="the receiving node's id or name")
        replace.add_argument("node", help="the node's id or name")
        for sub in (restart, remove):
            sub.add_argument("node", nargs="?", help="the node's id or name (or --zone)")
        for sub in (restart, remove, replace):
            sub.add_argument("--reason", required=True, help="why, for the record")
            sub.add_argument("--by", default=None, help="the operator's name (default: login)")
        status = commands.add_parser("status", help="the node's live record, else its latest")
        status.add_argument("node", nargs="?", help="the node's id or name (or --zone)")
        status.add_argument("--json", action="store_true", help="print the record as JSON")
        cancel = commands.add_parser(
            "cancel", help="cancel the node's live record, or return a drained node to service"
        )
        cancel.add_argument("node", nargs="?", help="the node's id or name (or --zone)")
        cancel.add_argument("--by", default=None, help="the operator's name (default: login)")
        for sub in (restart, remove, status, cancel):
            sub.add_argument("--zone", default=None, help="act on every node of this zone")
        zone = commands.add_parser("zone", help="show, set or clear the node's zone")
        zone.add_argument("node", help="the node's id or name")
        zone.add_argument("zone", nargs="?", default=None, help="the zone to set")
        zone.add_argument("--clear", action="store_true", help="clear the node's zone")
        zone.add_argument("--by", default=None, help="the operator's name (default: login)")
        delete = commands.add_parser("delete", help="delete the node's row (drain it first)")
        delete.add_argument("node", help="the node's id or name")
        delete.add_argument(
            "--force",
            action="store_true",
            help="delete it although it holds the last ready copy of a range (recorded)",
        )
        delete.add_argument("--by", default=None, help="the operator's name (default: login)")

    def handle(self, *args, action: str, **options):
        if options.get("zone") is not None and action != "zone":
            if options.get("node"):
                raise CommandError("give a node or --zone, not both")
            self._zone(action, options)
            return
        if not options.get("node"):
            raise CommandError("give a node (its id or name) or --zone ZONE")
        try:
            node = shutdowns.find_node(options["node"])
            if action == "zone":
                self._set_zone(node, options)
                return
            by = options.get("by") or _operator()
            actor = Actor.command(options.get("by"))
            if action == "delete":
                self._delete(node, by, options["force"], actor)
                return
            if action in ("restart", "remove", "replace"):
                record = shutdowns.do_request_node_shutdown(
                    node.id,
                    type=action,
                    reason=options["reason"],
                    requested_by=by,
                    allowed_delay=options.get("delay"),
                    target_node_id=(
                        shutdowns.find_node(options["to"], "target_node_id").id
                        if action == "replace"
                        else None
                    ),
                    actor=actor,
                )
            elif action == "cancel":
                record = shutdowns.do_cancel_node_shutdown(node.id, cancelled_by=by, actor=actor)
            else:
                record = shutdowns.current_record(node.id)
                if record is None:
                    raise CommandError(f"node {node.id} ({node.name}) has no shutdown record")
        except OperatorError as error:
            raise CommandError(error_text(error)) from error
        described = shutdowns.describe(record)
        if options.get("json"):
            self.stdout.write(json.dumps(described, indent=2, sort_keys=True, default=str))
            return
        self.stdout.write(_text(described))

    def _set_zone(self, node, options) -> None:
        """``zone NODE [ZONE | --clear]``: show, set or clear the node's zone."""
        if options["clear"] and options["zone"] is not None:
            raise CommandError("give a zone or --clear, not both")
        if options["zone"] is None and not options["clear"]:
            self.stdout.write(f"node {node.id} ({node.name}): zone {node.zone or '(none)'}")
            return
        node = operator_actions.do_set_node_zone(
            node.id, options["zone"], actor=Actor.command(options.get("by"))
        )
        self.stdout.write(f"node {node.id} ({node.name}): zone {node.zone or '(none)'}")

    def _zone(self, action: str, options) -> None:
        """``--zone ZONE``: the action on every node of the zone, one record per node."""
        zone = options["zone"]
        by = options.get("by") or _operator()
        actor = Actor.command(options.get("by"))
        try:
            if action in ("restart", "remove"):
                records = shutdowns.do_request_zone_shutdown(
                    zone,
                    type=action,
                    reason=options["reason"],
                    requested_by=by,
                    allowed_delay=options.get("delay"),
                    actor=actor,
                )
            elif action == "cancel":
                records = shutdowns.do_cancel_zone_shutdown(zone, cancelled_by=by, actor=actor)
            else:
                records = shutdowns.zone_records(zone)
                if not records:
                    raise CommandError(f"no node of zone {zone} has a shutdown record")
        except OperatorError as error:
            raise CommandError(error_text(error)) from error
        described = [shutdowns.describe(record) for record in records]
        if options.get("json"):
            self.stdout.write(json.dumps(described, indent=2, sort_keys=True, default=str))
            return
        self.stdout.write(f"zone {zone}: {len(described)} node(s)")
        self.stdout.write("\n".join(_text(record) for record in described))

    def _delete(self, node, by: str, force: bool, actor: Actor) -> None:
        try:
            result = node_deletion.do_delete_node(node.id, deleted_by=by, force=force, actor=actor)
        except node_deletion.HoldsLastCopy as error:
            lines = [str(error), *(f"  {_range(item)}" for item in error.ranges[:20])]
            if len(error.ranges) > 20:
                lines.append(f"  ... and {len(error.ranges) - 20} more")
            lines.append("Use --force to delete it anyway (recorded).")
            raise CommandError("\n".join(lines)) from error
        self.stdout.write(
            f"node {result['node_id']} ({result['node_name']}) deleted by {by}: "
            f"{result['indices_deleted']} indices, {result['repositories_deleted']} "
            "repositories"
        )
        if result["forced"]:
            self.stdout.write(
                f"  forced: {len(result['dark_ranges'])} range(s) dark until re-indexed "
                f"(recorded in shutdown {result['shutdowns_completed'][-1]})"
            )


def _range(item: dict) -> str:
    covers = project_namespace_range(
        item["project_namespace_id_from"], item["project_namespace_id_to"]
    )
    return f"namespace {item['namespace_id']}, index {item['index_id']}: {covers}"


def _duration(seconds: int) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def _drain_lines(drain: dict) -> list[str]:
    """A drain's progress, as ``status`` prints it."""
    lines = [
        f"  drain: {drain['indices_left']} indices left on the node "
        f"({drain['indices_to_move']} to move, {binary_size(drain['bytes_left'])})",
        f"  moves: {drain['moves_in_flight']} in flight, {drain['moves_done']} done "
        f"({binary_size(drain['bytes_moved'])} moved), {drain['moves_parked']} parked",
    ]
    if drain["moves_done_on_target"] is not None:
        lines.append(f"  on the target node: {drain['moves_done_on_target']} of the done moves")
    rate = drain["observed_rate_bytes_per_second"]
    if rate is None:
        lines.append("  rate: not measured yet (no move done)")
    else:
        eta = drain["eta_seconds"]
        lines.append(
            f"  rate: {binary_size(int(rate))}/s observed"
            + ("" if eta is None else f", about {_duration(eta)} left")
        )
    return lines


def _text(record: dict) -> str:
    lines = [
        f"shutdown {record['id']}: {record['type']} of node {record['node_id']} "
        f"({record['node_name']}): {record['status']}"
        + (f" ({record['status_reason']})" if record["status_reason"] else ""),
        f"  reason: {record['reason']}",
        f"  requested by {record['requested_by']} at {record['requested_at'].isoformat()}",
    ]
    if record["target_node_id"] is not None:
        lines.append(f"  target node: {record['target_node_id']} ({record['target_node_name']})")
    if record["allowed_delay_seconds"] is not None:
        left = record["delay_seconds_left"]
        lines.append(
            f"  allowed delay: {record['allowed_delay_seconds']} s, until "
            f"{record['delay_expires_at'].isoformat()}"
            + (f" ({left} s left)" if left is not None else "")
        )
    lines.append(f"  node online: {'yes' if record['node_online'] else 'no'}")
    lines.append(f"  node out of service: {'yes' if record['node_out_of_service'] else 'no'}")
    if record["drain"] is not None:
        lines.extend(_drain_lines(record["drain"]))
    blocked = record["details"].get("no_target_index_ids") or []
    if blocked:
        lines.append(f"  indices with nowhere to go: {', '.join(map(str, blocked))}")
    for key, label in (
        ("node_left_at", "node seen away (last heartbeat before)"),
        ("node_returned_at", "node back (first heartbeat after)"),
        ("completed_at", "completed"),
        ("cancelled_at", "cancelled"),
        ("returned_to_service_at", "returned to service"),
    ):
        if record[key] is not None:
            lines.append(f"  {label}: {record[key].isoformat()}")
    if record["cancelled_by"]:
        lines.append(f"  cancelled by: {record['cancelled_by']}")
    if record["returned_to_service_by"]:
        lines.append(f"  returned to service by: {record['returned_to_service_by']}")
    return "\n".join(lines)
