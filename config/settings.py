"""Deployment settings, read from the environment in this one module.

Only deployment concerns come from the environment: where PostgreSQL and Redis
are, secrets (directly or from ``*_FILE`` paths), debug and hosts. Everything
an operator tunes at run time (GitLab's Zoekt application settings) lives in
one database row instead; see ``zoekt.app_settings``.
"""

from __future__ import annotations

import ipaddress
import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from zoekt.logging import configure_structlog, logging_config

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str | None = None) -> str | None:
    """A string from ``NAME``, or from the file named by ``NAME_FILE`` (newline stripped)."""
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().rstrip("\r\n")
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_path!r} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = env_str(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true/false)")


def env_list(name: str, default: str = "") -> list[str]:
    value = env_str(name)
    if value is None:
        value = default
    return [item.strip() for item in value.split(",") if item.strip()]


def env_int(name: str, default: int) -> int:
    value = env_str(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from exc


def proxy_ssl_header(name: str, default: str) -> tuple[str, str] | None:
    """``Header-Name: value`` (what the proxy sets on a request it received over HTTPS)
    as Django's ``SECURE_PROXY_SSL_HEADER``; empty turns it off."""
    value = env_str(name)
    value = default if value is None else value.strip()
    if not value:
        return None
    header, separator, expected = value.partition(":")
    if not separator or not header.strip() or not expected.strip():
        raise ImproperlyConfigured(f"{name}={value!r} is not 'Header-Name: value'")
    meta_key = "HTTP_" + header.strip().upper().replace("-", "_")
    return (meta_key, expected.strip())


def https_origins(hosts: list[str]) -> list[str]:
    """The HTTPS origins of the allowed host names (``.example.com`` is every subdomain)."""
    origins = []
    for host in hosts:
        if host == "*":
            continue
        origins.append(f"https://*{host}" if host.startswith(".") else f"https://{host}")
    return origins


def redis_url_for_celery(url: str) -> str:
    """Celery spells a unix-socket Redis ``redis+socket://``; redis-py spells it ``unix://``."""
    if url.startswith("unix://"):
        parts = urlsplit(url)
        db = parse_qs(parts.query).get("db", ["0"])[0]
        return f"redis+socket://{parts.path}?virtual_host={db}"
    return url


def redis_url_with_db(url: str, db: int) -> str:
    """The same Redis server with another logical database."""
    parts = urlsplit(url)
    if url.startswith("unix://"):
        return f"unix://{parts.path}?db={db}"
    return f"{parts.scheme}://{parts.netloc}/{db}"


DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env_str("DJANGO_SECRET_KEY") or (
    "insecure-development-key-set-DJANGO_SECRET_KEY-in-production" if DEBUG else None
)
if not SECRET_KEY:
    # Tests, `make run` and docker-compose all set one; refusing to start is
    # better than signing sessions with a published key.
    raise ImproperlyConfigured("DJANGO_SECRET_KEY (or DJANGO_SECRET_KEY_FILE) must be set")

# The catalog bulk upsert takes up to 10,000 rows a table in one body; the node
# API refuses anything over 64 KiB on its own.
DATA_UPLOAD_MAX_MEMORY_SIZE = 32 * 1024 * 1024

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost")

# --- Behind a TLS-terminating proxy (docs/operations.md, "Deploying behind TLS") ------------
# Production (DJANGO_DEBUG off) is served over HTTPS by default: a proxy terminates TLS and
# says so in X-Forwarded-Proto. Each setting below is on when DJANGO_HTTPS is, and each can be
# overridden on its own. `python -m config.devservers` (make run, demo, test) serves plain
# HTTP on the loopback and sets DJANGO_HTTPS=false for what it starts.
DJANGO_HTTPS = env_bool("DJANGO_HTTPS", not DEBUG)
# The header the proxy sets (overwriting any a client sent) on a request it got over HTTPS.
SECURE_PROXY_SSL_HEADER = proxy_ssl_header(
    "DJANGO_SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto: https" if DJANGO_HTTPS else ""
)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", DJANGO_HTTPS)
# Never redirected (regular expressions on the path without its leading slash): the clients
# that are machines, which send their credential with the first request (a redirect protects
# nothing then) and cannot follow a 301 on a POST: the health probe, the Prometheus scrape,
# the node API (a node may reach the web server over plain HTTP inside the cluster) and
# GitLab's system hook.
SECURE_REDIRECT_EXEMPT = env_list(
    "DJANGO_SECURE_REDIRECT_EXEMPT",
    r"^-/health$,^metrics$,^api/v4/internal/search/zoekt/,^api/v1/gitlab/system_hook$",
)
# A year, the browsers' preload lists' minimum, and the control plane's own subdomains.
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31_536_000 if DJANGO_HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", DJANGO_HTTPS)
# Off unless asked: preloading commits a whole registrable domain, every subdomain included,
# into the browsers for months; its owner decides that, not a control plane's default.
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
# The deploy check warns on a preload left off (W021); left off on purpose, see above.
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", DJANGO_HTTPS)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", DJANGO_HTTPS)
# The admin's forms post from these origins; over HTTPS, by default, the allowed hosts'.
CSRF_TRUSTED_ORIGINS = env_list(
    "DJANGO_CSRF_TRUSTED_ORIGINS", ",".join(https_origins(ALLOWED_HOSTS) if DJANGO_HTTPS else [])
)

DATABASE_URL = env_str("DATABASE_URL")
if not DATABASE_URL:
    raise ImproperlyConfigured(
        "DATABASE_URL is not set. `make run` and `make test` set it for you "
        "(starting an embedded PostgreSQL when needed)."
    )
REDIS_URL = env_str("REDIS_URL")
if not REDIS_URL:
    raise ImproperlyConfigured(
        "REDIS_URL is not set. `make run` and `make test` set it for you "
        "(starting an embedded Redis when needed)."
    )

DATABASES = {
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)
}
DATABASES["default"].setdefault("TEST", {})
DATABASES["default"]["TEST"]["NAME"] = env_str("DATABASE_TEST_NAME") or (
    f"test_{DATABASES['default']['NAME']}"
)

# The logical databases of the one Redis server: the broker's and the cache's. They are
# named here, never read back from a URL (a unix socket's URL carries no path database).
REDIS_BROKER_DB = int(os.environ.get("REDIS_BROKER_DB", "0"))
REDIS_CACHE_DB = int(os.environ.get("REDIS_CACHE_DB", "1"))

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": redis_url_with_db(REDIS_URL, REDIS_CACHE_DB),
        # Keyed by database by default: two control planes sharing a Redis server (a demo
        # beside a test run, staging beside production) never read each other's settings.
        "KEY_PREFIX": os.environ.get("REDIS_KEY_PREFIX")
        or f"zoekt:{DATABASES['default'].get('NAME') or 'default'}",
        "TIMEOUT": 300,
    }
}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    # Swagger UI's scripts and styles for /api/schema/ui/, served as static files (no CDN).
    "drf_spectacular_sidecar",
    "django_celery_beat",
    # Failed admin logins locked out (before "api", whose admin replaces its attempts' page).
    "axes",
    "zoekt",
    "planner",
    "eviction",
    "api",
    # Following a real GitLab: the REST sweep (docs/gitlab.md).
    "gitlab_sync",
    # The read side, then the demo's commands (nothing in the product imports either).
    "dashboard",
    "simulator",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "api.middleware.RequestGuardMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it answers a locked-out login with 429.
    "axes.middleware.AxesMiddleware",
]

# --- Login throttling (docs/operations.md, "Login throttling") ------------------------------
# django-axes counts failed logins per (username, client address) pair and refuses that pair
# after ZOEKT_LOGIN_FAILURE_LIMIT of them, for ZOEKT_LOGIN_LOCKOUT_SECONDS, the right password
# included; a success resets the count. The address is the connecting peer's (REMOTE_ADDR),
# as everywhere here: a forwarded header is the client's to write.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("ZOEKT_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("ZOEKT_LOGIN_LOCKOUT_SECONDS", 900))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)
AXES_RESET_ON_SUCCESS = True
# The operator API's token: failed attempts per client address, after which every token
# attempt from it is refused with 429 until the window has room (api.authentication).
ZOEKT_OPERATOR_TOKEN_FAILURE_RATE = env_str("ZOEKT_OPERATOR_TOKEN_FAILURE_RATE") or "10/min"

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    }
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Local state of `make run` (embedded servers, secrets, collected static files);
# config.devservers reads the same variable.
VAR_DIR = Path(os.environ.get("ZOEKT_VAR_DIR") or BASE_DIR / "var")
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT") or VAR_DIR / "static")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    # Token first: its WWW-Authenticate header makes an anonymous request a 401 on every
    # operator endpoint (with the session class first, DRF answers 403).
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.authentication.OperatorTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    # Parsers that turn every unreadable body into a JSON 400 (never a 500).
    "DEFAULT_PARSER_CLASSES": [
        "api.parsers.JSONParser",
        "api.parsers.FormParser",
    ],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "UNAUTHENTICATED_USER": None,
    # A client's address is the connecting peer's, never X-Forwarded-For (the client's to write).
    "NUM_PROXIES": 0,
    "DEFAULT_THROTTLE_RATES": {"operator_token_failure": ZOEKT_OPERATOR_TOKEN_FAILURE_RATE},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "zoekt-control",
    "DESCRIPTION": "Control plane for Zoekt code-search nodes.",
    "VERSION": "0.1.0",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # Request bodies get components of their own, where a string that may not be blank
    # declares minLength 1 (what the API accepts is what the schema says).
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "api.schema.declare_guard_responses",
    ],
}

# --- Celery -----------------------------------------------------------------
# Beat entries are declared in code (config.celery.BEAT_SCHEDULE) and stored
# by django-celery-beat's database scheduler, where the admin can edit them.
CELERY_BROKER_URL = redis_url_for_celery(redis_url_with_db(REDIS_URL, REDIS_BROKER_DB))
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "zoekt")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# No job is lost to a crashed worker: every task is idempotent, so a message is
# acknowledged only once its task has run, and put back when its worker dies. One
# message at a time per worker process, so a crash puts back one job, not a batch.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Redis hands an unacknowledged message to another worker after this long, so a job
# whose worker was killed runs again within 4 min 10 s (this, plus one 10 s scan
# below): under 5 minutes. Every job but the GitLab sweeps runs in seconds at most
# (docs/reliability.md has the measured durations); a job that outlives the timeout
# is delivered a second time while it runs, and each one that can is guarded for it:
# the sweeps (up to about 10 min for 100,000 projects) and every other periodic job
# hold their advisory lock (a second copy skips), the move, drain and hook jobs claim
# their rows with SKIP LOCKED, and the one-off jobs are idempotent.
ZOEKT_CELERY_VISIBILITY_TIMEOUT = int(os.environ.get("ZOEKT_CELERY_VISIBILITY_TIMEOUT", "240"))
# Each worker looks for messages past that timeout every 10 s (kombu's default looks
# every 100 s): one ZRANGE on Redis, so a lost message comes back within 10 s of it.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": ZOEKT_CELERY_VISIBILITY_TIMEOUT,
    "unacked_restore_interval": 10,
    "unacked_restore_throttle": 1,
}


# --- Node authentication --------------------------------------------------------
# Nodes sign a JWT with GitLab Shell's shared secret. GITLAB_SHELL_SECRET_FILE
# names one or more files (comma-separated), one secret each, trailing newline
# stripped: several are accepted at once so a secret can be rotated without
# downtime; the first is the one this project's own fake nodes sign with.
def _read_secret_files(name: str) -> list[str]:
    secrets_found = []
    for path in env_list(name):
        try:
            value = Path(path).read_text().rstrip("\r\n")
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}: cannot read {path!r}: {exc}") from exc
        if not value:
            raise ImproperlyConfigured(f"{name}: {path!r} is empty")
        secrets_found.append(value)
    return secrets_found


# The web server refuses to start without one (config.wsgi and the system
# check api.E001); workers and one-off commands do not need it.
GITLAB_SHELL_SECRETS = _read_secret_files("GITLAB_SHELL_SECRET_FILE")
# The longest a node token may live (exp - iat); a leaked token expires by then.
ZOEKT_NODE_TOKEN_MAX_LIFETIME_SECONDS = int(
    os.environ.get("ZOEKT_NODE_TOKEN_MAX_LIFETIME_SECONDS", "3600")
)

# Gitaly storages named in index payloads: {"storage": {"address": ..., "token": ...}}.
import json as _json  # noqa: E402

try:
    ZOEKT_GITALY_STORAGES = _json.loads(
        os.environ.get("ZOEKT_GITALY_STORAGES")
        or '{"default": {"address": "unix:/var/opt/gitlab/gitaly/gitaly.socket", "token": ""}}'
    )
except ValueError as exc:
    raise ImproperlyConfigured(f"ZOEKT_GITALY_STORAGES is not valid JSON: {exc}") from exc

# Following a real GitLab (docs/gitlab.md): its base URL and a file holding an admin
# token with read_api; the sweep's request timeout; and the largest share of the
# catalog's projects or namespaces one sweep may remove without --allow-mass-removal.
ZOEKT_GITLAB_URL = env_str("ZOEKT_GITLAB_URL") or None
ZOEKT_GITLAB_TOKEN_FILE = env_str("ZOEKT_GITLAB_TOKEN_FILE") or None
ZOEKT_GITLAB_TIMEOUT_SECONDS = float(os.environ.get("ZOEKT_GITLAB_TIMEOUT_SECONDS", "30"))
ZOEKT_GITLAB_MAX_REMOVAL_FRACTION = float(
    os.environ.get("ZOEKT_GITLAB_MAX_REMOVAL_FRACTION", "0.1")
)
# The system hook's secret token(s), as X-Gitlab-Token sends it: one file each, several
# for rotation (comma-separated). Unset, the hook endpoint answers 404.
ZOEKT_GITLAB_HOOK_SECRETS = _read_secret_files("ZOEKT_GITLAB_HOOK_SECRET_FILE")
# How long after a push its statistics are refetched (GitLab computes them afterwards).
ZOEKT_GITLAB_PUSH_DEBOUNCE_SECONDS = int(
    os.environ.get("ZOEKT_GITLAB_PUSH_DEBOUNCE_SECONDS", "120")
)

# /metrics (docs/dashboard.md, "Who may scrape"): in production (DJANGO_DEBUG off) a scrape
# sends "Authorization: Bearer <token>", comes from an address in one of the networks (the
# connecting peer's, REMOTE_ADDR; X-Forwarded-For is never read), or is a staff session.
# In development it is open unless a token is set.
ZOEKT_METRICS_TOKEN = env_str("ZOEKT_METRICS_TOKEN") or None
ZOEKT_METRICS_ALLOWED_NETWORKS = env_list("ZOEKT_METRICS_ALLOWED_NETWORKS")
for _network in ZOEKT_METRICS_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError as exc:
        raise ImproperlyConfigured(f"ZOEKT_METRICS_ALLOWED_NETWORKS: {exc}") from exc

# Reference endpoints for bench/heartbeat (never enable in production).
ZOEKT_BENCH_ENDPOINTS = env_bool("ZOEKT_BENCH_ENDPOINTS", False)

# --- Fleet constants that are deployment concerns -----------------------------
# GitLab raises the node high/critical disk watermarks to 0.98/0.99 in its
# development environment; ZOEKT_DEVELOPMENT_WATERMARKS mirrors that switch.
ZOEKT_DEVELOPMENT_WATERMARKS = env_bool("ZOEKT_DEVELOPMENT_WATERMARKS", False)
# Runs the fleet's one clock (zoekt.clock) this far ahead of wall time: a simulation.
ZOEKT_CLOCK_OFFSET_SECONDS = float(os.environ.get("ZOEKT_CLOCK_OFFSET_SECONDS") or 0)
# How long the application-settings row is cached in Redis.
ZOEKT_SETTINGS_CACHE_SECONDS = int(os.environ.get("ZOEKT_SETTINGS_CACHE_SECONDS", "10"))

# --- Logging: one JSON object per line (structlog) ----------------------------
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
LOGGING = logging_config(LOG_LEVEL)
configure_structlog()
