"""Node authentication: GitLab Shell's JWT in ``Gitlab-Shell-Api-Request`` (reference 3.1).

The token is HS256-signed with one of the configured shared secrets, names
``gitlab-shell`` as its issuer and carries an expiry (checked with 60 s of
leeway). Every failure is a 401 with the JSON error body, and nothing is
written. Without any secret the web server refuses to start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import jwt
import pytest
from django.core import checks

from api.authentication import ISSUER, check_shell_secrets, encode_node_token
from tests.api.helpers import ERROR_KEYS, HEARTBEAT_REPLY_KEYS, heartbeat_body, table_counts
from zoekt.models import Node

pytestmark = pytest.mark.django_db

HEADER = "Gitlab-Shell-Api-Request"
FIRST_SECRET = "first-secret-" + "a" * 64
SECOND_SECRET = "second-secret-" + "b" * 64
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _two_secrets(settings):
    """Two secrets configured at once, as during a rotation."""
    settings.GITLAB_SHELL_SECRETS = [FIRST_SECRET, SECOND_SECRET]


def signed(claims: dict, secret: str = FIRST_SECRET) -> str:
    return jwt.encode(claims, secret, algorithm="HS256")


def signed_by_hand(claims: dict, key: bytes) -> str:
    """HS256 by hand: PyJWT refuses to sign with an empty key, an attacker does not."""
    import base64
    import hashlib
    import hmac
    import json

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = part(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = part(json.dumps(claims).encode())
    mac = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{part(mac)}"


def claims(**overrides) -> dict:
    issued = int(time.time())
    values = {"iss": ISSUER, "iat": issued, "exp": issued + 60}
    values.update(overrides)
    return {key: value for key, value in values.items() if value is not None}


def assert_refused(response, message_part: str) -> None:
    assert response.status_code == 401, response.content
    body = response.json()
    assert set(body) == ERROR_KEYS
    assert list(body["errors"]) == [HEADER]
    assert message_part in body["errors"][HEADER][0]
    assert body["error"] == f"{HEADER}: {body['errors'][HEADER][0]}"


# Each token is made when the test runs (a lambda), so none expires while the suite runs.
REFUSED_TOKENS = [
    pytest.param(lambda: "", "missing", id="missing-header"),
    pytest.param(lambda: "not-a-jwt", "malformed", id="garbage-token"),
    pytest.param(
        lambda: signed(claims(), "some-other-secret-" + "c" * 64), "signature", id="wrong-secret"
    ),
    pytest.param(lambda: signed(claims(iss="someone-else")), "issuer", id="wrong-issuer"),
    pytest.param(lambda: signed(claims(iss=None)), "iss claim", id="missing-iss"),
    pytest.param(lambda: signed(claims(exp=None)), "exp claim", id="missing-exp"),
    pytest.param(
        lambda: signed(claims(iat=int(time.time()) - 300, exp=int(time.time()) - 61)),
        "expired",
        id="expired-61-s-ago-beyond-leeway",
    ),
    pytest.param(
        lambda: jwt.encode(claims(), FIRST_SECRET, algorithm="HS512"),
        "malformed",
        id="other-hmac-algorithm",
    ),
    pytest.param(lambda: jwt.encode(claims(), None, algorithm="none"), "malformed", id="alg-none"),
    pytest.param(lambda: signed_by_hand(claims(), b""), "signature", id="empty-secret"),
    pytest.param(
        lambda: signed(claims(nbf=int(time.time()) + 300)), "not yet valid", id="not-yet-valid"
    ),
    pytest.param(
        lambda: signed(claims(iat=int(time.time()) + 300, exp=int(time.time()) + 360)),
        "not yet valid",
        id="issued-in-the-future",
    ),
    pytest.param(
        lambda: signed(claims(exp=4102444800)),  # 2100-01-01
        "lifetime",
        id="exp-in-2100",
    ),
    pytest.param(
        lambda: signed(claims(iat=None, exp=int(time.time()) + 7200)),
        "lifetime",
        id="two-hours-left-without-iat",
    ),
    pytest.param(
        lambda: signed(claims(exp=str(int(time.time()) + 60))),
        "exp must be an integer",
        id="exp-as-a-numeric-string",
    ),
    pytest.param(
        lambda: signed(claims(iat=float(int(time.time())))),
        "iat must be an integer",
        id="iat-as-a-float",
    ),
]


@pytest.mark.parametrize(("token", "message_part"), REFUSED_TOKENS)
def test_a_heartbeat_with_a_bad_token_is_refused_and_registers_nothing(
    node_api, now, token, message_part
):
    before = table_counts()

    response = node_api.heartbeat(
        "6f1c2b1e-8a0d-4a4e-9f7b-2d6c1b0e5a11", heartbeat_body(), token=token()
    )

    assert_refused(response, message_part)
    assert table_counts() == before
    assert not Node.objects.exists()


@pytest.mark.parametrize(("token", "message_part"), REFUSED_TOKENS[:3])
def test_a_callback_with_a_bad_token_is_refused(node_api, node, token, message_part):
    before = table_counts()

    response = node_api.callback(
        node.uuid,
        {"name": "index", "success": True, "payload": {"task_id": 1}},
        token=token(),
    )

    assert_refused(response, message_part)
    assert table_counts() == before


def test_a_token_that_expired_within_the_60_s_leeway_is_accepted(node_api, now):
    token = signed(claims(iat=int(time.time()) - 120, exp=int(time.time()) - 30))

    response = node_api.heartbeat("6f1c2b1e-8a0d-4a4e-9f7b-2d6c1b0e5a11", token=token)

    assert response.status_code == 200, response.content
    assert set(response.json()) == HEARTBEAT_REPLY_KEYS


def test_a_token_signed_with_the_second_of_two_secrets_is_accepted(node_api, now):
    response = node_api.heartbeat(
        "6f1c2b1e-8a0d-4a4e-9f7b-2d6c1b0e5a11", token=encode_node_token(SECOND_SECRET)
    )

    assert response.status_code == 200, response.content
    assert Node.objects.count() == 1


def test_a_token_signed_with_a_secret_no_longer_configured_is_refused(node_api, now, settings):
    settings.GITLAB_SHELL_SECRETS = [SECOND_SECRET]

    response = node_api.heartbeat(
        "6f1c2b1e-8a0d-4a4e-9f7b-2d6c1b0e5a11", token=encode_node_token(FIRST_SECRET)
    )

    assert_refused(response, "signature")
    assert not Node.objects.exists()


def test_with_no_secret_configured_every_token_is_refused(node_api, now, settings):
    settings.GITLAB_SHELL_SECRETS = []

    response = node_api.heartbeat(
        "6f1c2b1e-8a0d-4a4e-9f7b-2d6c1b0e5a11", token=encode_node_token(FIRST_SECRET)
    )

    assert response.status_code == 401
    assert not Node.objects.exists()


# --- startup -----------------------------------------------------------------------------


def test_the_web_server_refuses_to_start_without_a_secret():
    env = {key: value for key, value in os.environ.items() if key != "GITLAB_SHELL_SECRET_FILE"}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"

    result = subprocess.run(
        [sys.executable, "-c", "import config.wsgi"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode != 0
    assert "ShellSecretsMissing" in result.stderr
    assert "GITLAB_SHELL_SECRET_FILE is not set" in result.stderr


def test_the_web_server_starts_with_a_secret(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret\n")
    env = {**os.environ, "GITLAB_SHELL_SECRET_FILE": str(secret_file)}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"

    result = subprocess.run(
        [sys.executable, "-c", "import config.wsgi"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr


def test_the_system_check_reports_a_missing_secret(settings):
    settings.GITLAB_SHELL_SECRETS = []

    errors = check_shell_secrets()

    assert [error.id for error in errors] == ["api.E001"]
    assert "api.E001" in {message.id for message in checks.run_checks()}


def test_the_system_check_is_quiet_when_a_secret_is_configured():
    assert check_shell_secrets() == []
    assert "api.E001" not in {message.id for message in checks.run_checks()}


def test_a_bearer_header_instead_of_the_shell_header_is_refused(node_api, now, client):
    before = table_counts()
    response = client.post(
        "/api/v4/internal/search/zoekt/6f1c2b1e-8a0d-4a4e-9f7b-2d6c1b0e5a11/heartbeat",
        data=heartbeat_body(),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {signed(claims())}",
    )
    assert_refused(response, "missing")
    assert table_counts() == before


def test_a_token_of_the_longest_lifetime_allowed_is_accepted(node_api, now, settings):
    settings.ZOEKT_NODE_TOKEN_MAX_LIFETIME_SECONDS = 300
    issued = int(time.time())
    token = signed(claims(iat=issued, exp=issued + 300))  # GitLab's own five minutes
    response = node_api.heartbeat(
        "6f1c2b1e-8a0d-4a4e-9f7b-2d6c1b0e5a11", heartbeat_body(), token=token
    )
    assert response.status_code == 200, response.content
    too_long = signed(claims(iat=issued, exp=issued + 301))
    refused = node_api.heartbeat(
        "6f1c2b1e-8a0d-4a4e-9f7b-2d6c1b0e5a11", heartbeat_body(), token=too_long
    )
    assert_refused(refused, "longer than the 300 s allowed")
