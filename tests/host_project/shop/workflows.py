"""The host app's code workflow, registered by its AppConfig.ready() in every process."""

from typing import TypedDict

from workflows.plugins.code import Context, workflow


class Customer(TypedDict):
    name: str


def greeting(name: str) -> str:
    return f"Hello {name}, from code"


@workflow("greet-customer", version=1)
def greet_customer(ctx: Context, customer: Customer) -> dict[str, str]:
    text = ctx.run("greet", greeting, customer["name"])
    ctx.sleep("pause", "1s")  # the sweep, in the host's engine, wakes it
    return {"message": text}
