"""A workflow that catches more than it should: a bare ``except:``, an ``except BaseException``
or a ``finally`` around a ctx call sees the exception that stops the function at a call with
no recorded result (docs/reference/code-workflows-at-run-time.md). The turn ends with that
stop all the same: a return after it, or another call, does not take the run anywhere else.
Before, a bare ``except`` around a signal wait returned at once (the run succeeded without
ever waiting), a retry loop catching BaseException returned None without calling its
function, and a ``finally`` ran its cleanup before the step it guarded, then failed the run
as nondeterministic."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from workflows.models import Organisation
from workflows.plugins.code import Context, workflow
from workflows.plugins.testing import WorkflowTest

pytestmark = pytest.mark.django_db(transaction=True)

CALLED: list[str] = []


def charge(order: str) -> dict[str, str]:
    CALLED.append(order)
    return {"charged": order}


@workflow("caught-bare", version=1)
def bare_except(ctx: Context, run_input: dict[str, Any]) -> dict[str, Any]:
    try:
        paid = ctx.wait_signal("paid", signal="paid", correlation=run_input["order"], timeout="1d")
    except:  # noqa: E722 (the mistake this test is about)
        return {"paid": "unknown"}
    return {"paid": paid.payload}


@workflow("caught-retry-loop", version=1)
def retry_loop(ctx: Context, run_input: dict[str, Any]) -> Any:
    for attempt in range(3):
        try:
            return ctx.run(f"charge_{attempt}", charge, run_input["order"])
        except BaseException:  # noqa: S112 (the mistake this test is about)
            continue
    return None


@workflow("caught-finally", version=1)
def cleanup_in_finally(ctx: Context, run_input: dict[str, Any]) -> str:
    try:
        ctx.sleep("nap", "1h")
    finally:
        ctx.step("cleanup", "noop")
    return "done"


@workflow("caught-fail", version=1)
def swallowed_fail(ctx: Context, run_input: dict[str, Any]) -> str:
    try:  # noqa: SIM105
        ctx.fail("out_of_stock")
    except:  # noqa: E722, S110 (the mistake this test is about)
        pass
    return "sold"


def test_a_bare_except_around_a_wait_still_waits(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("caught-bare", version=1, input={"order": "o-1"})
    run = t.run_until_waiting()
    assert [s.step_id for s in run.waiting] == ["paid"]  # not finished with "unknown"
    t.signal("paid", correlation="o-1", payload={"amount": 5})
    run = t.run_until_finished()
    assert (run.status, run.output) == ("succeeded", {"paid": {"amount": 5}})


def test_a_retry_loop_catching_base_exception_calls_its_function(org: Organisation) -> None:
    CALLED.clear()
    t = WorkflowTest(org=org)
    t.start("caught-retry-loop", version=1, input={"order": "o-2"})
    run = t.run_until_finished()
    assert (run.status, run.output) == ("succeeded", {"charged": "o-2"})
    assert CALLED == ["o-2"]
    assert [s.step_id for s in run.steps if s.type == "code_result"] == ["charge_0"]


def test_a_finally_runs_its_calls_once_the_guarded_step_has_ended(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("caught-finally", version=1, input={})
    run = t.run_until_waiting()
    assert [s.step_id for s in run.waiting] == ["nap"]
    assert "cleanup" not in [s.step_id for s in run.steps]
    t.skip_time()
    run = t.run_until_finished()
    assert (run.status, run.output) == ("succeeded", "done")
    taken = [s.step_id for s in run.steps if s.type != "code"]
    assert taken == ["nap", "cleanup"]


def test_a_fail_the_code_swallows_still_fails_the_run(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("caught-fail", version=1, input={})
    run = t.run_until_finished()
    assert run.status == "failed" and "out_of_stock" in run.error


@workflow("nested-in-run", version=1)
def step_inside_run(ctx: Context, run_input: dict[str, Any]) -> Any:
    return ctx.run("outer", lambda: ctx.sleep("inner", "1s"))


@workflow("truthy-signal", version=1)
def if_signal(ctx: Context, run_input: dict[str, Any]) -> str:
    paid = ctx.wait_signal("paid", signal="paid", correlation="o-9", timeout="1h")
    return "paid" if paid else "not paid"


def test_a_step_called_inside_a_ctx_run_function_is_refused_and_enters_nothing(
    org: Organisation,
) -> None:
    """Entered from inside, the step ran before the function's own result was recorded,
    and the run then failed as nondeterministic, naming neither."""
    t = WorkflowTest(org=org)
    t.start("nested-in-run", version=1, input={})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error.startswith("invalid_code_step: step 'inner' (a wait step) is called inside")
    assert "inner" not in [s.step_id for s in run.steps]


def test_a_signals_result_is_not_read_as_true_or_false(org: Organisation) -> None:
    """`if paid:` was always true (a dataclass), a timeout read as a signal: it fails the
    run saying what to test instead."""
    t = WorkflowTest(org=org)
    t.start("truthy-signal", version=1, input={})
    t.run_until_waiting()
    t.skip_time()  # timed out
    run = t.run_until_finished()
    assert run.status == "failed"
    assert "SignalResult is neither true nor false: test result.timed_out" in run.error


@workflow("wrong-keyword", version=1)
def wrong_keyword(ctx: Context, run_input: dict[str, Any]) -> None:
    ctx.sleep("nap", seconds=10)  # type: ignore[call-arg]


@workflow("timedelta-sleep", version=1)
def timedelta_sleep(ctx: Context, run_input: dict[str, Any]) -> str:
    ctx.sleep("nap", timedelta(minutes=5))
    return "rested"


async def fetch_async() -> int:
    return 1


@workflow("async-run", version=1)
def async_run(ctx: Context, run_input: dict[str, Any]) -> Any:
    return ctx.run("fetch", fetch_async)


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("wrong-keyword", "invalid_code_step: ctx.sleep: "),
        ("async-run", "invalid_code_step: ctx.run 'fetch': an async function"),
    ],
)
def test_a_call_the_code_got_wrong_fails_with_invalid_code_step(
    org: Organisation, name: str, error: str
) -> None:
    """Not workflow_failed (the code's own exception, a business failure to its readers):
    the call's arguments, as a field its step type refuses."""
    t = WorkflowTest(org=org)
    t.start(name, version=1, input={})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert run.error.startswith(error), run.error


def test_a_sleep_takes_a_timedelta_of_whole_seconds(org: Organisation) -> None:
    t = WorkflowTest(org=org)
    t.start("timedelta-sleep", version=1, input={})
    run = t.run_until_waiting()
    assert [s.step_id for s in run.waiting] == ["nap"]
    t.skip_time()
    assert t.run_until_finished().output == "rested"


@workflow("caught-raises-after", version=1)
def raises_after_the_stop(ctx: Context, run_input: dict[str, Any]) -> Any:
    def guarded(c: Context) -> bool:
        try:
            waited = c.wait_signal("paid", signal="paid", correlation="after", timeout="1h")
        finally:
            # Reads what the call gave back, unbound while the call stops the turn: raised
            # here, after the stop. It read as the code's own failure.
            if not waited.timed_out:
                raise RuntimeError("paid, not timed out")
        return bool(waited.timed_out)

    if run_input["where"] == "branch":
        return ctx.parallel("fan", guarded, lambda c: "other")
    try:
        ctx.sleep("nap", "1m")
    except BaseException as stopped:  # (the mistake this test is about)
        raise RuntimeError("wrapped") from stopped
    return guarded(ctx)


@pytest.mark.parametrize("where", ["top", "branch"])
def test_an_exception_raised_after_a_call_stopped_the_turn_does_not_fail_the_run(
    org: Organisation, where: str
) -> None:
    """The turn ends with the call that stopped it, as when the code returns after it: the
    step is entered, and the code runs on once it has ended (docs, "When a step fails")."""
    t = WorkflowTest(org=org)
    t.start("caught-raises-after", version=1, input={"where": where})
    for _ in range(2 if where == "top" else 1):
        run = t.run_until_waiting()
        assert run.status == "running", run.error
        t.skip_time()
    run = t.run_until_finished()
    assert (run.status, run.error) == ("succeeded", ""), run.error
    assert run.output == (True if where == "top" else [True, "other"])


@workflow("numbered-correlation", version=1)
def numbered_correlation(ctx: Context, run_input: dict[str, Any]) -> Any:
    return ctx.wait_signal("paid", signal="paid", correlation=run_input["order"]).payload


@pytest.mark.parametrize("order", [0, 42])
def test_a_correlation_that_is_a_number_is_refused_as_one(org: Organisation, order: int) -> None:
    """0 read as no correlation at all: "correlation is required"."""
    t = WorkflowTest(org=org)
    t.start("numbered-correlation", version=1, input={"order": order})
    run = t.run_until_finished()
    assert run.status == "failed"
    assert "correlation must be a string" in run.error, run.error
