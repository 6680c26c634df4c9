"""Node authentication: GitLab Shell's JWT in the ``Gitlab-Shell-Api-Request`` header;
and the operator API's token, with its failed attempts throttled.

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
from rest_framework.throttling import SimpleRateThrottle

from zoekt.logging import get_logger

log = get_logger(__name__)

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


class FailedTokenThrottle(SimpleRateThrottle):
    """Failed operator-token attempts per client address (``REMOTE_ADDR``: DRF's
    ``NUM_PROXIES`` is 0), at the rate ``operator_token_failure`` (setting
    ``ZOEKT_OPERATOR_TOKEN_FAILURE_RATE``). Only failures are counted; once the window
    is full, every token attempt from the address waits, the right token included, so a
    guesser learns nothing until then."""

    scope = "operator_token_failure"

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def _load(self, request) -> None:
        self.key = self.get_cache_key(request, None)
        self.now = self.timer()
        self.history = [at for at in self.cache.get(self.key, []) if at > self.now - self.duration]

    def wait_seconds(self, request) -> float | None:
        """How long the address must wait before its next attempt, or None."""
        self._load(request)
        return self.wait() if len(self.history) >= self.num_requests else None

    def record_failure(self, request) -> int:
        self._load(request)
        self.history.insert(0, self.now)
        self.cache.set(self.key, self.history, self.duration)
        return len(self.history)


class OperatorTokenAuthentication(authentication.TokenAuthentication):
    """DRF's token authentication (``Authorization: Token <key>``), its failures throttled
    per client address: past the rate, 429 with ``Retry-After`` before the key is looked
    up. A request without a token is not counted (the session may authenticate it)."""

    def authenticate(self, request):
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        throttle = FailedTokenThrottle()
        wait = throttle.wait_seconds(request)
        if wait is not None:
            raise exceptions.Throttled(wait=wait)
        try:
            return super().authenticate(request)
        except exceptions.AuthenticationFailed:
            failures = throttle.record_failure(request)
            log.warning(
                "operator_token_refused",
                client=throttle.get_ident(request),
                failures_in_window=failures,
                throttled=failures >= throttle.num_requests,
            )
            raise
