"""The engine's own absence monitors (``health.py`` runs them; ``WorkflowsConfig.ready()``
registers them through the door, as the apps register theirs).

Invariants (``broken`` when they do not hold):

- ``workflows.stranded_runs``: every live run has a durable way forward (sql/health.py,
  STRANDED_RUNS, says what counts as one); each stranded run is listed with why.
- ``workflows.late_wakes``: no waiting step is past its wake time by more than the late
  threshold (the sweep fires them within a tick).
- ``workflows.lapsed_leases``: no running step's lease lapsed more than the late threshold
  ago (the suspects-only workers take lapsed ones back).
- ``workflows.unsent_outbox``: no outbox row is unsent after the late threshold (the relay).
- ``workflows.matched_signals_pending``: no pending signal that a waiting step matches is
  older than the late threshold (the sweep's late matching delivers them).

Measures: the oldest ready step of each worker lane (``workflows.oldest_ready``, a warning
past the late threshold), the signals nobody waits for yet (``workflows.pending_signals``),
the sweep's leader (``workflows.sweep_leader``, a warning when none has led for the late
threshold).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import connection

from .forks import JOIN_WAIT
from .health import (
    WAIT_ANSWERS,
    Example,
    Finding,
    Limits,
    Severity,
    counted,
    how_many,
    seconds,
    step_label,
)
from .lanes import WORKER_LANES
from .sql import health as sql
from .sql.rows import fetch_dicts
from .sweeper import LEASE_NAME


def _rows(statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return fetch_dicts(cursor)


def _invariant(
    check: str, limits: Limits, rows: list[dict[str, Any]], *, ok: str, broken: str,
    example: Any, value_column: str | None = None, unit: str = "",
) -> Finding:  # fmt: skip
    """A finding from rows shaped ``total`` + examples: ``ok`` when none, else ``broken``
    (formatted with ``{n}``, the count, and ``{oldest}``, the first row's value)."""
    count, at_least = counted(rows, limits)
    if not count:
        return Finding(check=check, severity=Severity.OK, summary=ok)
    value = seconds(rows[0][value_column]) if value_column else None
    n = f"at least {count}" if at_least else str(count)
    return Finding(
        check=check, severity=Severity.BROKEN, count=count, at_least=at_least, value=value,
        unit=unit, summary=broken.format(n=n, oldest=value),
        examples=tuple(example(row) for row in rows),
    )  # fmt: skip


# --- runs with no durable way forward ----------------------------------------------------------


def stranded_runs(limits: Limits) -> Iterator[Finding]:
    answers = [(prefix, answer.holds) for prefix, answer in sorted(WAIT_ANSWERS.items())]
    rows = _rows(sql.stranded_runs(answers), limits.params())
    total = int(rows[0]["total"]) if rows else 0
    if not total:
        yield Finding(check="workflows.stranded_runs", severity=Severity.OK,
                      summary="every live run has a durable way forward")  # fmt: skip
        return
    yield Finding(
        check="workflows.stranded_runs", severity=Severity.BROKEN, count=total,
        summary=f"{how_many(total, False, 'live run has', 'live runs have')} no durable way "
        "forward: nothing will ever move them (look at each, then retry or cancel it)",
        examples=tuple(_stranded_example(row) for row in rows),
    )  # fmt: skip


def _stranded_example(row: dict[str, Any]) -> Example:
    live: list[dict[str, Any]] = row["live"] or []
    if live:
        why = "; ".join(_why_stuck(step, run_status=row["status"]) for step in live)
    else:
        why = f"the run is {row['status']} but has no live step: nothing will ever end it"
    return Example(run_id=row["run_id"], org_id=row["org_id"], why=why,
                   step=", ".join(step_label(step) for step in live))  # fmt: skip


def _why_stuck(step: dict[str, Any], *, run_status: str) -> str:
    """Why one live step of a stranded run will not move, in words."""
    label = f"{step['step_id']}#{step['iteration']}"
    kind, parked_on = step["wait_kind"], step["parked_on"]
    if kind == JOIN_WAIT:
        return f"{label} is a join waiting for its branches, and no branch is live"
    if kind == "paused":
        return (f"{label} is parked for a pause, but the run is {run_status}: no resume will "
                "unpark it")  # fmt: skip
    if kind == "retry":
        return f"{label} waits to retry with no time to retry at"
    prefix = (parked_on or "").partition(":")[0]
    answer = WAIT_ANSWERS.get(prefix)
    if answer is not None:
        return f"{label} waits on {parked_on} with no deadline, and {answer.why_not}"
    on = f" on {parked_on}" if parked_on else ""
    return (f"{label} waits{on} ({kind or 'no kind'}) with no deadline, and no app answers for "
            "what it waits for")  # fmt: skip


# --- what the sweep, the workers and the relay should have done --------------------------------


def late_wakes(limits: Limits) -> Iterator[Finding]:
    yield _invariant(
        "workflows.late_wakes", limits, _rows(sql.LATE_WAKES, limits.params()),
        ok=f"no waiting step is more than {limits.late_seconds:g} s past its wake time",
        broken="{n} waiting step(s) past their wake time (deadline or retry) by more than "
        f"{limits.late_seconds:g} s, the oldest by {{oldest}} s: is a sweeper running "
        "(manage.py sweep, or runengine)?",
        example=_late_wake_example, value_column="late_seconds", unit="seconds",
    )  # fmt: skip


def _late_wake_example(row: dict[str, Any]) -> Example:
    what = "to retry" if row["wait_kind"] == "retry" else "for its deadline"
    on = row["parked_on"] or (f"signal {row['signal']}" if row["signal"] else "")
    waits = f" (waiting on {on})" if on else ""
    return Example(
        run_id=row["run_id"],
        org_id=row["org_id"],
        step=step_label(row),
        why=f"due {what} {seconds(row['late_seconds'])} s ago and not woken{waits}",
    )


def lapsed_leases(limits: Limits) -> Iterator[Finding]:
    yield _invariant(
        "workflows.lapsed_leases", limits, _rows(sql.LAPSED_LEASES, limits.params()),
        ok=f"no running step's lease lapsed more than {limits.late_seconds:g} s ago",
        broken="{n} running step(s) whose worker's lease lapsed more than "
        f"{limits.late_seconds:g} s ago, the oldest {{oldest}} s ago: the worker is gone, and "
        "no suspects-only worker of the lane takes them back (is one running?)",
        example=_lapsed_lease_example, value_column="lapsed_seconds", unit="seconds",
    )  # fmt: skip


def _lapsed_lease_example(row: dict[str, Any]) -> Example:
    return Example(
        run_id=row["run_id"],
        org_id=row["org_id"],
        step=step_label(row),
        why=f"attempt {row['attempt']} on lane {row['lane']}, held by {row['owner'] or '?'}, "
        f"whose lease lapsed {seconds(row['lapsed_seconds'])} s ago",
    )


def unsent_outbox(limits: Limits) -> Iterator[Finding]:
    yield _invariant(
        "workflows.unsent_outbox", limits, _rows(sql.UNSENT_OUTBOX, limits.params()),
        ok=f"no outbox row is unsent after {limits.late_seconds:g} s",
        broken="{n} outbox row(s) unsent after more than "
        f"{limits.late_seconds:g} s, the oldest for {{oldest}} s: is the relay running "
        "(manage.py relay, or runengine)? Work still runs (workers poll), only later",
        example=_outbox_example, value_column="age_seconds", unit="seconds",
    )  # fmt: skip


def _outbox_example(row: dict[str, Any]) -> Example:
    run = row["run"]
    return Example(
        run_id=int(run) if run and str(run).isdigit() else None, org_id=row["org_id"],
        why=f"outbox row {row['id']} ({row['topic']}) unsent for {seconds(row['age_seconds'])} s",
    )  # fmt: skip


def matched_signals_pending(limits: Limits) -> Iterator[Finding]:
    yield _invariant(
        "workflows.matched_signals_pending", limits,
        _rows(sql.MATCHED_SIGNALS_PENDING, limits.params()),
        ok=f"no pending signal older than {limits.late_seconds:g} s is matched by a waiting "
        "step",
        broken="{n} waiting step(s) match a signal kept pending for more than "
        f"{limits.late_seconds:g} s (the oldest {{oldest}} s): the sweep's late matching is "
        "not delivering them (is a sweeper running? its log says why it fails)",
        example=_matched_signal_example, value_column="age_seconds", unit="seconds",
    )  # fmt: skip


def _matched_signal_example(row: dict[str, Any]) -> Example:
    return Example(
        run_id=row["run_id"],
        org_id=row["org_id"],
        step=step_label(row),
        why=f"waits for signal {row['name']!r}, and signal {row['signal_id']} matching it has "
        f"been pending for {seconds(row['age_seconds'])} s",
    )


# --- measures ---------------------------------------------------------------------------------


def oldest_ready(limits: Limits) -> Iterator[Finding]:
    for lane in WORKER_LANES:
        rows = _rows(sql.OLDEST_READY, {**limits.params(), "lane": lane})
        yield _oldest_ready_finding(lane, rows[0], limits)


def _oldest_ready_finding(lane: str, row: dict[str, Any], limits: Limits) -> Finding:
    count, at_least = counted([row], limits)
    waited = seconds(row["waited_seconds"]) if count else None
    if waited is None:
        return Finding(check="workflows.oldest_ready", subject=lane, severity=Severity.INFO,
                       summary=f"no step of lane {lane} waits for a worker", unit="seconds",
                       value=0.0)  # fmt: skip
    late = waited > limits.late_seconds
    advice = (f": past {limits.late_seconds:g} s; are its workers running, and enough of "
              "them (WAYMARK_<LANE>_CONCURRENCY, _PROCESSES)?") if late else ""  # fmt: skip
    return Finding(
        check="workflows.oldest_ready", subject=lane, count=count, at_least=at_least,
        severity=Severity.WARNING if late else Severity.INFO, value=waited, unit="seconds",
        summary=f"{how_many(count, at_least, 'step', 'steps')} of lane {lane} ready, the "
        f"oldest waiting {waited} s for a worker{advice}",
        examples=(Example(run_id=row["run_id"], org_id=row["org_id"], step=step_label(row),
                          why=f"ready for {waited} s"),),
    )  # fmt: skip


def pending_signals(limits: Limits) -> Iterator[Finding]:
    (row,) = _rows(sql.PENDING_SIGNALS, limits.params())
    count, at_least = counted([row], limits)
    oldest = seconds(row["oldest_seconds"])
    summary = "no signal is pending"
    if count:
        summary = (f"{how_many(count, at_least, 'signal', 'signals')} pending that no step "
                   f"waits for yet (the oldest {oldest} s old): kept until a run waits for them, "
                   "dropped after WAYMARK_SIGNAL_RETENTION_DAYS")  # fmt: skip
    yield Finding(check="workflows.pending_signals", severity=Severity.INFO, count=count,
                  at_least=at_least, value=oldest, unit="seconds", summary=summary)  # fmt: skip


def sweep_leader(limits: Limits) -> Iterator[Finding]:
    rows = _rows(sql.SWEEP_LEADER, {"name": LEASE_NAME})
    lapsed = seconds(rows[0]["lapsed_seconds"]) if rows else None
    if lapsed is not None and lapsed <= limits.late_seconds:
        summary = "a sweeper leads" if lapsed <= 0 else (
            f"the sweep's lease lapsed {lapsed} s ago: another sweeper takes it within three "
            "ticks")  # fmt: skip
        yield Finding(check="workflows.sweep_leader", severity=Severity.INFO, value=lapsed,
                      unit="seconds", summary=summary,
                      examples=(Example(why=f"lease held by {rows[0]['holder']}"),))  # fmt: skip
        return
    since = "ever led" if lapsed is None else f"led for {lapsed} s"
    yield Finding(
        check="workflows.sweep_leader", severity=Severity.WARNING, value=lapsed, unit="seconds",
        summary=f"no sweeper has {since}: timers, deadlines and retries are not fired "
        "(start manage.py sweep, or runengine)",
    )  # fmt: skip


ENGINE_CHECKS = {
    "workflows.stranded_runs": stranded_runs,
    "workflows.late_wakes": late_wakes,
    "workflows.lapsed_leases": lapsed_leases,
    "workflows.unsent_outbox": unsent_outbox,
    "workflows.matched_signals_pending": matched_signals_pending,
    "workflows.oldest_ready": oldest_ready,
    "workflows.pending_signals": pending_signals,
    "workflows.sweep_leader": sweep_leader,
}
