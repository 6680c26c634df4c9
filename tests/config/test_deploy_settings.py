"""Production settings behind a TLS-terminating proxy: on without DJANGO_DEBUG, off with it.

The settings are read once, when the module is imported, so each environment is tried
in a fresh interpreter: ``manage.py check --deploy`` in docker-compose.yml's environment,
and the settings as another environment leaves them. What the redirect does to each
kind of client is tried in this process with the settings the module builds.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.test import Client
from django.urls import reverse

from api.authentication import encode_node_token

ROOT = Path(__file__).resolve().parents[2]
#: The settings this file is about, printed by the fresh interpreter.
TLS_SETTINGS = (
    "SECURE_PROXY_SSL_HEADER",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "CSRF_TRUSTED_ORIGINS",
)
PRINT_SETTINGS = (
    "import json, django; django.setup(); from django.conf import settings; "
    f"print(json.dumps({{name: getattr(settings, name) for name in {TLS_SETTINGS!r}}}))"
)


@pytest.fixture
def compose_env(tmp_path) -> dict[str, str]:
    """The app's environment in docker-compose.yml, its secrets as files of this machine,
    and nothing inherited from the environment the tests run in but PATH."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = {name: str(value) for name, value in compose["x-app"]["environment"].items()}
    for name, value in env.items():
        if value.startswith("/run/secrets/"):
            secret = tmp_path / Path(value).name
            secret.write_text(secrets.token_urlsafe(50) + "\n")
            env[name] = str(secret)
    return {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "config.settings", **env}


def run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def deploy_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    return run(env, "manage.py", "check", "--deploy", "--fail-level", "WARNING")


def tls_settings(env: dict[str, str]) -> dict:
    result = run(env, "-c", PRINT_SETTINGS)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_deploy_check_passes_without_a_warning_in_the_compose_environment(compose_env):
    result = deploy_check(compose_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (1 silenced)." in result.stdout


def test_the_deploy_check_fails_when_a_production_default_is_turned_off(compose_env):
    result = deploy_check({**compose_env, "DJANGO_SECURE_SSL_REDIRECT": "false"})
    assert result.returncode != 0
    assert "security.W008" in result.stderr + result.stdout
    assert "security.W004" not in result.stderr + result.stdout


def test_production_turns_every_tls_setting_on(compose_env):
    assert tls_settings(compose_env) == {
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 31_536_000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": False,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "CSRF_TRUSTED_ORIGINS": ["https://localhost", "https://127.0.0.1", "https://web"],
    }


def test_debug_mode_keeps_every_tls_setting_off(compose_env):
    assert tls_settings({**compose_env, "DJANGO_DEBUG": "true"}) == {
        "SECURE_PROXY_SSL_HEADER": None,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SECURE_HSTS_PRELOAD": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "CSRF_TRUSTED_ORIGINS": [],
    }


def test_each_setting_is_overridden_on_its_own(compose_env, tmp_path):
    origins = tmp_path / "origins"
    origins.write_text("https://zoekt.example.com\n")
    overridden = tls_settings(
        {
            **compose_env,
            "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Scheme: https",
            "DJANGO_SECURE_HSTS_SECONDS": "3600",
            "DJANGO_SECURE_HSTS_PRELOAD": "true",
            "DJANGO_SESSION_COOKIE_SECURE": "false",
            "DJANGO_CSRF_TRUSTED_ORIGINS_FILE": str(origins),
        }
    )
    assert overridden == {
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_SCHEME", "https"],
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 3600,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": True,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": True,
        "CSRF_TRUSTED_ORIGINS": ["https://zoekt.example.com"],
    }


def test_a_malformed_proxy_header_stops_the_settings_naming_the_variable(compose_env):
    result = run({**compose_env, "DJANGO_SECURE_PROXY_SSL_HEADER": "https"}, "-c", PRINT_SETTINGS)
    assert result.returncode != 0
    assert "DJANGO_SECURE_PROXY_SSL_HEADER='https' is not 'Header-Name: value'" in result.stderr


def test_a_malformed_metrics_network_stops_the_settings_naming_the_variable(compose_env):
    result = run(
        {**compose_env, "ZOEKT_METRICS_ALLOWED_NETWORKS": "10.0.0.0/8,10.300.0.0/16"},
        "-c",
        PRINT_SETTINGS,
    )
    assert result.returncode != 0
    assert "ZOEKT_METRICS_ALLOWED_NETWORKS: '10.300.0.0/16'" in result.stderr


# --- The redirect, client by client -----------------------------------------------------------


@pytest.fixture
def redirecting(settings):
    """The production redirect and proxy header, with the exemptions the settings ship."""
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    return Client()


def test_a_browser_over_plain_http_is_sent_to_https(redirecting):
    response = redirecting.get("/admin/login/")
    assert response.status_code == 301
    assert response["Location"] == "https://testserver/admin/login/"


def test_a_request_the_proxy_received_over_https_is_served_with_hsts(redirecting, db):
    response = redirecting.get("/admin/login/", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 200
    assert response["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"


@pytest.mark.parametrize(
    "path",
    ["/-/health", "/metrics"],
    ids=["health-probe", "prometheus-scrape"],
)
def test_the_machines_probes_over_plain_http_are_not_redirected(redirecting, db, path):
    assert redirecting.get(path).status_code != 301


def test_a_node_heartbeat_over_plain_http_is_answered_not_redirected(redirecting, db):
    from django.conf import settings

    token = encode_node_token(settings.GITLAB_SHELL_SECRETS[0])
    url = reverse("zoekt-heartbeat", args=["3869fe21-36d1-4612-9676-0b783ef2dcd7"])
    response = redirecting.post(
        url, "{}", content_type="application/json", HTTP_GITLAB_SHELL_API_REQUEST=token
    )
    assert response.status_code == 400
    assert response.json()["error"]
