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


@workflow("code-values", version=1)
def recorded_values(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """Time, an id and a random number, read before a sleep and again after it."""
    first = {"now": ctx.now().isoformat(), "uuid": str(ctx.uuid()), "random": ctx.random()}
    ctx.run("seen", dict, first)  # what the function saw before the sleep, recorded
    ctx.sleep("nap", "1s")
    return {**first, "later": ctx.now().isoformat()}
