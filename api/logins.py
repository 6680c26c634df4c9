"""Admin logins locked out by django-axes: each lockout logged when it is decided, and
each reset in the admin (deleting the pair's failed-attempt row) logged with who did it.

django-axes counts the failures and refuses the locked-out pair (settings: the
``AXES_*`` block of ``config/settings.py``; docs/operations.md, "Login throttling").
"""

from __future__ import annotations

from axes.admin import AccessAttemptAdmin
from django.conf import settings

from zoekt.logging import get_logger

log = get_logger(__name__)


def log_lockout(sender, request=None, username=None, ip_address=None, **kwargs) -> None:
    """django-axes' ``user_locked_out`` signal: one line per lockout decided."""
    log.warning(
        "login_locked_out",
        username=username,
        client=ip_address,
        failure_limit=settings.AXES_FAILURE_LIMIT,
        lockout_seconds=int(settings.AXES_COOLOFF_TIME.total_seconds()),
    )


class LockoutAdmin(AccessAttemptAdmin):
    """django-axes' page of failed attempts; deleting a row resets that pair's count (and
    lifts its lockout), logged with the operator who did it."""

    def delete_model(self, request, obj) -> None:
        super().delete_model(request, obj)
        self._log_reset(request, [(obj.username, obj.ip_address, obj.failures_since_start)])

    def delete_queryset(self, request, queryset) -> None:
        rows = list(queryset.values_list("username", "ip_address", "failures_since_start"))
        super().delete_queryset(request, queryset)
        self._log_reset(request, rows)

    def _log_reset(self, request, rows) -> None:
        for username, ip_address, failures in rows:
            log.warning(
                "login_lockout_reset",
                username=username,
                client=ip_address,
                failures=failures,
                reset_by=request.user.get_username(),
            )
