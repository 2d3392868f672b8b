"""The doctor's checks narrowed to some organisations (``Limits.orgs``, what the admin's
control room asks for a staff member): every absence of another organisation is invisible,
its counts included; the same absences are found for their own organisation and for all; and
a check that does not say it keeps to the organisations is not run for them at all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from effects.models import Effect
from timers.models import Timer
from workflows.engine.health import HEALTH_CHECKS, Finding, Limits, Report, Severity, run_checks
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim
from workflows.models import Organisation, Outbox, Signal, Step

from .factories import IO_DEFINITION, SIGNAL_WAIT_DEFINITION, OrganisationFactory
from .test_doctor import TIMER_DEFINITION, backdate, start

pytestmark = pytest.mark.django_db

BROKEN_THERE = {
    "workflows.stranded_runs", "timers.waits_without_timer", "timers.overdue",
    "effects.lapsed_in_flight", "workflows.unsent_outbox", "workflows.lapsed_leases",
    "workflows.late_wakes", "workflows.matched_signals_pending",
}  # fmt: skip


def break_everything(org: Organisation) -> None:
    """One of each absence the engine's and the apps' checks look for, in ``org``."""
    leased = start(org, IO_DEFINITION, slug="leased")
    (claimed,) = claim(policy=lane_policy("io"), worker="dead-worker", limit=1)
    assert claimed.run_id == leased
    backdate("UPDATE workflows_step SET lease_until = now() - %(late)s::interval"
             " WHERE id = %(id)s", id=claimed.id)  # fmt: skip
    Timer.objects.filter(run_id=start(org, TIMER_DEFINITION, slug="lost")).delete()
    late_timer = start(org, TIMER_DEFINITION, slug="late")
    backdate("UPDATE timers_timer SET due_at = now() - %(late)s::interval WHERE run_id = %(r)s",
             r=late_timer)  # fmt: skip
    in_flight = start(org, IO_DEFINITION, slug="in-flight")  # its step stays ready too
    effect = Effect.objects.create(
        org=org, run_id=in_flight, step_id="work", iteration=1, key=f"{in_flight}/work/1",
        provider="http", state="in_flight", token="t", owner="gone-worker", step_attempt=1,
    )  # fmt: skip
    backdate("UPDATE effects_effect SET lease_until = now() - %(late)s::interval"
             " WHERE id = %(id)s", id=effect.pk)  # fmt: skip
    row = Outbox.objects.create(org=org, topic="lane.wake", payload={"run": in_flight})
    backdate("UPDATE workflows_outbox SET created_at = now() - %(late)s::interval"
             " WHERE id = %(id)s", id=row.pk)  # fmt: skip
    waiting = start(org, SIGNAL_WAIT_DEFINITION, slug="deadline", order="o-1")
    backdate("UPDATE workflows_step SET wake_at = now() - %(late)s::interval"
             " WHERE run_id = %(r)s", r=waiting)  # fmt: skip
    start(org, SIGNAL_WAIT_DEFINITION, slug="missed", order="o-2")
    signal = Signal.objects.create(org=org, name="order.paid", correlation="o-2",
                                   correlations=["o-2"], identity="late-2")  # fmt: skip
    backdate("UPDATE workflows_signal SET received_at = now() - %(late)s::interval"
             " WHERE id = %(id)s", id=signal.pk)  # fmt: skip
    Signal.objects.create(org=org, name="nobody.waits", correlation="x", identity="n-1")
    assert Step.objects.filter(org=org, status="ready").exists()  # the oldest ready: a measure


def checks(orgs: tuple[int, ...] | None) -> Report:
    return run_checks(Limits(late_seconds=300, examples=5, orgs=orgs), timeout_seconds=30)


def broken(report: Report) -> set[str]:
    return {f.check for f in report.broken}


def counted(report: Report) -> list[Finding]:
    return [
        f
        for f in report.findings
        if f.check != "workflows.sweep_leader" and (f.count or f.examples)
    ]


def test_another_organisations_absences_are_invisible_and_their_own_are_found() -> None:
    mine, theirs = OrganisationFactory.create(), OrganisationFactory.create()
    break_everything(theirs)

    for_me = checks((mine.pk,))
    for_them = checks((theirs.pk,))
    for_all = checks(None)

    assert broken(for_me) == set() and counted(for_me) == [], counted(for_me)
    assert not for_me.unchecked, for_me.unchecked
    assert BROKEN_THERE <= broken(for_them) == broken(for_all), broken(for_them)
    assert {e.org_id for f in for_them.broken for e in f.examples} == {theirs.pk}
    measures = {f.label: f.count for f in for_them.findings if f.severity == Severity.INFO}
    assert (
        measures["workflows.pending_signals"] >= 1 and measures["workflows.oldest_ready[io]"] >= 1
    )


@pytest.fixture
def unscoped_check() -> Iterator[list[Limits]]:
    seen: list[Limits] = []

    def look(limits: Limits) -> list[Finding]:
        seen.append(limits)
        return [Finding(check="test.unscoped", severity=Severity.BROKEN, summary="every org's")]

    HEALTH_CHECKS["test.unscoped"] = look  # registered without org_scoped=True
    yield seen
    del HEALTH_CHECKS["test.unscoped"]


def test_a_check_that_does_not_keep_to_the_organisations_is_not_run_for_some(
    unscoped_check: list[Limits],
) -> None:
    org = OrganisationFactory.create()

    assert "test.unscoped" not in broken(checks((org.pk,)))
    assert unscoped_check == []
    assert "test.unscoped" in broken(checks(None))
