"""Node authentication: GitLab Shell's JWT in the ``Gitlab-Shell-Api-Request`` header.

The token is HS256-signed with the shared secret, its issuer must be
``gitlab-shell`` and its expiry is checked with 60 s of leeway. Several
secrets may be configured at once (rotation); each is tried, and PyJWT
compares signatures in constant time. Every failure is a 401 with a JSON
body, and nothing is written before authentication succeeds.

Beyond GitLab's checks, a token is refused when its time claims (``exp``,
``iat``, ``nbf``) are not integers (a numeric string is not one), or when it
lives longer than ``ZOEKT_NODE_TOKEN_MAX_LIFETIME_SECONDS`` (default one
hour): ``exp - iat``, or ``exp - now`` without ``iat``. A leaked token is
then a credential for an hour at most, not a standing one; the tokens nodes
sign live a few minutes (GitLab's own Zoekt tokens: five).
"""

from __future__ import annotations

import time

import jwt
from django.conf import settings
from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured
from rest_framework import authentication, exceptions

HEADER = "Gitlab-Shell-Api-Request"
META_KEY = "HTTP_GITLAB_SHELL_API_REQUEST"
ISSUER = "gitlab-shell"
ALGORITHM = "HS256"
LEEWAY_SECONDS = 60
#: The default of ``ZOEKT_NODE_TOKEN_MAX_LIFETIME_SECONDS``.
DEFAULT_MAX_LIFETIME_SECONDS = 3600
TIME_CLAIMS = ("exp", "iat", "nbf")


class ShellSecretsMissing(ImproperlyConfigured):
    pass


def shell_secrets() -> list[str]:
    return list(getattr(settings, "GITLAB_SHELL_SECRETS", []) or [])


def require_shell_secrets() -> None:
    if not shell_secrets():
        raise ShellSecretsMissing(
            "GITLAB_SHELL_SECRET_FILE is not set: no node could authenticate, so the server "
            "refuses to start. `make run` generates one under ./var/."
        )


@register()
def check_shell_secrets(app_configs=None, **kwargs):
    if shell_secrets():
        return []
    return [
        Error(
            "No node shared secret is configured.",
            hint="Set GITLAB_SHELL_SECRET_FILE to a file holding GitLab Shell's secret.",
            id="api.E001",
        )
    ]


def encode_node_token(secret: str, *, now: float | None = None, lifetime: int = 60) -> str:
    """A token as a node signs it (used by the fake node and the tests)."""
    issued = int(now if now is not None else time.time())
    return jwt.encode(
        {"iss": ISSUER, "iat": issued, "exp": issued + lifetime}, secret, algorithm=ALGORITHM
    )


def verify_node_token(token: str, secrets: list[str]) -> None:
    """Raise AuthenticationFailed unless one secret verifies the token."""
    if not token:
        raise exceptions.NotAuthenticated(f"missing {HEADER} header")
    verified = False
    reason = "invalid token signature"
    payload = None
    for secret in secrets:
        try:
            payload = jwt.decode(
                token,
                secret,
                algorithms=[ALGORITHM],
                issuer=ISSUER,
                leeway=LEEWAY_SECONDS,
                options={"require": ["iss", "exp"]},
            )
            verified = True
        except jwt.ExpiredSignatureError:
            reason = "token expired"
        except jwt.InvalidIssuerError:
            reason = f"token issuer must be {ISSUER}"
        except jwt.MissingRequiredClaimError as exc:
            reason = f"token lacks the {exc.claim} claim"
        except jwt.InvalidSignatureError:
            pass
        except jwt.ImmatureSignatureError:
            reason = "token not yet valid"
        except jwt.InvalidTokenError:
            reason = "malformed token"
    if not verified:
        raise exceptions.AuthenticationFailed(reason)
    _check_lifetime(payload)


def max_lifetime_seconds() -> int:
    return int(
        getattr(settings, "ZOEKT_NODE_TOKEN_MAX_LIFETIME_SECONDS", DEFAULT_MAX_LIFETIME_SECONDS)
    )


def _check_lifetime(payload: dict) -> None:
    """Integer time claims, and a lifetime no longer than the setting allows."""
    for claim in TIME_CLAIMS:
        if claim in payload and (
            isinstance(payload[claim], bool) or not isinstance(payload[claim], int)
        ):
            raise exceptions.AuthenticationFailed(
                f"token claim {claim} must be an integer number of seconds since the epoch"
            )
    start = payload.get("iat", int(time.time()))
    lifetime = payload["exp"] - start
    limit = max_lifetime_seconds()
    if lifetime > limit:
        raise exceptions.AuthenticationFailed(
            f"token lifetime of {lifetime} s is longer than the {limit} s allowed"
        )


class GitlabShellJWTAuthentication(authentication.BaseAuthentication):
    """Authenticates a node request; the node itself is identified by the URL's uuid."""

    def authenticate(self, request):
        verify_node_token(request.META.get(META_KEY, ""), shell_secrets())
        return (None, "gitlab-shell")

    def authenticate_header(self, request) -> str:
        # A WWW-Authenticate value makes DRF answer 401 rather than 403.
        return HEADER
