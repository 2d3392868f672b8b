"""The public API for step types: how a Django app adds its own kind of step to Waymark.

The effects, timers and approvals apps use exactly this, and so can a host project. A step
type is one object: its name, its lane, how its fields are validated, and the Python function
that runs when a step of it executes. Register it from your ``AppConfig.ready()``::

    from workflows import plugins

    def validate_greet(step, report):
        plugins.check_fields(step, report, ("name",))
        plugins.check_template_field(step, "name", report)

    def greet(step, context, ctx):
        name = plugins.render(step["name"], context)  # a template over the run's data
        if not name:
            raise plugins.StepFailure("nobody to greet", retryable=False)
        return plugins.StepResult(output={"greeting": f"Hello {name}", "key": ctx.effect_key})

    GREET = plugins.StepType(name="greet", lane="io", validate=validate_greet,
                             execute=greet, built=True, app="myapp")

    class MyAppConfig(AppConfig):
        name = "myapp"

        def ready(self):
            plugins.register_step_type(GREET)

The function runs in a worker of its lane (``io``, ``slow`` or ``human``), outside any
transaction, with the step's definition, the run's template context and a ``StepContext``:
the organisation, run, step, iteration and attempt, its deadline, ``lease_lost`` (stop early
when set), and ``effect_key`` (``run/step/iteration``, the same on every retry: key outside
calls with it). It returns a ``StepResult`` (``output``, an ``outcome`` for a mapped
``next``, ``vars`` to set, or ``park=Park(...)`` to wait for a wake or a deadline), or raises
``StepFailure`` (``retryable=False`` to skip the remaining attempts). A step type on the
``inline`` lane runs inside the walk's transaction and must not call anything outside the
database. See docs/reference/custom-step-types.md, "Your own step types".

The rule of the fast paths: the engine walks some runs ahead of their transaction (a settle's
hop, a group of hops, the one-statement start) and must then write exactly what its ordinary
walk, inside the run's locked transaction, would. It asks your type's declaration first: an
``inline`` type is entered only by the ordinary walk unless it says ``pure=True`` (its
``execute`` reads only ``step`` and ``context`` and writes nothing: no statement, no outside
call, no clock). Say nothing and your type is always safe; declare ``pure`` only when it is,
to let runs pass through it without a lock. Worker-lane types are never run inside a walk, so
the flag changes nothing for them. See docs/explanation/architecture.md, "The one rule of the fast
paths".
"""

from __future__ import annotations

from collections.abc import Callable

from ..definitions.expressions import ExpressionError, render_value
from ..definitions.fields import (
    check_choice,
    check_duration,
    check_fields,
    check_int,
    check_number,
    check_object,
    check_string,
    check_template_field,
    check_template_value,
)
from ..definitions.registry import (
    INLINE,
    WORKER_LANES,
    RetryPolicy,
    StepReport,
    StepType,
    registry,
)
from ..engine.executors import Park, StepContext, StepDeferred, StepFailure, StepResult
from ..engine.renames import STEP_RENAMERS, StepBusy, StepRename, StepRenamer
from ..engine.scrape import SCRAPE_COLLECTORS, MetricsCollector
from ..engine.settled import SETTLED_EFFECT_READERS, SettledEffect, SettledEffectReader
from ..engine.sweeper import SWEEP_SERVICES, SWEEP_TASKS, Sweep, SweepService, SweepTask
from .audit import Actor, record_audit
from .health import register_health_check, register_wait_answer

__all__ = [
    "INLINE",
    "WORKER_LANES",
    "Actor",
    "MetricsCollector",
    "Park",
    "RetryPolicy",
    "SettledEffect",
    "SettledEffectReader",
    "StepBusy",
    "StepContext",
    "StepDeferred",
    "StepFailure",
    "StepRename",
    "StepRenamer",
    "StepReport",
    "StepResult",
    "StepType",
    "Sweep",
    "SweepService",
    "check_choice",
    "check_duration",
    "check_fields",
    "check_int",
    "check_number",
    "check_object",
    "check_string",
    "check_template_field",
    "check_template_value",
    "record_audit",
    "register_health_check",
    "register_metrics_collector",
    "register_settled_effects",
    "register_step_renamer",
    "register_step_type",
    "register_sweep_service",
    "register_sweep_task",
    "register_wait_answer",
    "render",
]


def register_sweep_task(name: str, task: Callable[[str], int], *, each_tick: bool = False) -> None:
    """Have the elected sweeper call ``task(by)`` about once a minute, or every tick (a few
    seconds) with ``each_tick``. It returns how many things it did, for the log; one that
    raises is logged and called again at its next turn. The same name again replaces it."""
    SWEEP_TASKS[name] = SweepTask(task, each_tick=each_tick)


def register_sweep_service(name: str, service: Callable[[Sweep], SweepService]) -> None:
    """Have every sweeper process build ``service(sweep)`` and start it with itself: for work
    that needs threads of its own (timers' firing threads). It works only while
    ``sweep.leading`` is set. The same name again replaces it."""
    SWEEP_SERVICES[name] = service


def register_metrics_collector(name: str, collect: MetricsCollector) -> None:
    """Have ``/metrics`` call ``collect()`` at every scrape, in the web process, for gauges
    read from the database (``prometheus_client.core.GaugeMetricFamily`` and the like). It
    runs in a transaction of its own under a short statement_timeout; one that raises is
    logged and left out of that scrape (``waymark_metrics_collector_up{collector=name}`` is
    0). Keep it to a few statements on indexes: it runs every scrape. Label nothing by
    organisation. Counters and histograms need no registering: a prometheus-client
    instrument created in any process is scraped with the others (docs/reference/metrics.md,
    "Metrics"). The same name again replaces it."""
    SCRAPE_COLLECTORS[name] = collect


def register_step_renamer(name: str, renamer: StepRenamer) -> None:
    """Have a migration between versions call ``renamer(cursor, rename)`` whenever it gives a
    live step of a run a new id (or iteration): rename your app's rows kept per ``(run, step
    id, iteration)`` or under the step's effect key (``rename.params()``: ``run``,
    ``step_id``, ``iteration``, ``new_step_id``, ``new_iteration``, ``old_key``,
    ``new_key``). It runs in the migration's transaction, with the run locked, after the step
    row was renamed; it must not wait for a row another transaction holds (the migration runs
    under a short lock_timeout, and ``StepBusy`` puts the run off until later in the job).
    The same name again replaces it."""
    STEP_RENAMERS[name] = renamer


def register_settled_effects(name: str, reader: SettledEffectReader) -> None:
    """Have a re-run from a step (docs/reference/api-runs.md, "Re-run from a step") call
    ``reader(cursor, org_id, run_id)`` for the outside effects your app made for the run and
    stored the answers of (``SettledEffect``: step id, iteration, key, provider): it shows
    them before the operator confirms, and writes which the new walk reuses into the run's
    ``rerun_reuse`` (by step id, then new iteration: the old key), for your app to take
    instead of calling again. It runs in the re-run's transaction, with the run locked. The
    same name again replaces it."""
    SETTLED_EFFECT_READERS[name] = reader


def register_step_type(step_type: StepType) -> None:
    """Make ``step_type`` known to the validator, the walk and the workers. Registering the
    same object again is a no-op; another type under a taken name is refused."""
    registry.register(step_type)


def render(value: object, context: dict[str, object]) -> object:
    """Render the templates in ``value`` over the run's data; a template that fails on this
    run's data is a non-retryable StepFailure (it would fail the same way every time)."""
    try:
        return render_value(value, context)
    except ExpressionError as exc:
        raise StepFailure(f"template error: {exc}", retryable=exc.retryable) from exc
