"""Regression tests for holes a review of the effect ledger found: each drives the exact
interleaving or answer that used to duplicate an effect, strand a step, leak budget or leak
a secret."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from effects.ledger import Call, _mark_broken
from effects.models import Connection, Effect, ModelBudget, Suppression
from effects.perform import PROVIDERS, load_connection
from effects.providers.base import AuthFailed
from effects.resolve import reconcile_budgets, resolve_effect
from workflows.engine.executors import StepContext
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, promote_due_retries, settle_and_take_next
from workflows.engine.worker import Attempt, Worker
from workflows.models import Run, Step
from workflows.services.control import run_act

from .effect_setup import connect, drive, events, one_step, post_item, start
from .test_effects import info, run_of, send_step

pytestmark = pytest.mark.django_db(transaction=True)


def unknown_effect(org, run_id: int, conn: Connection, **fields) -> Effect:
    now = timezone.now()
    defaults = {"first_attempt_at": now, "last_attempt_at": now, "calls": 1,
                "external_key": f"{run_id}/send/1:abc"}  # fmt: skip
    row = {"state": "outcome_unknown", **defaults, **fields}
    return Effect.objects.create(
        org=org, run_id=run_id, step_id="send", iteration=1, key=f"{run_id}/send/1",
        provider=conn.provider, connection=conn, **row,
    )  # fmt: skip


def test_a_lookup_miss_right_after_a_call_is_not_trusted(org, provider_stub):
    """The last call began a moment ago: the provider may still be making the item, so a
    lookup that finds nothing proves nothing yet. The step waits; nothing is sent."""
    provider_stub.lookup = True
    options = {"lookup_url": f"{provider_stub.url}/items?key={{key}}", "lookup_settle_seconds": 60}
    conn = connect(org, base_url=provider_stub.url, options=options)
    run_id = start(org, one_step(post_item(provider_stub.url)))
    unknown_effect(org, run_id, conn)
    drive(rounds=1, fast_forward=False)
    assert provider_stub.count("POST") == 0 and provider_stub.count("GET", "/items") == 1
    assert "not found yet" in info(events(run_id, "step.deferred")[0])["error"]
    # Long after the last call, a miss is trusted: the call goes out, once.
    Effect.objects.filter(run_id=run_id).update(last_attempt_at=timezone.now() - timedelta(hours=1))
    drive()
    assert run_of(run_id).status == "succeeded" and len(provider_stub.created) == 1


def test_a_redirect_after_the_effect_is_the_answer_not_a_failure(org, provider_stub):
    """POST /orders creates, then answers 303 to an address nobody can reach. Following it
    would fail and call the order "not made"; the answer is the 303, settled, once."""
    connect(org, base_url=provider_stub.url)
    request = {"method": "POST", "url": f"{provider_stub.url}/orders", "body": {}}
    step = {"type": "http", "connection": "api", "request": request}
    run_id = start(org, one_step(step, output="{{ steps.send.output.status }}"))
    drive()
    assert (run_of(run_id).status, run_of(run_id).output) == ("succeeded", "303")
    assert len(provider_stub.created) == 1
    assert Effect.objects.get(run_id=run_id).state == "settled"


def test_a_persons_fail_holds_however_the_step_comes_back(org, provider_stub):
    conn = connect(org, base_url=provider_stub.url)
    run_id = start(org, one_step(post_item(provider_stub.url)))
    effect = unknown_effect(org, run_id, conn, state="needs_review")
    # The person decides while the step is not parked yet (the wake finds nothing waiting).
    resolve_effect(effect.pk, "fail", by="sam", reason="sent by hand")
    drive()  # the step runs again later, without any wake payload
    assert run_of(run_id).status == "failed"
    assert "failed by a person" in send_step(run_id).error
    assert provider_stub.count("POST") == 0


def test_a_401_from_an_old_secret_does_not_break_a_repaired_connection(org, provider_stub):
    conn = connect(org, base_url=provider_stub.url, secret="old")
    old = load_connection(org.pk, "api", PROVIDERS["http"])
    fields = conn.replace_secret("new")
    conn.save(update_fields=fields)
    ctx = StepContext(org_id=org.pk, run_id=0, step_id="x", iteration=1, attempt=1, lane="io")
    _mark_broken(Call(ctx, PROVIDERS["http"], old, None), AuthFailed("401"))  # type: ignore[arg-type]
    conn.refresh_from_db()
    assert conn.status == "ok"


def test_a_401_without_a_connection_fails_the_step_instead_of_parking(org, provider_stub):
    provider_stub.require_token("nobody-has-this")
    connect(org, base_url=provider_stub.url)  # allowlists the stub; the step names none
    step = {"type": "http", "request": {"method": "POST", "url": f"{provider_stub.url}/items"}}
    run_id = start(org, one_step(step))
    drive()
    assert run_of(run_id).status == "failed"
    assert send_step(run_id).attempt == 1  # not retried, not parked


def test_an_email_already_sent_stays_sent_when_the_address_is_suppressed_later(org, smtp_stub):
    connect(org, provider="email", name="mail",
            options={"host": smtp_stub.host, "port": smtp_stub.port})  # fmt: skip
    step = {"type": "email", "connection": "mail", "to": "maya@example.com", "subject": "s",
            "body": "b"}  # fmt: skip
    run_id = start(org, one_step(step, output="{{ steps.send.output.message_id }}"))
    # The email went out and was recorded; the worker died before the step settled.
    Effect.objects.create(
        org=org, run_id=run_id, step_id="send", iteration=1, key=f"{run_id}/send/1",
        provider="email", state="settled", result={"message_id": "<sent@x>", "to": "maya"},
    )  # fmt: skip
    Suppression.objects.create(org=org, channel="email", address="maya@example.com")
    drive()
    run = run_of(run_id)
    assert (run.status, run.output) == ("succeeded", "<sent@x>")  # what happened, not "suppressed"
    assert smtp_stub.messages == []


def test_reservations_of_ended_runs_are_released(org):
    ModelBudget.objects.create(org=org, limit=Decimal("1"), reserved=Decimal("0.5"))
    conn = connect(org, provider="model", name="llm")
    run_id = start(org, one_step({"type": "noop"}), key="x")
    Step.objects.filter(run_id=run_id).update(status="waiting", wait_kind="external")
    unknown_effect(org, run_id, conn, reserved_cost=Decimal("0.5"))
    run_act(org=org, run_id=run_id, action="cancel", actor="sam")
    assert Run.objects.get(pk=run_id).status == "cancelled"
    assert reconcile_budgets() == 1
    assert ModelBudget.objects.get(org=org).reserved == 0


def test_credentials_go_only_to_the_connections_own_origin(org, provider_stub):
    connect(org, base_url="https://crm.example.com", secret="tok-secret")
    step = {"type": "http", "connection": "api",
            "request": {"method": "POST", "url": f"{provider_stub.url}/echo"}}  # fmt: skip
    run_id = start(org, one_step(step, output="{{ steps.send.output.status }}"))
    drive()
    assert run_of(run_id).status == "succeeded"
    [request] = provider_stub.requests
    assert "authorization" not in request["headers"]


def test_a_secret_with_a_line_break_is_refused(api):
    body = {"name": "x", "provider": "http", "secret": "tok\r\nX-Evil: 1"}
    answer = api.post("/api/v1/connections", body, format="json")
    assert answer.status_code == 400
    assert "secret" in str(answer.json())


def test_a_review_resolved_while_its_step_is_parking_wakes_the_step_at_once(
    org, provider_stub, api
):
    """The call's answer is lost; the step's next attempt finds no way to tell what it made,
    puts the effect in review and returns its park, and a person resolves the effect before
    the worker has parked the step. The resolution found no step to wake; the park sees it
    was resolved and wakes the step at once, instead of leaving it to its recheck
    (WAYMARK_EFFECTS_RECHECK_SECONDS, 5 minutes). Found by the composition matrix on real
    processes (tests/test_composition_matrix.py)."""
    connect(org, base_url=provider_stub.url)  # no idempotency keys, no lookup: a person decides
    provider_stub.drop_next(1)
    run_id = start(org, one_step(post_item(provider_stub.url)))
    drive(rounds=1, fast_forward=False)  # the call, its answer lost: the step will retry
    worker = Worker(lane_policy("io"), concurrency=1, name="test-worker")
    Step.objects.filter(run_id=run_id).update(wake_at=Now())
    promote_due_retries(lane="io", worker=worker.name)
    (claimed,) = claim(policy=worker.policy, worker=worker.name, limit=1)
    result, failure = worker._run_executor(
        Attempt(claimed, deadline=time.monotonic() + 60, extended=time.monotonic())
    )
    assert failure is None and result is not None and result.park is not None
    effect = Effect.objects.get(run_id=run_id)
    assert effect.state == "needs_review" and send_step(run_id).status == "running"

    answer = api.post(f"/api/v1/effects/{effect.pk}/resolve",
                      {"action": "done", "result": {"status": 201, "body": {"id": "item_9"}}},
                      format="json")  # fmt: skip
    assert answer.status_code == 200, answer.json()
    settle_and_take_next(claimed, result, worker=worker.name)

    step = send_step(run_id)
    assert (step.status, step.wait_kind) == ("ready", "")  # woken at the park
    assert [e.kind for e in events(run_id, "step.woken_at_park")] == ["step.woken_at_park"]
    drive(fast_forward=False)
    assert (run_of(run_id).status, run_of(run_id).output) == ("succeeded", "item_9")
    assert len(provider_stub.created) == 1  # the lost call, never made again
