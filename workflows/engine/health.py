"""Absence monitors: the checks ``manage.py doctor`` and ``/readyz`` run.

Most of the engine's failures are absences: a run that waits for something nobody will
send, a timer nobody fires, a lease nobody takes back, an outbox row nobody relays. Nothing
raises; the work just stops. Each check here looks for one such absence with one bounded
query and returns ``Finding``s: ``broken`` when an invariant does not hold (a run with no
durable way forward, a timer overdue, an effect left in flight), or a measure (``info``,
``warning`` past a threshold: the age of the oldest ready step of a lane).

- **Who checks what.** The engine registers its own checks (``absences.py``); each app
  registers its own from its ``AppConfig.ready()`` through the door
  (``workflows.plugins.register_health_check``), and answers for the waits it parks steps on
  (``register_wait_answer``), so the engine can tell a wait that will end from one that
  never will without knowing any app by name.
- **Read only, bounded in time.** Each check runs in a read-only transaction of its own that
  is always rolled back, under a ``statement_timeout``; one that times out or fails is
  reported ``unchecked`` and the others still run.
- **Exit codes** (``manage.py doctor``, for cron and probes): ``EXIT_HEALTHY`` 0,
  ``EXIT_BROKEN`` 1 when any invariant is broken (and for nothing else), ``EXIT_UNCHECKED`` 2
  for no verdict: none is known broken but some check could not run (or the doctor could not
  look at all: no database, bad options).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db import DatabaseError, connection, transaction

from .lanes import engine_setting

logger = logging.getLogger(__name__)

EXIT_HEALTHY = 0  # every invariant holds (measures may still warn)
EXIT_BROKEN = 1  # at least one invariant is broken
EXIT_UNCHECKED = 2  # no verdict: none known broken, but a check (or the doctor) could not run

# A count stops here: past it the finding says "at least" (counting every one of a million
# late rows would make the check as slow as the trouble is large).
COUNT_CAP = 10_000


class Severity(StrEnum):
    OK = "ok"  # the invariant holds
    INFO = "info"  # a measure, within bounds
    WARNING = "warning"  # a measure past its threshold: look, nothing is lost yet
    UNCHECKED = "unchecked"  # the check could not run (a timeout, an error)
    BROKEN = "broken"  # an invariant does not hold: work is stuck until someone acts


@dataclass(frozen=True)
class Example:
    """One instance of a finding, in words: which run and step, and why."""

    why: str
    run_id: int | None = None
    org_id: int | None = None
    step: str = ""  # "step_id#iteration"

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "org_id": self.org_id, "step": self.step, "why": self.why}


@dataclass(frozen=True)
class Finding:
    """What one check found. ``count``: how many things are in the state it looks for
    (``at_least``: it stopped counting at ``COUNT_CAP``); ``value``: the measure, in ``unit``
    (the oldest one's age, in seconds); ``examples``: a few of them (``Limits.examples``).
    ``subject``: what a check that reports several findings reports this one for (a lane)."""

    check: str
    severity: Severity
    summary: str
    count: int = 0
    at_least: bool = False
    value: float | None = None
    unit: str = ""
    subject: str = ""
    examples: tuple[Example, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.check}[{self.subject}]" if self.subject else self.check

    def as_dict(self, *, examples: bool = True) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "check": self.check, "subject": self.subject, "severity": str(self.severity),
            "count": self.count, "at_least": self.at_least, "value": self.value,
            "unit": self.unit, "summary": self.summary,
        }  # fmt: skip
        if examples:
            shown["examples"] = [example.as_dict() for example in self.examples]
        return shown


@dataclass(frozen=True)
class Limits:
    """What every check is told: how late is too late, how many examples to show, and whose
    rows to look at: ``orgs``, the organisations' ids (the admin's control room asks for a
    staff member's own), or None for every organisation (the doctor, ``/readyz``)."""

    late_seconds: float
    examples: int
    count_cap: int = COUNT_CAP
    orgs: tuple[int, ...] | None = None

    @classmethod
    def from_settings(cls) -> Limits:
        return cls(
            late_seconds=float(engine_setting("DOCTOR_LATE_SECONDS")),
            examples=int(engine_setting("DOCTOR_EXAMPLES")),
        )

    def params(self) -> dict[str, Any]:
        """The statements' parameters: %(late)s, %(examples)s, %(cap)s (one more than the
        cap is read, to know the cap was passed) and %(orgs)s (the organisations, or
        None: how a statement keeps to them is said below)."""
        orgs = None if self.orgs is None else list(self.orgs)
        return {
            "late": self.late_seconds, "examples": self.examples, "cap": self.count_cap + 1,
            "orgs": orgs,
        }  # fmt: skip


# How a check's statement keeps to ``Limits.orgs``: ``AND (%(orgs)s::bigint[] IS NULL OR
# x.org_id = ANY(%(orgs)s::bigint[]))``. Parameters are bound on the client, so for every
# organisation (NULL) the planner folds the condition away and the doctor's plans are the
# same as without it.


Check = Callable[[Limits], Iterable[Finding]]


@dataclass(frozen=True)
class WaitAnswer:
    """An app's answer for the waits it parks steps on without a deadline: steps whose
    ``wait_detail["parked_on"]`` is ``"<parked_on>:<anything>"``. ``holds`` is a boolean SQL
    expression over the waiting step, aliased ``s`` (its columns: ``s.run_id``,
    ``s.step_id``, ``s.iteration``, ``s.org_id``, ``s.wait_detail``), true while something
    durable will still wake it (its timer row is pending); a constant of the app's SQL home,
    never built from input. ``why_not``: what it means when it is false, in words."""

    parked_on: str
    holds: str
    why_not: str


# What the engine and the apps registered (workflows.plugins): name -> check, and
# parked_on prefix -> answer. ORG_SCOPED: the checks that keep to ``Limits.orgs`` (or look
# at nothing of any organisation's): the only ones run for a staff member of some
# organisations, so a check that does not say so never shows them another's counts.
HEALTH_CHECKS: dict[str, Check] = {}
ORG_SCOPED: set[str] = set()
WAIT_ANSWERS: dict[str, WaitAnswer] = {}


@dataclass
class Report:
    checked_at: datetime
    limits: Limits
    findings: list[Finding] = field(default_factory=list)

    @property
    def broken(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.BROKEN]

    @property
    def unchecked(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.UNCHECKED]

    @property
    def status(self) -> str:
        """ "broken", "unchecked" (nothing known broken, something not checked) or "ok"."""
        if self.broken:
            return "broken"
        return "unchecked" if self.unchecked else "ok"

    @property
    def exit_code(self) -> int:
        if self.broken:
            return EXIT_BROKEN
        return EXIT_UNCHECKED if self.unchecked else EXIT_HEALTHY

    def as_dict(self, *, examples: bool = True) -> dict[str, Any]:
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "checked_at": self.checked_at.isoformat(),
            "late_seconds": self.limits.late_seconds,
            "broken": sorted({f.check for f in self.broken}),
            "findings": [f.as_dict(examples=examples) for f in self.findings],
        }


def run_checks(limits: Limits, *, timeout_seconds: float) -> Report:
    """Every registered check, each alone (one that fails is reported ``unchecked`` and the
    next runs), in name order; for some organisations (``limits.orgs``), only the checks
    that keep to them."""
    report = Report(checked_at=_database_now(), limits=limits)
    for name, check in sorted(HEALTH_CHECKS.items()):
        if limits.orgs is not None and name not in ORG_SCOPED:
            continue
        report.findings.extend(run_check(name, check, limits, timeout_seconds=timeout_seconds))
    return report


def run_check(name: str, check: Check, limits: Limits, *, timeout_seconds: float) -> list[Finding]:
    """One check in a read-only transaction of its own, rolled back whatever it did (a
    savepoint inside a caller's transaction: its settings go with it), each of its
    statements bounded by ``timeout_seconds``."""
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")
                cursor.execute(
                    "SELECT set_config('statement_timeout', %(ms)s, true),"
                    " set_config('lock_timeout', %(ms)s, true)",
                    {"ms": str(max(1, round(timeout_seconds * 1000)))},
                )
            findings = list(check(limits))
            transaction.set_rollback(True)
    except DatabaseError as error:
        return [_unchecked(name, f"could not run: {_first_line(error)}")]
    except Exception as error:  # a check's own bug must not hide the other checks
        logger.exception("health check %s failed", name)
        return [_unchecked(name, f"failed: {type(error).__name__}: {_first_line(error)}")]
    return findings


def _unchecked(name: str, summary: str) -> Finding:
    return Finding(check=name, severity=Severity.UNCHECKED, summary=summary)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def _database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        row = cursor.fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


# --- what checks share ------------------------------------------------------------------------


def counted(rows: list[dict[str, Any]], limits: Limits) -> tuple[int, bool]:
    """(count, at_least) from rows that carry ``total``: counted up to one past the cap."""
    total = int(rows[0]["total"]) if rows else 0
    if total > limits.count_cap:
        return limits.count_cap, True
    return total, False


def how_many(count: int, at_least: bool, one: str, many: str) -> str:
    """ "1 run", "12 runs", "at least 10000 runs"."""
    return f"{'at least ' if at_least else ''}{count} {one if count == 1 else many}"


def seconds(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)


def step_label(row: dict[str, Any]) -> str:
    return f"{row['step_id']}#{row['iteration']}"
