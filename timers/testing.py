"""Time skipping for the workflow test helper (workflows.plugins.testing,
docs/reference/code-workflows.md, "Testing a code workflow"). FOR TESTS ONLY: registered from
TimersConfig.ready(), called only by ``WorkflowTest.skip_time``, which refuses to run where
WAYMARK_PRODUCTION is set."""

from __future__ import annotations

from django.db.models.functions import Now

from .models import Timer
from .sweep import fire_due_timers

TESTER = "workflow-test"


def skip_run_timers(org_id: int, run_id: int) -> int:
    """Make the run's pending timers due now (by the database's clock, which the firing
    compares with) and fire them through the due firing's own batches; how many fired."""
    pending = Timer.objects.filter(org_id=org_id, run_id=run_id, fired_at__isnull=True,
                                   cancelled_at__isnull=True)  # fmt: skip
    if not pending.update(due_at=Now()):
        return 0
    fired = 0
    while batch := fire_due_timers(by=TESTER).fired:
        fired += batch
    return fired
