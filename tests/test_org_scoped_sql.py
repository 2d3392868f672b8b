"""Every statement of the engine's SQL homes is scoped to one organisation, or says why not.

The path past one PostgreSQL server is to distribute the tables by organisation (Citus, or
another PostgreSQL sharded by `org_id`: every table that holds an organisation's data carries
it). That path stays open only while the statements that run per request, per start and per
settle reach one organisation's rows: by `org_id`, or by a key that implies it (a run's or a
step's id, given as a parameter or as an array of them). The few that look across every
organisation do so by design (a worker serves every organisation; the sweeper, the health
checks and the metrics look at the whole engine) and are listed here with the reason; on a
sharded server they become multi-shard statements (docs/how-to/scale-to-several-hosts.md). A new
statement fails this test until it is scoped or added below, knowingly.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator

SQL_HOMES = ("workflows.engine.sql", "effects.sql", "timers.sql", "approvals.sql", "webhooks.sql")

# org_id = %(x)s, run_id = %(run)s, id = ANY(%(ids)s), ...: one organisation's rows, or rows
# named by a key that implies their organisation.
BY_KEY = re.compile(r"\b(org_id|run_id|id|org)\s*=\s*(ANY\s*\()?\s*%\(\w+\)s", re.IGNORECASE)
INSERT_COLUMNS = re.compile(r"INSERT\s+INTO\s+\w+\s*\(([^)]*)\)", re.IGNORECASE)
DML = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE)\b")

# The admin's control room: the organisations the staff member sees, unnested.
STAFF_ORGS = "the staff member's organisations (the admin's control room), unnested"

# Scoped by a key the pattern cannot see: ids arrive as an array or a JSON document.
KEYS_OTHERWISE = {
    "workflows.engine.sql.HEARTBEAT": "the worker's step ids and attempts, unnested",
    "workflows.engine.sql.RELEASE": "the worker's step ids and attempts, unnested",
    "workflows.engine.sql._LOCK_RUN_BY": "a fragment: its callers add `id = %(id)s`",
    "workflows.engine.sql._CANCEL_LIVE_STEPS_OF": "a fragment: its statements name the run(s)",
    "workflows.engine.sql._LOG_ENDED": "a fragment: logs the steps its statement ended",
    "workflows.engine.sql.SETTLE_HOP": "the settle function takes the step's id",
    "workflows.engine.sql.SETTLE_HOPS": "the settle function takes the steps' ids",
    "workflows.engine.sql.LOCK_RUNS_WAKE_DONE": "the batch's run and step ids, in a JSON array",
    "workflows.engine.sql.UPDATE_RUNS": "the batch's run ids, in a JSON array",
    "workflows.engine.sql.API_KEY_WITH_ORG": "a key's prefix, which names its organisation",
    "timers.sql.MARK_FIRED": "the sweep's timer ids, unnested",
    "timers.sql.INSERT_TIMER": "one organisation's new row (an INSERT inside a WITH)",
    "timers.sql.TIMER_HOLDS_WAIT": "a fragment correlated with one step row (s)",
    "effects.sql.CHECK_ORG_LOCK": "an advisory lock keyed by the organisation",
    "workflows.engine.sql.control_room.NEWEST_FAILED_RUNS": STAFF_ORGS,
    "timers.sql.EARLIEST_PENDING_TIMER": STAFF_ORGS,
}

# Engine-wide rows that belong to no organisation (who is idle, who leads the sweep),
# transaction-local settings, and the database's clock.
ENGINE_WIDE = {
    "workflows.engine.sql.MARK_IDLE": "workers' idle marks",
    "workflows.engine.sql.MARK_BUSY": "workers' idle marks",
    "workflows.engine.sql.TAKE_LEASE": "the sweep's leader lease",
    "workflows.engine.sql.RELEASE_LEASE": "the sweep's leader lease",
    "workflows.engine.sql.health.SWEEP_LEADER": "the sweep's leader lease",
    "workflows.engine.sql.QUOTA_FORGET": "the quota counters' cache, forgotten on start-up",
    "workflows.engine.sql.AUDIT_PURGE_BEFORE": "a transaction-local setting",
    "workflows.engine.sql.erasure.RUN_TIED_TEXT_COLUMNS": "the schema's catalog, no row",
    "webhooks.sql.CLAIM_LOCK": "one advisory lock for the senders' claim",
    "workflows.engine.sql.DATABASE_NOW": "the database's clock, no row",
    "workflows.engine.sql.QUOTA_MINUTE": "the database's clock's minute, no row",
}

CLAIM = "a worker serves every organisation: it takes the next ready steps, fairly by org_id"
SWEEP = "the elected sweeper's periodic pass over every organisation (a batch, by an index)"
HEALTH = (
    "a health check (doctor, /healthz) looks at the whole engine, bounded by a cap (the "
    "control room narrows it to a staff member's organisations)"
)
METRICS = "a metrics scrape counts the whole engine (by state, lane or provider)"
CROSS_ORGANISATION = {
    "workflows.engine.sql.CLAIM": CLAIM,
    "workflows.engine.sql._CLAIMED": CLAIM,
    "workflows.engine.sql.CLAIM_SUSPECT": CLAIM,
    "webhooks.sql.CLAIM": CLAIM,
    "workflows.engine.sql.RELAY_BATCH": "the relay publishes every organisation's outbox",
    "workflows.engine.sql.PROMOTE_DUE_RETRIES": SWEEP,
    "workflows.engine.sql.DUE_DEADLINES": SWEEP,
    "workflows.engine.sql.OUTBOX_CLEANUP": SWEEP,
    "workflows.engine.sql.FINISHED_RUNS_BEFORE": SWEEP,
    "workflows.engine.sql.PURGE_AUDIT": SWEEP,
    "workflows.engine.sql.SIGNALS_MATCHED_LATE": SWEEP,
    "workflows.engine.sql.SIGNALS_MATCHED_SINCE": SWEEP,
    "workflows.engine.sql.SIGNALS_DROP_OLD": SWEEP,
    "effects.sql.RELEASE_ORPHAN_RESERVATIONS": SWEEP,
    "effects.sql.RECOUNT_RESERVED": SWEEP,
    "effects.sql.LAPSED_IN_FLIGHT": SWEEP,
    "effects.sql.ORPHANED_TO_UNKNOWN": SWEEP,
    "timers.sql.NEXT_DUE": SWEEP,
    "timers.sql.DUE_BATCH": SWEEP,
    "timers.sql.PENDING_PAGE": SWEEP,
    "approvals.sql.CLOSE_ORPHANS": SWEEP,
    "approvals.sql.DUE_REMINDERS": SWEEP,
    "approvals.sql.OWED_REPLIES": SWEEP,
    "approvals.sql.PURGE_CLICKS": SWEEP,
    "webhooks.sql.PURGE_FINISHED": SWEEP,
    "workflows.engine.sql.health._STRANDED_RUNS": HEALTH,
    "workflows.engine.sql.health.LATE_WAKES": HEALTH,
    "workflows.engine.sql.health.LAPSED_LEASES": HEALTH,
    "workflows.engine.sql.health.OLDEST_READY": HEALTH,
    "workflows.engine.sql.health.UNSENT_OUTBOX": HEALTH,
    "workflows.engine.sql.health.MATCHED_SIGNALS_PENDING": HEALTH,
    "workflows.engine.sql.health.PENDING_SIGNALS": HEALTH,
    "timers.sql.OVERDUE_TIMERS": HEALTH,
    "timers.sql.WAITS_WITHOUT_TIMER": HEALTH,
    "webhooks.sql.OVERDUE": HEALTH,
    "workflows.engine.sql.METRICS_READY_STEPS": METRICS,
    "workflows.engine.sql.METRICS_LIVE_RUNS": METRICS,
    "workflows.engine.sql.METRICS_OUTBOX_OLDEST": METRICS,
    "effects.sql.METRICS_EFFECTS": METRICS,
    "effects.sql.METRICS_CONNECTIONS": METRICS,
    "timers.sql.METRICS_OVERDUE": METRICS,
}
DECLARED = {**KEYS_OTHERWISE, **ENGINE_WIDE, **CROSS_ORGANISATION}


def statements() -> Iterator[tuple[str, str]]:
    """(module.NAME, text) of every statement constant in the SQL homes; the definitions of
    database functions and triggers (CREATE ...) are left out: their callers are checked."""
    for home in SQL_HOMES:
        package = importlib.import_module(home)
        modules = [package]
        if hasattr(package, "__path__"):
            modules += [
                importlib.import_module(f"{home}.{found.name}")
                for found in pkgutil.iter_modules(package.__path__)
            ]
        for module in modules:
            for name, value in vars(module).items():
                if not (name.isupper() and isinstance(value, str) and DML.search(value)):
                    continue
                if value.lstrip().upper().startswith(("CREATE", "DROP")):
                    continue
                yield f"{module.__name__}.{name}", value


# A health check's optional scope (workflows.engine.health.Limits.orgs): NULL, every
# organisation, for the doctor; a staff member's own for the admin's control room.
OPTIONAL_SCOPE = re.compile(
    r"\(%\(orgs\)s::bigint\[\] IS NULL OR [\w.]+ = ANY\(%\(orgs\)s::bigint\[\]\)\)"
)


def scoped(text: str) -> bool:
    text = OPTIONAL_SCOPE.sub("", text)
    insert = INSERT_COLUMNS.match(text.strip())
    if insert is not None and "org_id" in insert.group(1):
        return True  # a new row of one organisation
    return BY_KEY.search(text) is not None


def test_every_statement_is_scoped_to_one_organisation_or_declared() -> None:
    found = dict(statements())
    assert len(found) > 150  # the homes were read (a broken import finds nothing)
    unscoped = {name for name, text in found.items() if not scoped(text)}
    undeclared = sorted(unscoped - DECLARED.keys())
    assert not undeclared, (
        "these statements reach rows of every organisation: scope them by org_id (or a run's "
        f"or step's id), or declare why in this file: {undeclared}"
    )


def test_the_declared_exceptions_are_live_and_needed() -> None:
    found = dict(statements())
    gone = sorted(DECLARED.keys() - found.keys())
    assert not gone, f"declared, but no such statement any more: {gone}"
    needless = sorted(name for name in DECLARED if scoped(found[name]))
    assert not needless, f"declared, but scoped after all (drop them from the list): {needless}"


def test_the_per_request_paths_are_not_among_the_exceptions() -> None:
    # Starting a run, settling a step, taking a signal: one organisation's rows each time.
    hot = ("INSERT_RUN", "SIGNAL_INSERT", "RUN_OF_ORG", "INSERT_IN_FLIGHT", "INSERT_TIMER")
    found = dict(statements())
    for short in hot:
        (name,) = [n for n in found if n.rsplit(".", 1)[1] == short]
        assert scoped(found[name]) or name in KEYS_OTHERWISE, name
