"""The engine's public door for apps that keep state of their own (timers, effects,
approvals, a host project's): write a run's events in its transaction, wake a waiting step,
mark a crash point the tests can stop a process at, name a step's place by its branch path
(``branch_paths``), read the database's clock, tell a
transient database error from a real one, and trace work a step does (``tracing_on``,
``step_span``: a span that is the child of the step attempt's; ``use_tracer_provider``: a
host that configures OpenTelemetry itself hands Waymark its provider). Everything else under
``workflows.engine`` is private: the import contracts in pyproject.toml
([tool.importlinter]) refuse an app that imports it directly.
"""

from __future__ import annotations

from ..engine.clock import database_now
from ..engine.definition_cache import definition_for
from ..engine.faults import crash_point
from ..engine.forks import branch_paths
from ..engine.lanes import engine_setting
from ..engine.sql.rows import (
    Statement,
    event_row,
    fetch_dict,
    fetch_dicts,
    insert_events,
    json_or_null,
    query_prepared,
    run_batch,
)
from ..engine.stop_signals import wait_for_stop_signal
from ..engine.tracing import on as tracing_on
from ..engine.tracing import step_span
from ..engine.tracing import use as use_tracer_provider
from ..engine.transient import Outage, is_transient, log_failure, lost_connection
from ..engine.transport import listen, own_connection
from ..engine.waits import Wake, fail_waiting_step, wake_step, wake_steps_together
from ..engine.walk import lock_run
from ..states import RunStatus, StepStatus

__all__ = [
    "Outage",
    "RunStatus",
    "Statement",
    "StepStatus",
    "Wake",
    "branch_paths",
    "crash_point",
    "database_now",
    "definition_for",
    "engine_setting",
    "event_row",
    "fail_waiting_step",
    "fetch_dict",
    "fetch_dicts",
    "insert_events",
    "is_transient",
    "json_or_null",
    "listen",
    "lock_run",
    "log_failure",
    "lost_connection",
    "own_connection",
    "query_prepared",
    "run_batch",
    "step_span",
    "tracing_on",
    "use_tracer_provider",
    "wait_for_stop_signal",
    "wake_step",
    "wake_steps_together",
]
