"""Code workflows that go wrong in each of the ways a host's code can (issue 42's bad input),
registered here so that both the tests' own process and the engine processes they start
(WAYMARK_EXTRA_STEP_MODULES) have them."""

from __future__ import annotations

from typing import Any

from workflows.plugins.code import Context, workflow


@workflow("code-type-conflict", version=1)
def one_id_two_types(ctx: Context, run_input: dict[str, Any]) -> str:
    ctx.run("a", str, "first")
    ctx.sleep("a", "1s")  # the same id, another step type
    return "unreachable"


@workflow("code-unserialisable", version=1)
def returns_an_object(ctx: Context, run_input: dict[str, Any]) -> str:
    ctx.run("made", object)  # an object is not JSON
    return "unreachable"


@workflow("code-too-large", version=1)
def returns_too_much(ctx: Context, run_input: dict[str, Any]) -> str:
    ctx.run("big", str.__mul__, "x", int(run_input["size"]))
    return "unreachable"


@workflow("code-bad-output", version=1, output_schema={"type": "object", "required": ["id"]})
def returns_the_wrong_shape(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    return {"name": "no id"}


@workflow("code-raises", version=1)
def raises(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.run("first", str, "x")
    raise LookupError("no such order")


@workflow("code-raises-nul", version=1)
def raises_with_a_nul(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.run("first", str, "x")
    raise ValueError("bad byte \x00 in the order")  # text refuses a NUL: stored escaped


BAD_INPUT = {  # each workflow, and the code its run fails with
    "code-type-conflict": "step_type_conflict",
    "code-unserialisable": "unserialisable_result",
    "code-too-large": "result_too_large",
    "code-bad-output": "invalid_output",
    "code-raises": "workflow_failed",
    "code-raises-nul": "workflow_failed",
}
