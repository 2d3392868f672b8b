"""The settings objects a host project imports (docs/how-to/embed-in-django.md), with Waymark's
defaults.

WAYMARK, EFFECTS, WEBHOOKS, REST_FRAMEWORK, SPECTACULAR_SETTINGS, CACHES and WAYMARK_WEB, each
value read from its WAYMARK_* variable in the process's environment (docs/reference/settings.md) and
refused at import when it cannot work. Waymark's own project uses them (settings.py); a host
imports them into its own settings.

Importing this module only reads the environment: it loads no .env file, keeps no secret
key, writes no file, needs no Django settings and touches no database, so a host's settings
can import it before anything is configured (tests/test_packaging.py checks it).
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

import environ
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

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

# Production (WAYMARK_PRODUCTION=1): connection secrets need keys of their own (below);
# Waymark's own project also requires its secret key and HTTPS (settings.py).
PRODUCTION = env.bool("WAYMARK_PRODUCTION", default=False)

# --- Cache (rate limits) --------------------------------------------------------------------
# Throttle counts must be shared by every web process: the database by default (the table
# comes with migration workflows 0012), Redis with WAYMARK_CACHE_URL=redis://host:6379/1.
CACHES = {"default": env.cache_url("WAYMARK_CACHE_URL", default="dbcache://waymark_cache")}
if CACHES["default"]["BACKEND"] == "django.core.cache.backends.db.DatabaseCache":
    # Django's database cache, with one upsert per set.
    CACHES["default"]["BACKEND"] = "waymark_config.pg_cache.PostgresDatabaseCache"
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
    "DEFAULT_RENDERER_CLASSES": ["workflows.api.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "workflows.api.negotiation.Negotiation",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "workflows.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.CursorPagination",
    "DEFAULT_FILTER_BACKENDS": ["workflows.api.filters.StrictFilterBackend"],
    "PAGE_SIZE": 50,
    # Rate limits (429 with Retry-After, code "throttled"; docs/how-to/call-the-api.md). Per API
    # key, every request; per organisation, run starts (a quota); per client address, failed
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
    "NUM_PROXIES": env.int("WAYMARK_NUM_PROXIES", default=0),
}
# Where people read the manual: the admin's control room and the API's docs page link to it.
# By default the site `./waymark docs` builds and serves on this machine.
DOCS_URL = env.str(
    "WAYMARK_DOCS_URL", default=f"http://127.0.0.1:{env.int('WAYMARK_DOCS_PORT', default=8001)}/"
)

SPECTACULAR_SETTINGS = {
    "TITLE": "Waymark API",
    "DESCRIPTION": (
        "Durable workflow engine. Every error is JSON with a stable `code`. "
        f"The manual: [{DOCS_URL}]({DOCS_URL})."
    ),
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
        "RunMigrationStatusEnum": "workflows.models.run_migrations.MigrationStatus",
        "ActionEnum": "workflows.services.control.ACTIONS",
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
    # WAYMARK_PRODUCTION, in the settings object a host imports (the module's PRODUCTION is
    # Waymark's own project's): the demo and the workflow test helper refuse to run.
    "PRODUCTION": PRODUCTION,
    # Definitions larger than this (canonical JSON bytes) or with more steps are refused.
    "MAX_DEFINITION_BYTES": env.int("WAYMARK_MAX_DEFINITION_BYTES", default=262_144),
    "MAX_DEFINITION_STEPS": env.int("WAYMARK_MAX_DEFINITION_STEPS", default=500),
    # Templates and conditions (docs/reference/definitions.md, "Limits of templates"). Checked when
    # a definition is saved: bytes per template / condition, conditions per branch, tokens and
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
    # A listening connection (workers' wake-ups, the timers' fast path) silent this long asks
    # the server for an answer, and is dropped and opened again (LISTEN anew) when none comes
    # within as long: a half-open connection would otherwise leave it deaf until a restart.
    # 0: no check (TCP keepalives only).
    "LISTEN_CHECK_SECONDS": env.float("WAYMARK_LISTEN_CHECK_SECONDS", default=20.0),
    # A settle meeting a transient database error (a lost connection, a server restarting or
    # failing over, a lock held past lock_timeout) is tried again, with growing pauses, this
    # long before the worker gives up and leaves the step's lease to lapse (the step then
    # runs again). Set it past the longest failover the database may take.
    "SETTLE_PATIENCE_SECONDS": env.float("WAYMARK_SETTLE_PATIENCE_SECONDS", default=120.0),
    "RELAY_BATCH": 500,
    # Modules imported at start-up that register step types of their own (the tests' `probe`
    # type, tests/probe_steps.py); a host project registers from its AppConfig.ready().
    "EXTRA_STEP_MODULES": env.list("WAYMARK_EXTRA_STEP_MODULES", default=[]),
    "DOCS_URL": DOCS_URL,
    # Sent outbox rows are deleted after this long.
    "OUTBOX_RETENTION_SECONDS": env.int("WAYMARK_OUTBOX_RETENTION_SECONDS", default=3_600),
    # Inline (quick) steps one walk may run in one transaction, and for how long; the rest
    # continues from a continuation row on the io lane.
    "WALK_INLINE_STEPS": env.int("WAYMARK_WALK_INLINE_STEPS", default=100),
    "WALK_INLINE_MS": env.float("WAYMARK_WALK_INLINE_MS", default=50.0),
    # How long a code workflow's own code may run in one decide turn (its replay up to the
    # next step; a ctx.run function's run is not counted): past it the turn is interrupted,
    # with code_turn_budget_exceeded (workflows/code/budget.py).
    "CODE_TURN_MS": env.float("WAYMARK_CODE_TURN_MS", default=1_000.0),
    # A worker's settle that walks into a code run's decider runs its turn inline, in the
    # settle's transaction (docs/explanation/architecture.md, "Runs decided as they go"); off: every
    # turn is a step of the io lane of its own.
    "CODE_DECIDE_INLINE": env.bool("WAYMARK_CODE_DECIDE_INLINE", default=True),
    # A code run's turn on a worker that asks a pure step (StepType.pure: a noop, a host's
    # type declared pure) of the worker's own lane has it run in the turn's settle, written
    # done with it, instead of as an attempt of its own (engine/walk.py Walk._ran_with_turn);
    # off: every step a turn asks of a worker lane is an attempt of its own.
    "CODE_RUN_ASKED_PURE_STEP": env.bool("WAYMARK_CODE_RUN_ASKED_PURE_STEP", default=True),
    # Finished runs (with their steps and history) are deleted this many days after they
    # finished, in batches, by the sweep. 0 keeps them forever.
    "RETENTION_DAYS": env.float("WAYMARK_RETENTION_DAYS", default=90.0),
    # The audit log's entries are deleted this many days after they were written, by the
    # sweep (services/audit.py). 0 keeps them forever.
    "AUDIT_RETENTION_DAYS": env.float("WAYMARK_AUDIT_RETENTION_DAYS", default=0.0),
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
    # The absence monitors (`manage.py doctor`, /readyz; docs/how-to/monitor.md): how late is too
    # late (a timer, a deadline, a lapsed lease, an unsent outbox row, an effect in flight
    # past its lease), how many examples a finding lists, and how long each check's
    # statements may take (the doctor's; /readyz's, whose answer a web process reuses for
    # READYZ_CACHE_SECONDS, since probes come every few seconds).
    "DOCTOR_LATE_SECONDS": env.float("WAYMARK_DOCTOR_LATE_SECONDS", default=300.0),
    "DOCTOR_EXAMPLES": env.int("WAYMARK_DOCTOR_EXAMPLES", default=10),
    "DOCTOR_TIMEOUT_SECONDS": env.float("WAYMARK_DOCTOR_TIMEOUT_SECONDS", default=30.0),
    "READYZ_TIMEOUT_SECONDS": env.float("WAYMARK_READYZ_TIMEOUT_SECONDS", default=5.0),
    "READYZ_CACHE_SECONDS": env.float("WAYMARK_READYZ_CACHE_SECONDS", default=30.0),
    # The bearer token a Prometheus scrape of /metrics must show; empty: /metrics is off.
    "METRICS_TOKEN": env.str("WAYMARK_METRICS_TOKEN", default=""),
}
if not (
    WAYMARK["DOCTOR_LATE_SECONDS"] > 0
    and 1 <= WAYMARK["DOCTOR_EXAMPLES"] <= 1000
    and WAYMARK["DOCTOR_TIMEOUT_SECONDS"] > 0
    and WAYMARK["READYZ_TIMEOUT_SECONDS"] > 0
    and WAYMARK["READYZ_CACHE_SECONDS"] >= 0
):
    raise ImproperlyConfigured(
        "invalid_setting: WAYMARK_DOCTOR_LATE_SECONDS, WAYMARK_DOCTOR_TIMEOUT_SECONDS and "
        "WAYMARK_READYZ_TIMEOUT_SECONDS must be above 0, WAYMARK_DOCTOR_EXAMPLES from 1 to "
        "1000, WAYMARK_READYZ_CACHE_SECONDS at least 0"
    )
if not 0 < WAYMARK["SETTLE_PATIENCE_SECONDS"] <= 86_400:  # NaN too: it would never give up
    raise ImproperlyConfigured(
        "invalid_setting: WAYMARK_SETTLE_PATIENCE_SECONDS must be above 0 and at most 86400 "
        "(seconds); unset it for the default"
    )
if 0 < len(WAYMARK["METRICS_TOKEN"]) < 16:
    # Anyone who can reach the web can try tokens: a short one is guessable.
    raise ImproperlyConfigured(
        "invalid_setting: WAYMARK_METRICS_TOKEN must be at least 16 characters (for example: "
        "python -c 'import secrets; print(secrets.token_urlsafe(32))'); unset it to turn "
        "/metrics off"
    )


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
    # The most of one outside answer's body (an effect's provider, a connection's check,
    # Slack) read into memory; the rest is never received (effects/answers.py). A webhook
    # delivery reads only the excerpt it keeps.
    "OUTSIDE_ANSWER_MAX_BYTES": env.int("WAYMARK_OUTSIDE_ANSWER_MAX_BYTES", default=524_288),
}
if not 1_024 <= EFFECTS["OUTSIDE_ANSWER_MAX_BYTES"] <= 1_073_741_824:
    raise ImproperlyConfigured(
        "invalid_setting: WAYMARK_OUTSIDE_ANSWER_MAX_BYTES must be from 1024 to 1073741824"
    )
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
        "print(Fernet.generate_key().decode())'); docs/how-to/connect-outside-services.md, "
        '"Rotating the secrets key", says how to move existing secrets to it'
    )
for _key in EFFECTS["SECRET_KEYS"]:
    try:
        Fernet(_key.encode())
    except ValueError:
        raise ImproperlyConfigured(
            "invalid_setting: WAYMARK_EFFECTS_SECRET_KEYS must be Fernet keys (32 url-safe "
            "base64-encoded bytes each), comma-separated; unset it for the default"
        ) from None


# --- Outbound webhooks (webhooks/) -----------------------------------------------------------
# Organisations subscribe an HTTPS endpoint to run events; the leading sweeper delivers them
# (docs/how-to/receive-webhooks.md). Secrets are encrypted with the connection secrets' keys
# (EFFECTS above).
WEBHOOKS = {
    # Deliveries in flight at once (the leading sweeper's sending threads), and at most this
    # many for one organisation: a slow endpoint holds its organisation's slots, not all.
    "CONCURRENCY": env.int("WAYMARK_WEBHOOK_CONCURRENCY", default=8),
    "ORG_CONCURRENCY": env.int("WAYMARK_WEBHOOK_ORG_CONCURRENCY", default=2),
    # One attempt's whole time (connect, send, answer); its lease is this plus 10 s.
    "TIMEOUT_SECONDS": env.float("WAYMARK_WEBHOOK_TIMEOUT_SECONDS", default=10.0),
    # Attempts before a delivery is marked failed, and the backoff between them: base * 2^(n-1)
    # seconds after the n-th failed attempt, at most MAX, with jitter (half of it to all of it).
    "MAX_ATTEMPTS": env.int("WAYMARK_WEBHOOK_MAX_ATTEMPTS", default=10),
    "RETRY_BASE_SECONDS": env.float("WAYMARK_WEBHOOK_RETRY_BASE_SECONDS", default=30.0),
    "RETRY_MAX_SECONDS": env.float("WAYMARK_WEBHOOK_RETRY_MAX_SECONDS", default=3_600.0),
    # How often the sender looks for due deliveries when nothing woke it.
    "POLL_SECONDS": env.float("WAYMARK_WEBHOOK_POLL_SECONDS", default=1.0),
    # Delivered and failed deliveries are deleted this many days after they were created.
    "RETENTION_DAYS": env.float("WAYMARK_WEBHOOK_RETENTION_DAYS", default=30.0),
    # Subscriptions per organisation (each event is delivered once per subscription).
    "MAX_SUBSCRIPTIONS": env.int("WAYMARK_WEBHOOK_MAX_SUBSCRIPTIONS", default=20),
    # Plain http:// endpoints are refused unless this is set (a development install).
    "ALLOW_HTTP": env.bool("WAYMARK_WEBHOOK_ALLOW_HTTP", default=False),
    # A PEM file of certificate authorities trusted beside the public ones (an endpoint
    # behind a private CA). Empty: the public ones only.
    "CA_FILE": env.str("WAYMARK_WEBHOOK_CA_FILE", default=""),
}
if not (
    WEBHOOKS["CONCURRENCY"] >= 1
    and 1 <= WEBHOOKS["ORG_CONCURRENCY"] <= WEBHOOKS["CONCURRENCY"]
    and 0 < WEBHOOKS["TIMEOUT_SECONDS"] <= 300
    and WEBHOOKS["MAX_ATTEMPTS"] >= 1
    and 0 < WEBHOOKS["RETRY_BASE_SECONDS"] <= WEBHOOKS["RETRY_MAX_SECONDS"]
    and WEBHOOKS["POLL_SECONDS"] > 0
    and WEBHOOKS["MAX_SUBSCRIPTIONS"] >= 1
):
    raise ImproperlyConfigured(
        "invalid_setting: WAYMARK_WEBHOOK_CONCURRENCY must be at least 1, "
        "WAYMARK_WEBHOOK_ORG_CONCURRENCY from 1 to it, WAYMARK_WEBHOOK_TIMEOUT_SECONDS above 0 "
        "and at most 300, WAYMARK_WEBHOOK_MAX_ATTEMPTS and WAYMARK_WEBHOOK_MAX_SUBSCRIPTIONS "
        "at least 1, WAYMARK_WEBHOOK_RETRY_BASE_SECONDS above 0 and at most "
        "WAYMARK_WEBHOOK_RETRY_MAX_SECONDS, WAYMARK_WEBHOOK_POLL_SECONDS above 0"
    )


# --- Web server -----------------------------------------------------------------------------
# `runengine` serves the web with waitress (waymark_config/web.py): PROCESSES processes (or
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
