"""The code workflows of the saga tests (tests/test_code_workflow_sagas.py): named in the
WAYMARK_EXTRA_STEP_MODULES of the worker processes those tests kill, so each process
registers them as a host's ready() would.

The provider stub: forward steps call /echo/<op> (answered), /ship answers 404 (refused:
fails for good), compensations create items at /items (keyed by the effect key, so a repeat
under the same key creates nothing new)."""

from __future__ import annotations

from typing import Any

from workflows.plugins.code import Context, StepFailed, workflow


def echo(ctx: Context, step_id: str, url: str, **body: Any) -> Any:
    return ctx.http(step_id, connection="api", method="POST", url=f"{url}/echo/{step_id}",
                    body={"op": step_id, **body})  # fmt: skip


@workflow("code-saga", version=1)
def reserve_charge_fail(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """reserve, then ``charges`` charges, each with its compensation; then fail as asked."""
    url = run_input["url"]
    echo(ctx, "reserve", url)
    ctx.compensate_with_http("undo_reserve", connection="api", method="POST",
                             url=f"{url}/items", body={"op": "undo_reserve"})  # fmt: skip
    for n in range(run_input.get("charges", 1)):
        echo(ctx, "charge", url, n=n)
        # The execution it undoes is read as a definition's compensation reads it.
        undo = {"op": "undo_charge", "n": n, "undoes": "{{ compensating.output.body.body.n }}"}
        request = {"method": "POST", "url": f"{url}/items", "body": undo}
        ctx.compensate_with("undo_charge", "http", connection="api", request=request)
    how = run_input.get("fail")
    if how == "fail":
        ctx.fail("out_of_stock")
    if how == "ship":  # refused: a StepFailed the code does not catch
        ctx.http("ship", connection="api", method="POST", url=f"{url}/ship")
    if how == "raise":
        raise ValueError("boom")
    return {"charged": run_input.get("charges", 1)}


@workflow("code-catch", version=1)
def ship_or_not(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """Ships; a refused shipment is caught, recorded, and the run goes on."""
    try:
        ctx.http("ship", connection="api", method="POST", url=f"{run_input['url']}/ship")
        caught = None
    except StepFailed as failed:
        caught = {"step": failed.step_id, "iteration": failed.iteration, "code": failed.code,
                  "error": failed.error}  # fmt: skip
    seen = ctx.run("after", dict, caught=caught)  # what the first replay past it saw
    return {"caught": caught, "seen": seen}
