"""Node maintenance from the command line: the node shutdown records (docs/operations.md).

    manage.py zoekt_node restart NODE --reason "Zoekt upgrade" [--delay SECONDS] [--by NAME]
    manage.py zoekt_node status NODE [--json]
    manage.py zoekt_node cancel NODE [--by NAME]

``NODE`` is a node's id or the name it reports. ``restart`` records the
request (the API's ``PUT /api/v1/nodes/:id/shutdown``): for the allowed delay
(``--delay``, default the setting ``zoekt_node_restart_delay_seconds``) the
node keeps its indices while it is away, and the record completes by itself
when it comes back with its data. ``status`` shows the live record, else the
latest; ``cancel`` cancels the live one. Each request and cancel is recorded
with the operator's name (``--by``, default the login name). ``remove`` and
``replace`` are not available yet and say so.
"""

from __future__ import annotations

import getpass
import json

from django.core.management.base import BaseCommand, CommandError

from zoekt import shutdowns
from zoekt.operator_actions import OperatorError


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


class Command(BaseCommand):
    help = "Restart a node without re-indexing it: request, watch, cancel (docs/operations.md)."

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        restart = commands.add_parser("restart", help="request a restart of the node")
        restart.add_argument("node", help="the node's id or name")
        restart.add_argument("--reason", required=True, help="why, for the record")
        restart.add_argument(
            "--delay", type=int, help="seconds the node is left alone (default: the setting)"
        )
        restart.add_argument("--by", default=None, help="the operator's name (default: login)")
        status = commands.add_parser("status", help="the node's live record, else its latest")
        status.add_argument("node", help="the node's id or name")
        status.add_argument("--json", action="store_true", help="print the record as JSON")
        cancel = commands.add_parser("cancel", help="cancel the node's live record")
        cancel.add_argument("node", help="the node's id or name")
        cancel.add_argument("--by", default=None, help="the operator's name (default: login)")
        for name in ("remove", "replace"):
            other = commands.add_parser(name, help=f"{name} a node (not available yet)")
            other.add_argument("node", nargs="?")
            other.add_argument("rest", nargs="*")

    def handle(self, *args, action: str, **options):
        if action in ("remove", "replace"):
            raise CommandError(f"type: {shutdowns.NOT_AVAILABLE_YET.format(type=action)}")
        try:
            node = shutdowns.find_node(options["node"])
            if action == "restart":
                record = shutdowns.do_request_node_shutdown(
                    node.id,
                    type="restart",
                    reason=options["reason"],
                    requested_by=options["by"] or _operator(),
                    allowed_delay=options["delay"],
                )
            elif action == "cancel":
                record = shutdowns.do_cancel_node_shutdown(
                    node.id, cancelled_by=options["by"] or _operator()
                )
            else:
                record = shutdowns.current_record(node.id)
                if record is None:
                    raise CommandError(f"node {node.id} ({node.name}) has no shutdown record")
        except OperatorError as error:
            raise CommandError(_message(error)) from error
        described = shutdowns.describe(record)
        if options.get("json"):
            self.stdout.write(json.dumps(described, indent=2, sort_keys=True, default=str))
            return
        self.stdout.write(_text(described))


def _message(error: OperatorError) -> str:
    errors = getattr(error, "errors", None)
    if errors:
        return "; ".join(f"{field}: {' '.join(messages)}" for field, messages in errors.items())
    field = getattr(error, "field", None)
    return f"{field}: {error}" if field else str(error)


def _text(record: dict) -> str:
    lines = [
        f"shutdown {record['id']}: {record['type']} of node {record['node_id']} "
        f"({record['node_name']}): {record['status']}"
        + (f" ({record['status_reason']})" if record["status_reason"] else ""),
        f"  reason: {record['reason']}",
        f"  requested by {record['requested_by']} at {record['requested_at'].isoformat()}",
    ]
    if record["allowed_delay_seconds"] is not None:
        left = record["delay_seconds_left"]
        lines.append(
            f"  allowed delay: {record['allowed_delay_seconds']} s, until "
            f"{record['delay_expires_at'].isoformat()}"
            + (f" ({left} s left)" if left is not None else "")
        )
    lines.append(f"  node online: {'yes' if record['node_online'] else 'no'}")
    for key, label in (
        ("node_left_at", "node seen away (last heartbeat before)"),
        ("node_returned_at", "node back (first heartbeat after)"),
        ("completed_at", "completed"),
        ("cancelled_at", "cancelled"),
    ):
        if record[key] is not None:
            lines.append(f"  {label}: {record[key].isoformat()}")
    if record["cancelled_by"]:
        lines.append(f"  cancelled by: {record['cancelled_by']}")
    return "\n".join(lines)
