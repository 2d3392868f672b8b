"""A code workflow the crash tests' engine processes run: named in their
WAYMARK_EXTRA_STEP_MODULES, so each process registers it as a host's ready() would."""

from __future__ import annotations

from typing import Any

from workflows.plugins.code import Context, workflow


def price_of(items: list[int]) -> int:
    return sum(items)


@workflow("code-crash", version=1)
def charge_once(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    total = ctx.run("price", price_of, run_input["items"])
    created = ctx.http(
        "charge", connection="api", method="POST", url=f"{run_input['url']}/items",
        body={"total": total},
    )  # fmt: skip
    return ctx.run("receipt", dict, charge=created["body"]["id"], total=total)  # type: ignore[no-any-return]
