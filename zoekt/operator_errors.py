"""The errors of an operator action that cannot be carried out (nothing was written).

Raised by the ``do_*`` actions (``zoekt.operator_actions``, ``zoekt.shutdowns``,
``zoekt.node_deletion``, ``eviction.manual``), answered by the API as 404, 400
or 409, printed by the commands (``error_text``) and recorded as refusals by
``zoekt.audit`` with their ``code``.
"""

from __future__ import annotations


class OperatorError(Exception):
    """A request that cannot be carried out; nothing was written. ``code`` is the refusal's
    kind as the audit trail records it."""

    code = "refused"


def error_text(error: OperatorError) -> str:
    """An operator error as one line for a command's output: each field with its
    messages (``Rejected``), or the field at fault and the message."""
    errors = getattr(error, "errors", None)
    if errors:
        return "; ".join(f"{field}: {' '.join(messages)}" for field, messages in errors.items())
    field = getattr(error, "field", None)
    return f"{field}: {error}" if field else str(error)


class ObjectNotFound(OperatorError):
    """GitLab answers 404: ``field`` names the path parameter at fault."""

    code = "not_found"

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


class Rejected(OperatorError):
    """A 400: ``errors`` maps each field (``projects[3].namespace_id``) to its messages."""

    code = "rejected"

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__(next(iter(errors.items())))
        self.errors = errors


class RejectedByState(Rejected):
    """A 409: a well-formed request that does not fit what the database holds (a catalog
    row whose parent is neither in the batch nor stored); it may succeed later. ``errors``
    as ``Rejected``'s."""

    code = "conflict"
