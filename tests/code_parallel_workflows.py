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


@workflow("code-par-waits", version=1)
def waits(ctx: Context, run_input: dict[str, Any]) -> list[Any]:
    """One branch sleeps then records, the other waits for a signal: both wait at once."""

    def napper(c: Context) -> Any:
        c.sleep("nap", "1h")
        return c.run("woke", str, "rested")

    def listener(c: Context) -> Any:
        got = c.wait_signal("go", signal="go", correlation=run_input["order"])
        return got.payload

    return ctx.parallel("both", napper, listener)


@workflow("code-par-first", version=1)
def first(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """The first branch to end wins; the other, waiting for a signal, is cancelled."""

    def quick(c: Context) -> Any:
        c.wait_signal("go", signal="go", correlation="first")
        return c.run("fast", str, "quick")

    def stuck(c: Context) -> Any:
        c.wait_signal("never", signal="never", correlation="none")
        return "slow"

    met = ctx.parallel("race", quick, stuck, complete="first")
    return {"met": met, "after": ctx.run("after", str, "after")}


@workflow("code-par-loop", version=1)
def loop(ctx: Context, run_input: dict[str, Any]) -> list[Any]:
    """ctx.parallel in a loop: each pass forks anew, its steps the next iteration."""
    seen = []
    for turn in range(run_input["turns"]):

        def double(c: Context, turn: int = turn) -> Any:
            return c.run("double", lambda n: n * 2, turn)

        def square(c: Context, turn: int = turn) -> Any:
            return c.run("square", lambda n: n * n, turn)

        seen.append(ctx.parallel("round", double, square))
    return seen


@workflow("code-par-nested", version=1)
def nested(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """Parallels inside parallels. Both outer branches fork a parallel of the same id (the
    engine tells their branches apart), one of its branches waiting for a signal while the
    other sleeps; the third goes two levels deeper; one step after everything met."""
    order = run_input["order"]

    def side(name: str) -> Any:
        def outer_branch(c: Context) -> Any:
            def listener(d: Context) -> Any:
                return d.wait_signal("go", signal="go", correlation=f"{order}-{name}").payload

            def napper(d: Context) -> Any:
                d.sleep("nap", "1h")
                return d.run("woke", str, f"{name} rested")

            heard, rested = c.parallel("inner", listener, napper)
            return c.run("tally", str, f"{name}: {heard}/{rested}")

        return outer_branch

    def deep(c: Context) -> Any:
        def core(d: Context) -> Any:
            return d.parallel("core", lambda e: e.run("leaf", str, "a"),
                              lambda e: e.run("leaf", str, "b"))  # fmt: skip

        return c.parallel("mid", core, lambda d: d.run("leaf", str, "c"))

    met = ctx.parallel("outer", side("left"), side("right"), deep)
    return {"met": met, "after": ctx.run("after", str, "after")}


@workflow("code-par-nested-first", version=1)
def nested_first(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """The first outer branch to end wins; the other, inside a parallel of its own (one
    branch waiting for a signal, one asleep), is cancelled with everything under it."""

    def quick(c: Context) -> Any:
        c.wait_signal("go", signal="go", correlation="nested-first")
        return "quick"

    def stuck(c: Context) -> Any:
        def never(d: Context) -> Any:
            return d.wait_signal("never", signal="never", correlation="none").payload

        def asleep(d: Context) -> Any:
            d.sleep("nap", "1h")
            return d.run("woke", str, "rested")

        return c.parallel("inner", never, asleep)

    met = ctx.parallel("race", quick, stuck, complete="first")
    return {"met": met, "after": ctx.run("after", str, "after")}


@workflow("code-par-nested-race", version=1)
def nested_race(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """Two outer branches, each a parallel of two branches of two worker steps: four
    branches' settles race on two worker processes, two levels deep."""

    def leaf(name: str) -> Any:
        def run(c: Context) -> str:
            c.step("first", "probe", output={"branch": name})
            c.step("second", "probe", output={"branch": name})
            return name

        return run

    def side(name: str) -> Any:
        def run(c: Context) -> Any:
            return c.parallel("inner", leaf(f"{name}a"), leaf(f"{name}b"))

        return run

    met = ctx.parallel("fan", side("x"), side("y"))
    after = ctx.step("after", "probe")
    return {"met": met, "after": after["attempt"]}
