"""Failed logins throttled: the admin's per (username, address) by django-axes, with the
lockout and its reset in the admin and in the logs; the operator token's per address."""

from __future__ import annotations

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.factories import NodeFactory
from zoekt.models import NodeShutdown

pytestmark = pytest.mark.django_db

PASSWORD = "the-right-password-1"
LOGIN = "/admin/login/"
OPERATOR_URL = "/api/v4/admin/zoekt/shards"


@pytest.fixture
def operator():
    return get_user_model().objects.create_user("ops-alice", password=PASSWORD, is_staff=True)


def log_in(client: Client, password: str, username: str = "ops-alice"):
    return client.post(LOGIN, {"username": username, "password": password, "next": "/admin/"})


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def events(caplog, name: str) -> list[dict]:
    return [
        record.msg
        for record in caplog.records
        if isinstance(record.msg, dict) and record.msg.get("event") == name
    ]


def lock_out(client: Client, settings) -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "wrong")


# --- the admin's login form ----------------------------------------------------------------------


def test_the_shipped_limit_is_five_failures_for_a_quarter_of_an_hour(settings):
    assert settings.AXES_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME.total_seconds() == 900
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]


def test_failures_below_the_limit_still_let_the_right_password_in(operator, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert log_in(client, "wrong").status_code == 200
    assert log_in(client, PASSWORD).status_code == 302
    assert logged_in(client)
    assert not AccessAttempt.objects.exists()  # a success resets the count


def test_the_limit_of_failures_locks_the_right_password_out_and_is_logged(
    operator, settings, caplog
):
    client = Client()
    lock_out(client, settings)
    refused = log_in(client, PASSWORD)
    assert refused.status_code == 429
    assert not logged_in(client)
    (attempt,) = AccessAttempt.objects.all()
    assert (attempt.username, attempt.ip_address) == ("ops-alice", "127.0.0.1")
    assert attempt.failures_since_start >= settings.AXES_FAILURE_LIMIT
    (lockout, *_) = events(caplog, "login_locked_out")
    assert lockout["username"] == "ops-alice"
    assert lockout["client"] == "127.0.0.1"
    assert lockout["failure_limit"] == settings.AXES_FAILURE_LIMIT


def test_a_lockout_holds_the_pair_only(operator, settings):
    lock_out(Client(), settings)
    elsewhere = Client(REMOTE_ADDR="10.0.0.8")
    assert log_in(elsewhere, PASSWORD).status_code == 302
    assert logged_in(elsewhere)


def test_a_forwarded_address_does_not_escape_a_lockout(operator, settings):
    client = Client()
    lock_out(client, settings)
    spoofed = Client(HTTP_X_FORWARDED_FOR="10.9.9.9")
    assert log_in(spoofed, PASSWORD).status_code == 429
    assert not logged_in(spoofed)


def test_an_operator_resets_a_lockout_in_the_admin_and_the_reset_is_logged(
    operator, settings, admin_client, caplog
):
    client = Client()
    lock_out(client, settings)
    attempt = AccessAttempt.objects.get()
    changelist = admin_client.get(reverse("admin:axes_accessattempt_changelist"))
    assert b"ops-alice" in changelist.content
    response = admin_client.post(
        reverse("admin:axes_accessattempt_delete", args=[attempt.pk]), {"post": "yes"}
    )
    assert response.status_code == 302
    assert not AccessAttempt.objects.exists()
    (reset,) = events(caplog, "login_lockout_reset")
    assert reset["username"] == "ops-alice"
    assert reset["client"] == "127.0.0.1"
    assert reset["reset_by"] == "admin"
    assert log_in(client, PASSWORD).status_code == 302
    assert logged_in(client)


def test_the_bulk_delete_action_resets_every_chosen_lockout(operator, settings, admin_client):
    lock_out(Client(), settings)
    lock_out(Client(REMOTE_ADDR="10.0.0.8"), settings)
    chosen = list(AccessAttempt.objects.values_list("pk", flat=True))
    assert len(chosen) == 2
    admin_client.post(
        reverse("admin:axes_accessattempt_changelist"),
        {"action": "delete_selected", "_selected_action": chosen, "post": "yes"},
    )
    assert not AccessAttempt.objects.exists()


# --- the operator API's token --------------------------------------------------------------------


@pytest.fixture
def token(operator) -> str:
    return Token.objects.create(user=operator).key


def with_token(key: str, address: str = "127.0.0.1") -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_the_right_token_is_never_counted(token):
    for _ in range(15):
        assert with_token(token).get(OPERATOR_URL).status_code == 200


def test_ten_wrong_tokens_a_minute_throttle_every_token_from_the_address(token, caplog):
    for _ in range(10):
        refused = with_token("wrong-token").get(OPERATOR_URL)
        assert refused.status_code == 401
    throttled = with_token(token).get(OPERATOR_URL)
    assert throttled.status_code == 429
    assert int(throttled["Retry-After"]) > 0
    assert throttled.json()["error"]
    assert events(caplog, "operator_token_refused")[-1]["throttled"] is True
    assert with_token(token, address="10.0.0.8").get(OPERATOR_URL).status_code == 200


def test_a_throttled_address_writes_nothing(token, now):
    node = NodeFactory()
    url = f"/api/v1/nodes/{node.id}/shutdown"
    body = {"type": "restart", "reason": "Zoekt upgrade"}
    for _ in range(10):
        assert with_token("wrong-token").put(url, body, format="json").status_code == 401
    assert with_token(token).put(url, body, format="json").status_code == 429
    assert not NodeShutdown.objects.exists()
    assert with_token(token, address="10.0.0.8").put(url, body, format="json").status_code == 201


def test_a_request_without_a_token_is_not_counted(token):
    for _ in range(15):
        assert APIClient().get(OPERATOR_URL).status_code == 401
    assert with_token(token).get(OPERATOR_URL).status_code == 200
