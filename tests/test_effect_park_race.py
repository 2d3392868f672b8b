"""A repair or a raised budget that comes while a step is parking on it: two real threads, one
parking the step, one waking what is parked, forced into the window where the waker has
already looked for parked steps (and found none) and the park commits before the waker does.
The step must wake at once, not at its re-check (set to an hour here, so a miss shows)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from effects import resolve
from effects.models import Effect, ModelBudget
from effects.resolve import budget_raised, repair_connection
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, settle_and_take_next
from workflows.engine.worker import Attempt, Worker
from workflows.plugins.engine import own_connection

from .effect_setup import connect, drive, events, one_step, post_item, start
from .test_effects import model_step, run_of, send_step

pytestmark = pytest.mark.django_db(transaction=True)

CEILING = 60.0  # seconds: generous, for a loaded machine; the race itself takes moments


@pytest.fixture(autouse=True)
def _recheck_in_an_hour(settings: Any) -> None:
    settings.EFFECTS = {**settings.EFFECTS, "RECHECK_SECONDS": 3600}


def poll(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CEILING
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def parking_attempt(lane: str) -> tuple[Any, Any, Worker]:
    """Claim the ready step and run its executor: the park it returns, not yet settled."""
    worker = Worker(lane_policy(lane), concurrency=1, name="test-worker")
    (claimed,) = claim(policy=worker.policy, worker=worker.name, limit=1)
    result, failure = worker._run_executor(
        Attempt(claimed, deadline=time.monotonic() + 60, extended=time.monotonic())
    )
    assert failure is None and result is not None and result.park is not None
    return claimed, result, worker


def someone_waits_on_a_lock() -> bool:
    """A backend of this database waits for a row lock on a FOR SHARE read (the park's look
    after its commit, blocked by the waker's open transaction)."""
    with own_connection() as db:
        row = db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query ILIKE '%%FOR SHARE%%'"
        ).fetchone()
    return bool(row and row[0])


def race(monkeypatch: pytest.MonkeyPatch, claimed: Any, result: Any, worker: Worker,
         wake: Callable[[], int]) -> int:  # fmt: skip
    """Run ``wake`` on one thread and the park's settle on another, the waker held in its
    transaction right after it looked for parked steps (it found none: the step is still
    settling) until the park has committed and either finished or blocked on the waker's
    lock. Returns how many steps the waker woke itself."""
    looked, parked = threading.Event(), threading.Event()
    real_wake_parked = resolve.wake_parked
    woken: list[int] = []
    errors: list[BaseException] = []

    def held_wake_parked(cursor: Any, *args: Any) -> int:
        count = real_wake_parked(cursor, *args)
        looked.set()
        poll(lambda: parked.is_set() or someone_waits_on_a_lock(), "the park to commit")
        return count

    monkeypatch.setattr(resolve, "wake_parked", held_wake_parked)

    def waker() -> None:
        try:
            woken.append(wake())
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            looked.set()
        finally:
            connection.close()

    def parker() -> None:
        try:
            assert looked.wait(CEILING)
            settle_and_take_next(claimed, result, worker=worker.name)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            parked.set()
            connection.close()

    threads = [threading.Thread(target=waker), threading.Thread(target=parker)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CEILING * 2)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    monkeypatch.setattr(resolve, "wake_parked", real_wake_parked)
    return woken[0]


@pytest.mark.parametrize("how", ["repair", "new_secret_through_the_api"])
def test_a_connection_repaired_while_its_step_parks_wakes_the_step_at_once(
    org, provider_stub, api, monkeypatch, how
):
    conn = connect(org, base_url=provider_stub.url, status="broken",
                   broken_reason="reconnect api: 401")  # fmt: skip
    run_id = start(org, one_step(post_item(provider_stub.url)))
    claimed, result, worker = parking_attempt("io")
    assert result.park.detail["parked_on"] == f"connection:{conn.pk}"

    def new_secret() -> int:
        answer = api.patch("/api/v1/connections/api", {"secret": "s3cret-2"}, format="json")
        assert answer.status_code == 200 and answer.json()["status"] == "ok", answer.json()
        return 0

    repair = {"repair": lambda: repair_connection(conn, by="sam"),
              "new_secret_through_the_api": new_secret}[how]  # fmt: skip
    woken_by_repair = race(monkeypatch, claimed, result, worker, repair)

    assert woken_by_repair == 0  # it looked before the park committed
    step = send_step(run_id)
    assert (step.status, step.wait_kind) == ("ready", "")  # not parked for the hour
    assert len(events(run_id, "step.woken_at_park")) == 1
    drive(fast_forward=False)
    assert run_of(run_id).status == "succeeded" and len(provider_stub.created) == 1


def test_a_budget_raised_while_its_step_parks_wakes_the_step_at_once(org, model_stub, monkeypatch):
    connect(org, provider="model", name="llm", base_url=f"{model_stub.url}/v1",
            options={"model": "stub-1", "price_prompt_per_1k": "1",
                     "price_completion_per_1k": "2"})  # fmt: skip
    ModelBudget.objects.create(org=org, limit=Decimal("1"), spent=Decimal("1"))
    run_id = start(org, one_step(model_step(), output="{{ steps.send.output.text }}"))
    claimed, result, worker = parking_attempt("slow")
    assert result.park.detail["parked_on"] == f"budget:{org.pk}"

    def raise_budget() -> int:  # as the admin does: the limit saved, then the wake
        ModelBudget.objects.filter(org=org).update(limit=Decimal("5"))
        return budget_raised(org.pk, by="sam")

    assert race(monkeypatch, claimed, result, worker, raise_budget) == 0
    step = send_step(run_id)
    assert (step.status, step.wait_kind) == ("ready", "")
    assert len(events(run_id, "step.woken_at_park")) == 1
    drive(lane="slow", fast_forward=False)
    assert run_of(run_id).status == "succeeded"
    assert model_stub.count("POST") == 1 and Effect.objects.get(run_id=run_id).cost


def test_a_step_parked_on_a_budget_still_short_stays_parked(org, model_stub):
    """The park's look after its commit wakes only when the call would fit now."""
    connect(org, provider="model", name="llm", base_url=f"{model_stub.url}/v1",
            options={"model": "stub-1"})  # fmt: skip
    ModelBudget.objects.create(org=org, limit=Decimal("1"), spent=Decimal("0.8"))
    run_id = start(org, one_step(model_step("0.5"), output="{{ steps.send.output.text }}"))
    drive(lane="slow", fast_forward=False)
    step = send_step(run_id)
    assert (step.status, step.wait_kind) == ("waiting", "external")
    assert events(run_id, "step.woken_at_park") == [] and model_stub.count("POST") == 0
