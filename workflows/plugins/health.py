"""The door for absence monitors: an app's own checks for ``manage.py doctor`` and ``/readyz``,
and its answer for the waits it parks steps on. Register both from ``AppConfig.ready()``::

    from workflows.plugins.health import (
        Example, Finding, Limits, Severity, register_health_check, register_wait_answer,
    )

    def overdue_things(limits: Limits) -> Iterable[Finding]:
        ...  # one bounded query; limits.params() gives %(late)s, %(examples)s, %(cap)s,
        # %(orgs)s: ... AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
        yield Finding(check="myapp.overdue", severity=Severity.OK, summary="nothing overdue")

    register_health_check("myapp.overdue", overdue_things, org_scoped=True)
    register_wait_answer("thing", holds=sql.THING_IS_PENDING, why_not="its thing is gone")

A check returns findings: ``broken`` for an invariant that does not hold (``doctor`` exits
1, ``/readyz`` answers 503), ``ok`` when it holds, ``info`` or ``warning`` for a measure. It
runs in a read-only transaction under a statement timeout, so it must be one bounded query
(an index of what it looks for, a LIMIT on what it lists), and must write nothing. The
admin's control room runs the checks for a staff member's organisations (``limits.orgs``):
only those registered ``org_scoped=True``, whose statements keep to them.
"""

from __future__ import annotations

from ..engine.health import (
    COUNT_CAP,
    HEALTH_CHECKS,
    ORG_SCOPED,
    WAIT_ANSWERS,
    Check,
    Example,
    Finding,
    Limits,
    Severity,
    WaitAnswer,
    counted,
    how_many,
    seconds,
    step_label,
)

__all__ = [
    "COUNT_CAP",
    "Check",
    "Example",
    "Finding",
    "Limits",
    "Severity",
    "counted",
    "how_many",
    "register_health_check",
    "register_wait_answer",
    "seconds",
    "step_label",
]


def register_health_check(name: str, check: Check, *, org_scoped: bool = False) -> None:
    """Have ``manage.py doctor`` and ``/readyz`` call ``check(limits)`` for its findings. Name
    it ``<app>.<what>``; the same name again replaces it.

    ``org_scoped=True`` says the check keeps to ``limits.orgs`` (its statements filter on
    ``%(orgs)s`` as ``workflows.engine.health`` shows, or it reads nothing of any
    organisation's): the admin's control room then shows its findings to staff members of
    some organisations too, for theirs only. Without it, only superusers see them there."""
    HEALTH_CHECKS[name] = check
    if org_scoped:
        ORG_SCOPED.add(name)
    else:
        ORG_SCOPED.discard(name)


def register_wait_answer(parked_on: str, *, holds: str, why_not: str) -> None:
    """Answer for the waits your app parks steps on without a deadline (a ``Park`` with
    ``deadline_seconds=None`` and ``detail={"parked_on": "<parked_on>:<id>", ...}``): without
    an answer, the engine counts such a step as having no way forward, and its run as
    stranded when it has no other.

    ``holds``: a boolean SQL expression over the waiting step, aliased ``s`` (``s.run_id``,
    ``s.step_id``, ``s.iteration``, ``s.org_id``, ``s.wait_detail``), true while something
    durable of your app will still wake it (an EXISTS on a pending row of yours, by an
    index); a constant of your app's SQL, never built from input. ``why_not``: what it
    means when it is false, in words, read after "and" ("its timer is not pending")."""
    WAIT_ANSWERS[parked_on] = WaitAnswer(parked_on=parked_on, holds=holds, why_not=why_not)
