"""The event types an organisation can subscribe to: a stable set, each a code that never
changes meaning (docs/how-to/receive-webhooks.md). Each comes from one kind of run event, picked up
by the trigger that enqueues deliveries (``sql.ENQUEUE_V2``) in the event's own transaction."""

from __future__ import annotations

EVENT_TYPES: dict[str, str] = {
    "run.started": "a run started",
    "run.succeeded": "a run ended successfully",
    "run.failed": "a run failed (a step failed with no failure path of its own, its budget "
    "or max age ran out, or an end step said failed); an operator may retry it",
    "run.cancelled": "a run was cancelled",
    "run.compensated": "a step failed for good and the run undid its completed steps "
    "(their compensations all ran); final",
    "step.failed": "a step failed for good (its attempts used up, or a failure that is not "
    "retried); its run may go on along the step's failure path",
    "approval.requested": "an approval step waits for a decision (again when it escalates)",
    "task.requested": "a task step waits for its form to be answered",
    "effect.needs_review": "nobody can tell whether an outside call was made: a person must "
    "resolve the effect before its step goes on",
}
