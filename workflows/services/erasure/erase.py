"""Erasing a person: one transaction that finds their runs, locks them, ends or hands back
their live work, removes their values from every app's rows, and leaves a tombstone.

1. Find (``find.py``): the runs that are the person's (*owned*), the runs of others that
   mention one of their identifying values, and the values to remove: the one asked for,
   the identifiers the owned runs' definitions declare, and their declared fields (a name).
2. Lock every one of those runs (the engine's lock order: runs, by id, then their steps), so
   no settle, walk or wake of theirs is under way or can start until the erasure commits.
3. An owned live run is cancelled (the normal cancel: its steps end, ``run.cancelled`` in
   its history), unless its definition says ``on_erasure: finish``: then its running steps
   are handed back (the attempt in flight read the values; its settle and its effect's
   record are fenced out) and it goes on without them.
4. Every registered eraser (``workflows.plugins.erasure``) scrubs its app's rows: the owned
   runs' with all the values (contained), the mentioning runs' and the organisation's other
   rows (signals, suppressions, deliveries, ...) with the identifying values only, whole
   (``Matcher(strict=True)``). The audit log is never changed: it keeps who did what, and
   no person's data is written to it.
5. The tombstone (``Erasure``) and the audit entry ``person.erase``: who, when, what kind of
   identifier, which runs, how many rows per table and column; never the value.

A dry run (the default) does all of it and rolls it back, so its counts are exactly what
erasing would change. Nothing found anywhere: UnknownPerson, and nothing is written (the
transaction rolls back whole, the tombstone with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import OperationalError, connection, transaction

from ...engine.sql import erasure as sql
from ...engine.sql.rows import event_row, fetch_dicts, insert_events, insert_wakes
from ...engine.walk import lock_run
from ...errors import ErasureBusy, UnknownPerson
from ...models import Erasure, Organisation
from ...states import RUN_LIVE
from ..audit import Actor, as_actor, record_audit
from ..control import run_cancel_locked
from .find import Found, find_person
from .registry import ERASERS, Erasing
from .scrub import Counts, Matcher, add_counts
from .subject import Subject

LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout passed
DEADLOCK_DETECTED = "40P01"  # a row of another run, taken in another order by other work
BUSY = (LOCK_NOT_AVAILABLE, DEADLOCK_DETECTED)


@dataclass
class ErasureOutcome:
    dry_run: bool
    subject_kind: str
    runs_cancelled: list[int] = field(default_factory=list)
    runs_finishing: list[int] = field(default_factory=list)
    runs_scrubbed: list[int] = field(default_factory=list)
    values_removed: int = 0
    counts: Counts = field(default_factory=dict)
    repeat_of: int | None = None
    erasure: Erasure | None = None  # the tombstone (None for a dry run)

    def as_json(self) -> dict[str, Any]:
        return {
            "id": None if self.erasure is None else self.erasure.pk,
            "dry_run": self.dry_run,
            "kind": self.subject_kind,
            "at": None if self.erasure is None else self.erasure.at,
            "repeat_of": self.repeat_of,
            "runs_cancelled": self.runs_cancelled,
            "runs_finishing": self.runs_finishing,
            "runs_scrubbed": self.runs_scrubbed,
            "values_removed": self.values_removed,
            "rows_changed": sum(self.counts.values()),
            "counts": dict(sorted(self.counts.items())),
        }


class _RolledBack(Exception):
    def __init__(self, outcome: ErasureOutcome) -> None:
        self.outcome = outcome


def erase_person(
    *, org: Organisation, subject: Subject, actor: Actor | str, dry_run: bool = True
) -> ErasureOutcome:
    """Erase the person ``subject`` names from ``org`` as ``actor``, in one transaction
    (``dry_run``, the default: rolled back, the counts kept; pass False to erase).
    UnknownPerson when nothing references them; ErasureBusy when a row stayed held by other
    work past the lock timeout. Either way nothing is applied. Whether ``actor`` may erase
    is the caller's to check (the API key's scope, the admin's permission)."""
    who = as_actor(actor)
    try:
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql.LOCK_TIMEOUT)
            outcome = _erase(cursor, org, subject, who)
            if dry_run:
                raise _RolledBack(outcome)
    except _RolledBack as rolled_back:
        outcome = rolled_back.outcome
        outcome.dry_run, outcome.erasure = True, None
        return outcome
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) in BUSY:
            raise ErasureBusy() from exc
        raise
    if outcome.erasure is not None:
        outcome.erasure.refresh_from_db()  # its `at`, as the database wrote it
    return outcome


def _erase(cursor: Any, org: Organisation, subject: Subject, who: Actor) -> ErasureOutcome:
    found = find_person(cursor, org.pk, subject)
    previous = Erasure.objects.filter(org=org, subject_digest=subject.digest).first()
    tombstone = Erasure.objects.create(
        org=org, actor_kind=who.kind, actor_id=who.id[:150], actor_display=who.display[:150],
        subject_kind=subject.kind, subject_digest=subject.digest, repeat_of=previous,
    )  # fmt: skip
    outcome = ErasureOutcome(dry_run=False, subject_kind=subject.kind, erasure=tombstone,
                             repeat_of=None if previous is None else previous.pk)  # fmt: skip
    _end_live_work(cursor, found, outcome, who.label)
    # Their own rows: every value, wherever it is contained. Everyone else's: the identifying
    # values, whole only (an id inside a URL, a run's number, are someone else's).
    # A row of someone else's that holds one whole is theirs too, and loses all of their
    # values (``widen``), but not a number: there numbers are ids, counts and times.
    everything = Matcher(found.identifying | found.personal)
    whole = Matcher(found.identifying, strict=True)
    theirs = Matcher(found.identifying | found.personal, numbers=False)
    passes = [
        Erasing(org.pk, tuple(sorted(found.owned)), everything, org_wide=False),
        Erasing(org.pk, tuple(sorted(found.mentioning)), whole, org_wide=True, widen=theirs),
    ]
    for erasing in passes:
        for eraser in ERASERS.values():
            add_counts(outcome.counts, eraser(cursor, erasing))
    if not found.owned and not found.mentioning and not outcome.counts:
        raise UnknownPerson()
    outcome.runs_scrubbed = sorted(set(found.owned) | set(found.mentioning))
    outcome.values_removed = len(found.identifying | found.personal)
    _note_in_history(cursor, org.pk, outcome, who.label, tombstone.pk)
    _keep(tombstone, outcome)
    record_audit(
        org=org, actor=who, action="person.erase", target_type="erasure", target_id=tombstone.pk,
        detail={"kind": subject.kind, "runs_cancelled": len(outcome.runs_cancelled),
                "runs_finishing": len(outcome.runs_finishing),
                "runs_scrubbed": len(outcome.runs_scrubbed),
                "rows_changed": sum(outcome.counts.values()), "repeat_of": outcome.repeat_of},
    )  # fmt: skip
    return outcome


def _end_live_work(cursor: Any, found: Found, outcome: ErasureOutcome, actor: str) -> None:
    """Lock every run concerned (by id: the one lock order), then cancel the person's live
    runs, or hand back the running steps of those that finish without their data."""
    concerned = sorted({*found.owned, *found.mentioning})
    locked = {run_id: lock_run(cursor, run_id) for run_id in concerned}
    for run_id in sorted(found.owned):
        run = locked[run_id]
        if run.status not in RUN_LIVE:
            continue
        declaration = found.declarations.get(found.owned[run_id]["version_id"])
        if declaration is not None and declaration.on_erasure == "finish":
            _hand_back(cursor, run_id, actor)
            outcome.runs_finishing.append(run_id)
        else:
            run_cancel_locked(cursor, run, actor)
            outcome.runs_cancelled.append(run_id)


def _hand_back(cursor: Any, run_id: int, actor: str) -> None:
    cursor.execute(sql.RELEASE_RUNNING_STEPS, {"run": run_id})
    released = fetch_dicts(cursor)
    insert_events(cursor, [
        event_row(r["org_id"], r["run_id"], "step.released", r["step_id"],
                  iteration=r["iteration"], attempt=r["attempt"], worker=actor,
                  detail={"reason": "the person's data was erased while it ran"})
        for r in released
    ])  # fmt: skip
    insert_wakes(cursor, [(r["org_id"], r["run_id"], lane) for r in released
                          for lane in {r["lane"]}])  # fmt: skip


def _note_in_history(
    cursor: Any, org_id: int, outcome: ErasureOutcome, actor: str, erasure_id: int
) -> None:
    """Each run a value was removed from says so in its history (which erasure, by whom)."""
    insert_events(cursor, [
        event_row(org_id, run_id, "run.erased", worker=actor,
                  detail={"by": actor, "erasure": erasure_id})
        for run_id in outcome.runs_scrubbed
    ])  # fmt: skip


def _keep(tombstone: Erasure, outcome: ErasureOutcome) -> None:
    fields: Mapping[str, Any] = {
        "runs_cancelled": outcome.runs_cancelled, "runs_finishing": outcome.runs_finishing,
        "runs_scrubbed": outcome.runs_scrubbed, "values_removed": outcome.values_removed,
        "counts": dict(sorted(outcome.counts.items())),
    }  # fmt: skip
    Erasure.objects.filter(pk=tombstone.pk).update(**fields)
    for name, value in fields.items():
        setattr(tombstone, name, value)
