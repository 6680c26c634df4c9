"""The audit trail: every operator action, who took it, through what, from where, and how
it ended (``AuditEvent``, table ``audit_events``; docs/operations.md, "Audit trail").

An action is recorded once, in the domain function the admin, the API and the
commands all call, with the operator passed in as an ``Actor`` (who, via,
address) by the surface that knows them: ``Actor.from_request`` for the admin
and the API, ``Actor.command`` for a management command. ``audited`` wraps
the action: it writes an ``ok`` event when the body finishes, a ``refused``
one when it raises an operator error (``zoekt.operator_actions.OperatorError``
or one of ``refusals``: nothing was written by the action, the reason code
says why), and an ``error`` one for anything else, then lets the exception go
on. It is entered outside the action's transaction, so a refusal's event is
written after the action's rollback; a surface that wraps the action in a
transaction of its own that it then rolls back (the admin's delete pages)
records the refusal itself with ``record_refusal`` once outside it.
"""

from __future__ import annotations

import dataclasses
import enum
import getpass
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction

from zoekt import clock
from zoekt.logging import get_logger
from zoekt.models import AuditEvent
from zoekt.operator_errors import OperatorError, error_text

log = get_logger(__name__)

Via = AuditEvent.Via
Outcome = AuditEvent.Outcome

#: Setting fields whose values are never written to the trail, only that they changed.
SECRET_MARKERS = ("token", "secret", "password", "key")
MASK = "[hidden]"
BIGINT = 2**63


class Action(enum.StrEnum):
    """The recorded actions: stable snake_case codes, never renamed or reused."""

    APPLICATION_SETTINGS_UPDATED = "application_settings_updated"
    NAMESPACE_ENABLED = "namespace_enabled"
    NAMESPACE_DISABLED = "namespace_disabled"
    NAMESPACE_UPDATED = "namespace_updated"
    PROJECT_INDEX_REQUESTED = "project_index_requested"
    NAMESPACE_RESPLIT_STARTED = "namespace_resplit_started"
    INDEX_MOVE_REQUESTED = "index_move_requested"
    NODE_UPDATED = "node_updated"
    NODE_SHUTDOWN_REQUESTED = "node_shutdown_requested"
    NODE_SHUTDOWN_CANCELLED = "node_shutdown_cancelled"
    NODE_DELETED = "node_deleted"
    NODE_FORCE_DELETED = "node_force_deleted"
    OPERATOR_TOKEN_CREATED = "operator_token_created"
    OPERATOR_TOKEN_REVOKED = "operator_token_revoked"


@dataclasses.dataclass(frozen=True)
class Actor:
    """Who acts, through which surface, from where."""

    name: str
    via: str
    address: str = ""
    user_id: int | None = None
    #: How the request authenticated (``token`` or ``session``); a command's OS user.
    credential: str = ""

    @classmethod
    def from_request(cls, request: Any, via: str) -> Actor:
        """The signed-in user of an admin or API request, and its client address
        (``REMOTE_ADDR``: the proxy in front sets it, as for the login lockout)."""
        user = request.user
        credential = "token" if getattr(request, "auth", None) is not None else "session"
        return cls(
            name=user.get_username(),
            via=via,
            address=request.META.get("REMOTE_ADDR", "") or "",
            user_id=user.pk,
            credential=credential,
        )

    @classmethod
    def command(cls, by: str | None = None) -> Actor:
        """A management command: the name given (``--by``), else the OS user; the host."""
        os_user = _os_user()
        return cls(
            name=by or os_user or "command",
            via=Via.COMMAND,
            address=socket.gethostname(),
            credential=f"os user {os_user}" if os_user else "",
        )

    @classmethod
    def internal(cls, name: str = "") -> Actor:
        """A domain call without a surface (a shell, a test, an older caller)."""
        return cls(name=name or "internal", via=Via.INTERNAL)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


@dataclasses.dataclass(frozen=True)
class Target:
    type: str
    id: int | None = None
    label: str = ""


@dataclasses.dataclass
class Entry:
    """What the body of ``audited`` may still fill in: the target once found, the details
    of what it did, and the action's final code (a delete that turned out forced)."""

    action: str
    target: Target | None
    details: dict[str, Any]


def record(
    actor: Actor,
    action: str,
    *,
    target: Target | None = None,
    outcome: str = Outcome.OK,
    reason: str = "",
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """Write one event (in the caller's transaction, if any)."""
    details = dict(details or {})
    if actor.credential:
        details.setdefault("credential", actor.credential)
    target = target or Target("")
    if target.id is not None and not -BIGINT <= target.id < BIGINT:
        # An id no row can have (a request naming one): kept as the label.
        target = Target(target.type, None, str(target.id))
    event = AuditEvent.objects.create(
        created_at=clock.now(),
        author_id=actor.user_id,
        author_name=actor.name[:255],
        via=actor.via,
        ip_address=actor.address[:255],
        event_name=str(action),
        target_type=target.type,
        target_id=target.id,
        target_details=target.label[:255],
        outcome=outcome,
        reason=str(reason)[:64],
        details=details,
    )
    log.info(
        "audit_event",
        audit_event_id=event.id,
        action=str(action),
        author=actor.name,
        via=actor.via,
        outcome=outcome,
        reason=str(reason),
        target_type=target.type,
        target_id=target.id,
    )
    return event


def reason_code(error: BaseException) -> str:
    """The stable code of a refusal: the error's own reason (``MoveRefused``,
    ``HoldsLastCopy``), else its kind (``not_found``, ``rejected``, ``conflict``)."""
    reason = getattr(error, "reason", None) or getattr(error, "code", None)
    return str(reason) if reason else "refused"


def record_refusal(
    actor: Actor, action: str, error: BaseException, *, target: Target | None = None, **details
) -> AuditEvent:
    """A refused action: the reason code, and the refusal in words in ``details``."""
    message = error_text(error) if isinstance(error, OperatorError) else str(error)
    return record(
        actor,
        action,
        target=target,
        outcome=Outcome.REFUSED,
        reason=reason_code(error),
        details={**details, "message": message},
    )


@contextmanager
def audited(
    actor: Actor | None,
    action: str,
    target: Target | None = None,
    *,
    refusals: tuple[type[BaseException], ...] = (),
    **details: Any,
) -> Iterator[Entry]:
    """Record the action the body carries out: ``ok``, ``refused`` or ``error``."""
    actor = actor or Actor.internal()
    entry = Entry(str(action), target, dict(details))
    try:
        yield entry
    except (OperatorError, *refusals) as error:
        record_refusal(actor, entry.action, error, target=entry.target, **entry.details)
        raise
    except Exception as error:
        if not transaction.get_connection().needs_rollback:
            record(
                actor,
                entry.action,
                target=entry.target,
                outcome=Outcome.ERROR,
                reason=type(error).__name__,
                details={**entry.details, "message": str(error)[:2000]},
            )
        raise
    else:
        record(actor, entry.action, target=entry.target, details=entry.details)


def changed_values(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{field: {"old": ..., "new": ...}}`` for each field whose value changed, secrets
    masked (a field named like a token, a secret, a password or a key)."""
    out = {}
    for name, new in after.items():
        old = before.get(name)
        if old == new:
            continue
        if any(marker in name for marker in SECRET_MARKERS):
            out[name] = {"old": MASK, "new": MASK}
        else:
            out[name] = {"old": _plain(old), "new": _plain(new)}
    return out


def _plain(value: Any) -> Any:
    """A value as JSON holds it (a timedelta or a decimal as its text)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return str(value)
