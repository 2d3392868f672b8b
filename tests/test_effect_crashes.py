"""The effect ledger under SIGKILL: a worker process dies (a) before the call, (b) while the
provider holds the request, (c) after the provider answered and before the answer was
recorded. A second worker then finishes the run.

For every point and three kinds of provider, what the provider saw:
- one that honours Idempotency-Key: exactly one item created;
- one without keys but with a lookup by key: exactly one;
- one with neither: the effect ends needs_review, and the provider saw at most one call.
"""

from __future__ import annotations

import signal

import pytest

from effects.models import Effect
from effects.resolve import park_orphaned_calls, resolve_effect
from workflows.models import Run, RunEvent, Step
from workflows.services.control import run_act

from .effect_setup import connect, one_step, post_item, start
from .processes import running, spawn, stop, wait_for

pytestmark = [pytest.mark.long_running, pytest.mark.django_db(transaction=True)]

FAST: dict[str, str] = {
    "WAYMARK_EFFECTS_LEASE_MARGIN_SECONDS": "1",
    "WAYMARK_EFFECTS_DEFER_SECONDS": "0.2",
    "WAYMARK_WORKER_POLL_SECONDS": "0.1",
}
KINDS: dict[str, dict[str, object]] = {
    "idempotent": {"idempotency_keys": True},
    # The provider makes what it was sent within a second: a miss after that is trusted.
    "lookup": {"lookup_url": "LOOKUP", "lookup_settle_seconds": 1},
    "neither": {},
}


def worker(concurrency: int, **env: str):
    """An io worker with short effect leases and quick looks."""
    return spawn("worker", "--lane", "io", "--concurrency", str(concurrency), "--grace", "5",
                 **{**FAST, **env})  # fmt: skip


def effect_of(run_id: int) -> Effect | None:
    return Effect.objects.filter(run_id=run_id).first()


def run_status(run_id: int) -> str | None:
    status = Run.objects.get(pk=run_id).status
    return status if status != "running" else None


def parked_for_review(run_id: int) -> Effect | None:
    step = Step.objects.get(run_id=run_id, step_id="send")
    effect = effect_of(run_id)
    if step.status == "waiting" and effect is not None and effect.state == "needs_review":
        return effect
    return None


def set_up(org, stub, kind: str) -> int:
    stub.idempotent = kind == "idempotent"
    stub.lookup = kind == "lookup"
    options = {k: (f"{stub.url}/items?key={{key}}" if v == "LOOKUP" else v)
               for k, v in KINDS[kind].items()}  # fmt: skip
    connect(org, base_url=stub.url, options=options, timeout_seconds=3)
    return start(org, one_step(post_item(stub.url)))


def crash_worker(point: str, stub, run_id: int):
    """Worker A, killed at ``point``; returns once it is dead."""
    if point == "while_held":
        stub.hold()
        a = worker(1)
        with running(a):
            assert stub.wait_arrived(1, timeout=30), "the call never reached the provider"
            a.send_signal(signal.SIGKILL)
            a.wait(timeout=10)
        stub.release()  # the provider finishes the work its client no longer waits for
        wait_for(lambda: stub.created, what="the held request to create its item")
        return
    crash_at = {"before_call": "effect.before_call", "after_answer": "effect.after_answer"}[point]
    a = worker(1, WAYMARK_CRASH_AT=crash_at)
    with running(a):
        assert a.wait(timeout=60) == 137, "worker A should have died at the crash point"


@pytest.mark.parametrize("kind", ["idempotent", "lookup"])
@pytest.mark.parametrize("point", ["before_call", "while_held", "after_answer"])
def test_a_killed_worker_never_makes_a_second_effect(org, provider_stub, kind, point):
    run_id = set_up(org, provider_stub, kind)
    crash_worker(point, provider_stub, run_id)
    made_before = len(provider_stub.created)
    assert made_before == (0 if point == "before_call" else 1)
    effect = effect_of(run_id)
    assert effect is not None and effect.state == "in_flight"  # nobody recorded an answer

    b = worker(2)
    with running(b):
        status = wait_for(lambda: run_status(run_id), timeout=60, what="the run to end")
        stop(b)
    assert status == "succeeded"
    assert len(provider_stub.created) == 1, provider_stub.created
    effect.refresh_from_db()
    assert effect.state == "settled"
    run = Run.objects.get(pk=run_id)
    assert run.output == provider_stub.created[0]["id"]
    # The uncertainty was seen and reconciled, not ignored.
    kinds = set(RunEvent.objects.filter(run_id=run_id).values_list("kind", flat=True))
    assert {"effect.outcome_unknown", "effect.reconciled"} <= kinds


@pytest.mark.parametrize("point", ["before_call", "while_held", "after_answer"])
def test_without_keys_or_lookup_the_effect_waits_for_a_person(org, provider_stub, point):
    run_id = set_up(org, provider_stub, "neither")
    crash_worker(point, provider_stub, run_id)
    b = worker(2)
    with running(b):
        effect = wait_for(lambda: parked_for_review(run_id), timeout=60,
                          what="the effect to need review")  # fmt: skip
        calls = provider_stub.count("POST", "/items")
        assert calls == (0 if point == "before_call" else 1)
        assert effect.first_attempt_at is not None and effect.calls == 1
        # A person who checked at the provider marks it done: the run goes on with that.
        resolve_effect(effect.pk, "done", by="sam", result={"body": {"id": "checked-by-sam"}})
        status = wait_for(lambda: run_status(run_id), timeout=60, what="the run to end")
        stop(b)
    assert status == "succeeded"
    assert provider_stub.count("POST", "/items") == calls  # nobody called it again
    assert Run.objects.get(pk=run_id).output == "checked-by-sam"
    assert RunEvent.objects.filter(run_id=run_id, kind="effect.resolved").count() == 1


def test_a_slow_provider_holds_a_step_not_the_worker(org, provider_stub):
    """While the provider holds one request, the worker's heartbeats and its other steps go
    on; the call is abandoned at the connection's timeout and recorded outcome_unknown,
    then repeated under the same key once the provider is back."""
    provider_stub.idempotent = True
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True},
            timeout_seconds=4)  # fmt: skip
    held = start(org, one_step(post_item(provider_stub.url), retry=10), key="held")
    provider_stub.hold()  # only POST /items waits here; /echo answers at once
    b = worker(2, WAYMARK_IO_LEASE_SECONDS="1")
    with running(b):
        assert provider_stub.wait_arrived(1, timeout=30)
        first_lease = Step.objects.get(run_id=held, step_id="send").lease_until
        echo = {"type": "http", "connection": "api",
                "request": {"method": "POST", "url": f"{provider_stub.url}/echo"}}  # fmt: skip
        other = start(org, one_step(echo, output="{{ steps.send.output.status }}"),
                      key="other", slug="other")  # fmt: skip
        assert wait_for(lambda: run_status(other), what="the other run") == "succeeded"
        # Heartbeats went on for the held step (1 s leases, renewed every third of one).
        wait_for(lambda: Step.objects.get(run_id=held, step_id="send").lease_until != first_lease,
                 what="the held step's lease to be extended")  # fmt: skip
        # Abandoned at its 4 s timeout: the effect's outcome is unknown, not failed.
        wait_for(lambda: RunEvent.objects.filter(run_id=held, kind="effect.outcome_unknown"),
                 what="the abandoned call to be recorded")  # fmt: skip
        provider_stub.release()
        status = wait_for(lambda: run_status(held), timeout=60, what="the held run to end")
        stop(b)
    assert status == "succeeded"
    assert len(provider_stub.created) == 1  # the held request made it; the repeat found it
    effect = effect_of(held)
    assert effect is not None and effect.state == "settled" and effect.calls >= 2


def test_a_call_left_in_flight_by_a_cancelled_run_is_parked_for_a_person(org, provider_stub):
    """The worker dies mid-call and the run is cancelled before anyone takes the step over:
    no attempt will ever reconcile the effect. Once its lease has lapsed the sweep parks it
    for a person (who checks at the provider), instead of leaving it in flight for ever; an
    effect whose step still lives is left to that step's next attempt."""
    cancelled = set_up(org, provider_stub, "neither")
    crash_worker("before_call", provider_stub, cancelled)
    live = start(org, one_step(post_item(provider_stub.url)), key="live", slug="live")
    Effect.objects.create(org=org, run_id=live, step_id="send", iteration=1, key="live-key",
                          provider="http", state="in_flight", token="t", owner="gone",
                          step_attempt=1)  # fmt: skip
    run_act(org=org, run_id=cancelled, action="cancel", actor="test")
    effect = effect_of(cancelled)
    assert effect is not None and effect.state == "in_flight"

    def parked() -> int:  # both leases lapse (4 s for the dead worker's): only one is parked
        Effect.objects.filter(run_id=live).update(lease_until=effect.lease_until)
        return park_orphaned_calls(after=0)

    assert wait_for(parked, what="the dead worker's lease to lapse") == 1
    effect.refresh_from_db()
    assert effect.state == "needs_review" and "check at the provider" in effect.error
    assert Effect.objects.get(run_id=live).state == "in_flight"
    assert RunEvent.objects.filter(run_id=cancelled, kind="effect.needs_review").count() == 1
    assert park_orphaned_calls(after=0) == 0  # once

    resolve_effect(effect.pk, "done", by="sam", result={"body": {"id": "none-made"}})
    effect.refresh_from_db()
    assert effect.state == "settled"
    assert Run.objects.get(pk=cancelled).status == "cancelled"
