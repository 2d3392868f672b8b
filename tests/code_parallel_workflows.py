"""The code workflows of tests/test_code_workflow_parallel.py that engine processes run too:
named in their WAYMARK_EXTRA_STEP_MODULES, so each process registers them as a host's
ready() would."""

from __future__ import annotations

from typing import Any

from workflows.plugins.code import Context, workflow


@workflow("code-par-pair", version=1)
def pair(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """Two http effects at once, each branch calling a step of the same id."""
    url = run_input["url"]

    def send(name: str) -> Any:
        def branch(c: Context) -> Any:
            made = c.http("send", connection="api", method="POST", url=f"{url}/items",
                          body={"branch": name})  # fmt: skip
            return made["body"]["id"]

        return branch

    left, right = ctx.parallel("pair", send("left"), send("right"))
    return {"left": left, "right": right}


@workflow("code-par-race", version=1)
def race(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """Two branches of two worker steps each: their settles race on two worker processes."""

    def branch(name: str) -> Any:
        def run(c: Context) -> str:
            c.step("first", "probe", output={"branch": name})
            c.step("second", "probe", output={"branch": name})
            return name

        return run

    met = ctx.parallel("fan", branch("a"), branch("b"))
    after = ctx.step("after", "probe")
    return {"met": met, "after": after["attempt"]}
