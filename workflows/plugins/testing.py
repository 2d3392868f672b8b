"""The workflow test helper, for a host's own tests of its code workflows (FOR TESTS ONLY:
it refuses to run where WAYMARK_PRODUCTION is set); docs/how-to/test-a-code-workflow.md::

    from workflows.plugins.testing import WorkflowTest

    @pytest.mark.django_db(transaction=True)
    def test_order(org):
        t = WorkflowTest(org=org)
        t.start("order-fulfilment", version=2, input={"order": "o-1"}, start_key="t1")
        t.run_until_waiting()
        t.skip_time()                       # a 3-day sleep ends now
        t.signal("paid", correlation="o-1", payload={"amount": 12})
        run = t.run_until_finished()        # the run with its steps
        assert run.status == "succeeded"

``register_time_skip`` and ``register_decider`` are for apps that keep waits of their own
(the timers and approvals apps register theirs from ``AppConfig.ready()``).
"""

from __future__ import annotations

from ..code.testing import (
    RunView,
    StepView,
    WorkflowTest,
    WorkflowTestError,
    register_decider,
    register_time_skip,
)

__all__ = [
    "RunView",
    "StepView",
    "WorkflowTest",
    "WorkflowTestError",
    "register_decider",
    "register_time_skip",
]
