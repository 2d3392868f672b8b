"""The code workflow that tests/test_code_workflow_crashes.py kills at every crash point: named
in its engine processes' WAYMARK_EXTRA_STEP_MODULES, so each registers it as a host's ready()
would (and imported by the test, so its own process can publish it).

It calls one of each kind of thing a run waits on or does outside (after a noop, which runs
with the turn that asked it): an http effect with its
compensation (a refund, made if the run fails), a sleep until a wall-clock time in a zone, a
signal with a timeout, a parallel pair (one of its branches a parallel of its own), an
approval posted to Slack."""

from __future__ import annotations

from typing import Any

from workflows.plugins.code import Context, workflow

NAME = "code-crash-tour"
ZONE = "Europe/Berlin"
MORNING = "09:00"  # the zoned sleep ends at the next 09:00 in ZONE


def _pair_left(ctx: Context) -> Any:
    return ctx.run("left", str, "left")


def _pair_right(ctx: Context) -> Any:
    # Parallels nest: this branch's own pair, decided by deciders of their own.
    return ctx.parallel("deeper", lambda c: c.run("right", str, "right"),
                        lambda c: c.run("deep", str, "deep"))  # fmt: skip


@workflow(NAME, version=1)
def tour(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    url = run_input["url"]
    # A pure step first: it runs in the first turn's settle (engine/walk.py _ran_with_turn),
    # the settle the first crash point of a settle kills.
    ctx.step("accepted", "noop", output=run_input["order"])
    charged = ctx.http(
        "charge", connection="api", method="POST", url=f"{url}/items",
        body={"order": run_input["order"]},
    )  # fmt: skip
    charge_id = charged["body"]["id"]
    # Sagas: undone once if the run fails below.
    ctx.compensate_with_http("refund", connection="api", method="POST", url=f"{url}/items",
                             body={"refund": charge_id})  # fmt: skip
    ctx.step("morning", "wait_until", rule={"time": MORNING}, timezone=ZONE)
    paid = ctx.wait_signal("paid", signal="paid", correlation=run_input["order"], timeout="1h")
    pair = ctx.parallel("pair", _pair_left, _pair_right)  # two branches live at once
    asked = ctx.step_result(
        "ask", "approval", approvers=["group:finance"], deadline="1d",
        message=f"Ship order {run_input['order']}?", content={"order": run_input["order"]},
        connection="slack", channel="C0APPROVE",
    )  # fmt: skip
    if asked.outcome != "approved":
        payment = "timed out" if paid.timed_out else "received"
        ctx.fail(f"not approved ({asked.outcome}), payment {payment}")
    return {
        "charge": charge_id,
        "paid": None if paid.timed_out else paid.payload,
        "approved_by": asked.output["by"],
        "pair": pair,
    }
