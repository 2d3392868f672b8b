"""A module that registers one workflow version twice, named in a child process's
WAYMARK_EXTRA_STEP_MODULES by tests/test_code_workflows_checks.py (never imported by the
tests' own process)."""

from typing import Any

from workflows.plugins.code import Context, workflow


@workflow("code-twice", version=1)
def first(ctx: Context, run_input: dict[str, Any]) -> None:
    return None


@workflow("code-twice", version=1)
def again(ctx: Context, run_input: dict[str, Any]) -> None:
    return None
