"""Workflows written as Python code (docs/reference/code-workflows.md): register a function with
``@workflow(name, version=N)`` from your ``AppConfig.ready()`` (or a module it imports),
publish it for an organisation with ``publish_code_workflow``, and start its runs like any
automation's (the API, ``run_start``)::

    from workflows.plugins.code import Context, workflow

    @workflow("order-fulfilment", version=1)
    def fulfil(ctx: Context, order: dict) -> dict:
        total = ctx.run("price", price_of, order["items"])
        ctx.sleep("cool_off", "2s")
        charge = ctx.http("charge", connection="payments", method="POST",
                          url="https://pay.example/charges", body={"total": total})
        return {"charged": charge["body"]["id"]}
"""

from __future__ import annotations

from ..code.context import Context, SignalResult, StepFailed, StepOutcome
from ..code.people_and_time import ApprovalResult, TaskResult
from ..code.publish import publish_code_workflow
from ..code.registry import CodeWorkflowError, workflow

__all__ = [
    "ApprovalResult",
    "CodeWorkflowError",
    "Context",
    "SignalResult",
    "StepFailed",
    "StepOutcome",
    "TaskResult",
    "publish_code_workflow",
    "workflow",
]
