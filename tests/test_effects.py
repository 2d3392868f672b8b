"""Effects against local stub servers, run in this process through a real worker's code path:
rate limits, failing providers, revoked credentials, suppressed addresses, concurrency caps,
circuit breakers, model budgets, egress refusals and bad provider answers.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from effects.models import Connection, Effect, ModelBudget, Suppression
from effects.resolve import budget_raised, repair_connection
from effects.secrets import encrypt
from workflows.models import Run, Step

from .effect_setup import connect, drive, events, one_step, post_item, start
from .stubs import Tarpit

pytestmark = pytest.mark.django_db(transaction=True)


def info(row: object) -> dict:
    """The JSON detail of an event, a waiting step or an effect's last answer."""
    for name in ("detail", "wait_detail", "last_response"):
        value = getattr(row, name, None)
        if value is not None:
            assert isinstance(value, dict)
            return value
    raise AssertionError(f"{row} has no detail")


def moment(value: datetime | None) -> datetime:
    assert value is not None
    return value


def run_of(run_id: int) -> Run:
    return Run.objects.get(pk=run_id)


def send_step(run_id: int) -> Step:
    return Step.objects.get(run_id=run_id, step_id="send")


# --- rate limits and retries -------------------------------------------------------------------


def test_retry_after_wins_over_the_backoff_schedule(org, provider_stub):
    connect(org, base_url=provider_stub.url)
    provider_stub.rate_limit_next(1, retry_after=42)
    run_id = start(org, one_step(post_item(provider_stub.url)))
    drive(fast_forward=False)
    step = send_step(run_id)
    assert (step.status, step.wait_kind) == ("waiting", "retry")
    [retry] = events(run_id, "step.retry_scheduled")
    assert info(retry)["delay_seconds"] == 42  # the provider's word, not the jittered backoff
    assert 41 <= (moment(step.wake_at) - step.created_at).total_seconds() <= 60
    effect = Effect.objects.get(run_id=run_id)
    assert effect.state == "failed"  # 429: nothing was made, so calling again is safe
    drive()
    assert run_of(run_id).status == "succeeded"
    assert len(provider_stub.created) == 1


def test_a_failing_provider_is_retried_with_full_jitter_and_one_effect(
    org, provider_stub, settings
):
    """Twenty runs against a provider that answers 503 to its first 60 requests (the breaker
    is set out of the way here; its own test is below). The retries spread out (full
    jitter), and every run ends with exactly one item at the provider."""
    settings.EFFECTS = {**settings.EFFECTS, "CIRCUIT_FAILURES": 10_000}
    provider_stub.idempotent = True  # a 503 is ambiguous: the key makes the repeat safe
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True},
            max_concurrency=100)  # fmt: skip
    provider_stub.fail_next(60, status=503)
    runs = [start(org, one_step(post_item(provider_stub.url), retry=100), key=f"r{i}",
                  run_input={"n": i}) for i in range(20)]  # fmt: skip
    drive(rounds=200)
    assert [run_of(r).status for r in runs] == ["succeeded"] * 20
    assert len(provider_stub.created) == 20
    assert len({item["key"] for item in provider_stub.created}) == 20
    delays = [info(e)["delay_seconds"] for r in runs for e in events(r, "step.retry_scheduled")]
    assert len(delays) == 60
    # Full jitter: uniform over [0, min(cap, base * 2**(n-1))]: spread, not bunched.
    assert len(set(delays)) > 50
    assert statistics.pstdev(delays) > 0.05
    assert min(delays) >= 0 and max(delays) <= 60


# --- credentials --------------------------------------------------------------------------------


def test_a_revoked_token_parks_the_run_until_the_connection_is_repaired(org, provider_stub):
    provider_stub.require_token("tok-1")
    conn = connect(org, base_url=provider_stub.url, secret="tok-1")
    first = start(org, one_step(post_item(provider_stub.url)), key="a")
    provider_stub.revoke_token("tok-1")
    drive()
    step = send_step(first)
    assert (step.status, step.wait_kind) == ("waiting", "external")
    assert info(step)["parked_on"] == f"connection:{conn.pk}"
    assert "reconnect" in info(step)["reason"]
    conn.refresh_from_db()
    assert conn.status == "broken" and "reconnect" in conn.broken_reason
    assert step.attempt - step.release_count == 0  # the park cost no attempt
    # Another run reaching the broken connection parks without calling the provider.
    calls = provider_stub.count("POST", "/items")
    second = start(org, one_step(post_item(provider_stub.url)), key="b")
    drive()
    assert provider_stub.count("POST", "/items") == calls
    assert send_step(second).status == "waiting"
    # Repaired with a new token: both resume from the same step and finish.
    provider_stub.require_token("tok-2")
    Connection.objects.filter(pk=conn.pk).update(secret_encrypted=encrypt("tok-2"))
    assert repair_connection(conn, by="sam") == 2
    drive()
    assert [run_of(r).status for r in (first, second)] == ["succeeded", "succeeded"]
    assert len(provider_stub.created) == 2
    assert "tok-1" not in str(list(Effect.objects.values()))  # no secret in the ledger


# --- consent ------------------------------------------------------------------------------------


def email_step(to: str) -> dict:
    return {"type": "email", "connection": "mail", "to": to, "subject": "Hi",
            "body": "Hello {{ input.name }}"}  # fmt: skip


def test_a_suppressed_address_is_never_sent_to_and_the_run_goes_on(org, smtp_stub):
    connect(org, provider="email", name="mail",
            options={"host": smtp_stub.host, "port": smtp_stub.port})  # fmt: skip
    definition = one_step(email_step("{{ input.to }}"), output="{{ steps.send.output }}")
    definition["steps"][0]["next"] = {"ok": "done", "suppressed": "done"}
    sent = start(org, definition, key="maya-ok", run_input={"to": "Maya@Example.com",
                                                            "name": "Maya"})  # fmt: skip
    drive()
    assert run_of(sent).status == "succeeded"
    [message] = smtp_stub.messages
    effect = Effect.objects.get(run_id=sent)
    assert message.headers["x-waymark-effect-key"] == effect.external_key
    assert effect.key.replace("/", ".") in message.message_id
    # She unsubscribes after the run was enrolled: checked when the email would be sent.
    gone = start(org, definition, key="maya-2", run_input={"to": "maya@example.com",
                                                           "name": "Maya"})  # fmt: skip
    Suppression.objects.create(org=org, channel="email", address="MAYA@example.com",
                               reason="unsubscribed")  # fmt: skip
    drive()
    assert len(smtp_stub.messages) == 1  # never sent
    step = send_step(gone)
    assert step.output == {"suppressed": True, "to": "maya@example.com",
                           "reason": "unsubscribed"}  # fmt: skip
    assert run_of(gone).status == "succeeded"
    assert not Effect.objects.filter(run_id=gone).exists()


@pytest.mark.parametrize(
    "written",
    ["Friend <unsub@victim.example>", "<unsub@victim.example>", '"unsub"@victim.example',
     "UNSUB@Victim.Example", '"Un Sub" <"unsub"@VICTIM.example>'],
)  # fmt: skip
def test_a_suppressed_address_is_not_sent_to_however_it_is_written(org, smtp_stub, written):
    connect(org, provider="email", name="mail",
            options={"host": smtp_stub.host, "port": smtp_stub.port})  # fmt: skip
    Suppression.objects.create(org=org, channel="email", address="unsub@victim.example",
                               reason="unsubscribed")  # fmt: skip
    definition = one_step(email_step("{{ input.to }}"), output="{{ steps.send.output }}")
    definition["steps"][0]["next"] = {"ok": "done", "suppressed": "done"}
    run_id = start(org, definition, key="w", run_input={"to": written, "name": "x"})
    drive()
    assert smtp_stub.messages == []
    assert send_step(run_id).output == {"suppressed": True, "to": "unsub@victim.example",
                                        "reason": "unsubscribed"}  # fmt: skip


@pytest.mark.parametrize("written", ["a@example.com, b@example.com", "nobody", "a@", "@x"])
def test_an_email_to_anything_but_one_address_fails_the_step_and_sends_nothing(
    org, smtp_stub, written
):
    connect(org, provider="email", name="mail",
            options={"host": smtp_stub.host, "port": smtp_stub.port})  # fmt: skip
    run_id = start(org, one_step(email_step("{{ input.to }}")), key="bad",
                   run_input={"to": written, "name": "x"})  # fmt: skip
    drive()
    assert smtp_stub.messages == []
    step = send_step(run_id)
    assert (step.status, run_of(run_id).status) == ("failed", "failed")
    assert "to must be one email address" in step.error
    assert step.attempt == 1  # not retried: it would fail the same way


# --- connection gates -----------------------------------------------------------------------------


def call_in_flight_elsewhere(org, run_id: int, conn: Connection) -> None:
    """A call on ``conn`` in flight, as if on another worker: its effect holds a live lease
    (Effect key x/elsewhere/1; delete it to end the call)."""
    Effect.objects.create(
        org=org, run_id=run_id, step_id="elsewhere", iteration=1, key="x/elsewhere/1",
        provider="http", connection=conn, state="in_flight", token="t",
        lease_until="2999-01-01T00:00:00Z",
    )  # fmt: skip


def test_the_concurrency_cap_defers_without_spending_attempts(org, provider_stub):
    conn = connect(org, base_url=provider_stub.url, max_concurrency=1)
    runs = [start(org, one_step(post_item(provider_stub.url)), key=f"c{i}") for i in range(2)]
    # One call is in flight (as if on another worker): its effect holds a live lease.
    call_in_flight_elsewhere(org, runs[0], conn)
    drive(rounds=1, fast_forward=False)
    assert provider_stub.count("POST") == 0
    for run_id in runs:
        step = send_step(run_id)
        assert (step.status, step.wait_kind) == ("waiting", "retry")
        assert step.attempt == step.release_count  # deferred: no attempt spent
        [deferred] = events(run_id, "step.deferred")
        assert "concurrency cap" in info(deferred)["error"]
    Effect.objects.filter(key="x/elsewhere/1").delete()
    drive()
    assert [run_of(r).status for r in runs] == ["succeeded", "succeeded"]


def test_a_connection_written_past_the_operators_limits_is_held_to_them_when_called(org, settings):
    """A connection stored before the operator lowered the limits (or written around the
    API): its 10,000 calls in flight and its hour's timeout are not what the engine uses."""
    settings.EFFECTS = {**settings.EFFECTS, "MAX_CONCURRENCY": 1, "MAX_TIMEOUT_SECONDS": 0.5}
    with Tarpit() as tarpit:
        conn = connect(org, base_url=tarpit.url, max_concurrency=10_000, timeout_seconds=3600)
        runs = [start(org, one_step(post_item(tarpit.url)), key=f"h{i}") for i in range(2)]
        call_in_flight_elsewhere(org, runs[0], conn)
        drive(rounds=1, fast_forward=False)
        assert tarpit.accepted == 0  # at the cap of 1: both deferred
        for run_id in runs:
            [deferred] = events(run_id, "step.deferred")
            assert "concurrency cap (1 calls in flight)" in info(deferred)["error"]

        Effect.objects.filter(key="x/elsewhere/1").delete()
        drive(rounds=1)  # each call waits half a second for an answer, not an hour
        assert tarpit.accepted == 2
        for waited in Effect.objects.filter(run_id__in=runs, connection=conn):
            assert "no answer" in waited.error, waited.error


def test_the_circuit_opens_after_repeated_failures_and_half_opens_to_probe(org, provider_stub):
    conn = connect(org, base_url=provider_stub.url, max_concurrency=100)
    provider_stub.fail_next(5, status=503)
    provider_stub.idempotent = True
    Connection.objects.filter(pk=conn.pk).update(options={"idempotency_keys": True})
    runs = [start(org, one_step(post_item(provider_stub.url), retry=50), key=f"b{i}")
            for i in range(8)]  # fmt: skip
    drive(rounds=3, fast_forward=False)
    conn.refresh_from_db()
    assert conn.circuit == "open" and conn.consecutive_failures == 5
    assert provider_stub.count("POST") == 5  # the other three never called
    # The provider has recovered (its 5 failures are spent) and the cool-down passes.
    Connection.objects.filter(pk=conn.pk).update(circuit_until=None)
    drive()
    assert [run_of(r).status for r in runs] == ["succeeded"] * 8
    conn.refresh_from_db()
    assert (conn.circuit, conn.consecutive_failures) == ("closed", 0)


# --- model budgets --------------------------------------------------------------------------------


def model_step(budget: str = "0.5") -> dict:
    return {"type": "model", "connection": "llm", "prompt": "Summarise {{ input.n }}",
            "max_tokens": 50, "budget": float(budget)}  # fmt: skip


def test_a_model_step_reserves_its_budget_and_parks_when_it_is_spent(org, model_stub):
    prices = {"price_prompt_per_1k": "1", "price_completion_per_1k": "2"}
    connect(org, provider="model", name="llm", base_url=f"{model_stub.url}/v1",
            options={"model": "stub-1", **prices})  # fmt: skip
    ModelBudget.objects.create(org=org, limit=Decimal("0.51"))
    first = start(org, one_step(model_step(), output="{{ steps.send.output.text }}"), key="m1")
    drive(lane="slow")
    assert run_of(first).status == "succeeded"
    budget = ModelBudget.objects.get(org=org)
    effect = Effect.objects.get(run_id=first)
    assert effect.cost is not None and effect.cost > 0
    assert (budget.reserved, budget.spent) == (Decimal(0), effect.cost)
    # The next call may cost up to 0.5 and only 0.51 - spent is left: it parks, uncalled.
    calls = model_stub.count("POST")
    second = start(org, one_step(model_step(), output="{{ steps.send.output.text }}"), key="m2")
    drive(lane="slow")
    step = send_step(second)
    assert step.status == "waiting" and "budget" in info(step)["reason"]
    assert model_stub.count("POST") == calls
    ModelBudget.objects.filter(org=org).update(limit=Decimal("5"))
    assert budget_raised(org.pk, by="sam") == 1
    drive(lane="slow")
    assert run_of(second).status == "succeeded"


# --- egress and bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data/", "http://10.0.0.8/", "http://localhost:1/"]
)
def test_http_steps_cannot_reach_private_addresses(org, url):
    step = {"type": "http", "request": {"method": "GET", "url": "{{ input.url }}"}}
    run_id = start(org, one_step(step), run_input={"url": url})
    drive()
    run = run_of(run_id)
    assert run.status == "failed"
    failed = send_step(run_id)
    assert "refused" in failed.error and failed.attempt == 1  # not retried


def test_bad_answers_and_bad_input_fail_clearly_never_crash(org, provider_stub):
    connect(org, base_url=provider_stub.url, options={"idempotency_keys": True})
    provider_stub.idempotent = True
    # A 400 is the provider refusing: failed for good, with its answer recorded.
    provider_stub.fail_next(1, status=400)
    refused = start(org, one_step(post_item(provider_stub.url)), key="r400")
    # An unknown connection, and a template that fails on this run's data.
    unknown = start(org, one_step({**post_item(provider_stub.url), "connection": "nope"}),
                    key="unknown", slug="unknown")  # fmt: skip
    bad_template = {"type": "http", "connection": "api",
                    "request": {"method": "POST", "url": provider_stub.url + "/items",
                                "body": {"x": "{{ input.n.missing.deeper }}"}}}  # fmt: skip
    broken = start(org, one_step(bad_template), key="tpl", slug="tpl")
    drive()
    assert run_of(refused).status == "failed"
    assert "refused the request (400)" in send_step(refused).error
    assert info(Effect.objects.get(run_id=refused))["status"] == 400
    assert run_of(unknown).status == "failed"
    assert "unknown connection 'nope'" in send_step(unknown).error
    assert run_of(broken).status == "failed"
    assert "template error" in send_step(broken).error
    # A 200 whose body is not JSON: the answer is kept as text, the run goes on.
    provider_stub.malformed_next(1)
    status_only = one_step(post_item(provider_stub.url), output="{{ steps.send.output.status }}")
    odd = start(org, status_only, key="odd")
    drive()
    assert run_of(odd).status == "succeeded"


def test_a_mapped_failed_outcome_is_the_path_of_a_step_that_failed_for_good(org, provider_stub):
    connect(org, base_url=provider_stub.url)
    provider_stub.fail_next(1, status=422)
    definition = one_step(post_item(provider_stub.url), output="sent")
    definition["steps"][0]["next"] = {"ok": "done", "failed": "fallback"}
    definition["steps"].append({"id": "fallback", "type": "end", "output": "fell back"})
    run_id = start(org, definition)
    drive()
    run = run_of(run_id)
    assert (run.status, run.output) == ("succeeded", "fell back")
    assert "(422)" in send_step(run_id).error


def test_a_crm_upsert_whose_answer_was_lost_is_repeated_into_one_record(org, provider_stub):
    connect(org, provider="crm_upsert", name="crm", base_url=provider_stub.url)
    provider_stub.drop_next(1)  # the record is written, then the connection drops
    step = {"type": "crm_upsert", "connection": "crm", "object": "contacts",
            "external_id": "{{ input.email }}", "fields": {"name": "{{ input.name }}"}}  # fmt: skip
    run_id = start(org, one_step(step, output="{{ steps.send.output.body.id }}"),
                   run_input={"email": "maya@example.com", "name": "Maya"})  # fmt: skip
    drive()
    run = run_of(run_id)
    assert (run.status, run.output) == ("succeeded", "maya@example.com")
    assert provider_stub.contacts == {"maya@example.com": {"name": "Maya"}}
    assert provider_stub.count("PUT", "/contacts/") == 2  # the lost answer, then the repeat
    assert [e.kind for e in events(run_id, "effect.outcome_unknown")] == ["effect.outcome_unknown"]


# --- the ledger's rules, one by one -------------------------------------------------------------


def test_a_live_in_flight_effect_is_never_overlapped(org, provider_stub):
    """Another attempt's call under the same key may still be under way (its effect lease is
    live): this attempt waits for it, spends no attempt, and calls nothing."""
    conn = connect(org, base_url=provider_stub.url)
    run_id = start(org, one_step(post_item(provider_stub.url)))
    step = send_step(run_id)
    Effect.objects.create(
        org=org, run_id=run_id, step_id="send", iteration=1, key=f"{run_id}/send/1",
        provider="http", connection=conn, state="in_flight", token="other-attempt",
        lease_until=timezone.now() + timedelta(seconds=30), calls=1,
    )  # fmt: skip
    drive(rounds=1, fast_forward=False)
    step = send_step(run_id)
    assert (step.status, step.wait_kind) == ("waiting", "retry")
    assert step.attempt == step.release_count  # no attempt spent
    assert 25 <= (moment(step.wake_at) - timezone.now()).total_seconds() <= 31  # until it ends
    assert "in flight in another attempt" in info(events(run_id, "step.deferred")[0])["error"]
    assert provider_stub.count("POST") == 0


def test_an_unknown_outcome_older_than_the_providers_key_memory_waits_for_a_person(
    org, provider_stub
):
    """The provider keeps idempotency keys for an hour; the first attempt was two hours ago:
    repeating the key could make a second effect, so a person decides."""
    provider_stub.idempotent = True
    options = {"idempotency_keys": True, "key_retention_seconds": 3600}
    conn = connect(org, base_url=provider_stub.url, options=options)
    run_id = start(org, one_step(post_item(provider_stub.url)))
    two_hours_ago = timezone.now() - timedelta(hours=2)
    Effect.objects.create(
        org=org, run_id=run_id, step_id="send", iteration=1, key=f"{run_id}/send/1",
        provider="http", connection=conn, state="outcome_unknown", calls=1,
        first_attempt_at=two_hours_ago, last_attempt_at=two_hours_ago,
    )  # fmt: skip
    drive()
    effect = Effect.objects.get(run_id=run_id)
    assert effect.state == "needs_review"
    assert "forgotten the key" in effect.error
    step = send_step(run_id)
    assert step.status == "waiting" and info(step)["parked_on"] == f"effect:{effect.pk}"
    assert provider_stub.count("POST") == 0


def test_a_slack_message_carries_its_key_and_respects_suppression(org, slack_stub):
    connect(org, provider="slack_message", name="slack", base_url=f"{slack_stub.url}/api/",
            secret="xoxb-stub")  # fmt: skip
    step = {"type": "slack_message", "connection": "slack", "channel": "{{ input.channel }}",
            "text": "Order {{ input.n }} shipped"}  # fmt: skip
    definition = one_step(step, output="{{ steps.send.output.ts }}")
    definition["steps"][0]["next"] = {"ok": "done", "suppressed": "skipped"}
    definition["steps"].append({"id": "skipped", "type": "end", "output": "not sent"})
    sent = start(org, definition, key="s1", run_input={"channel": "C0MAYA", "n": 7})
    Suppression.objects.create(org=org, channel="slack", address="c0quiet")
    quiet = start(org, definition, key="s2", run_input={"channel": "C0QUIET", "n": 8})
    drive()
    [message] = slack_stub.messages
    assert message["text"] == "Order 7 shipped"
    effect = Effect.objects.get(run_id=sent)
    assert message["metadata"]["event_payload"]["effect_key"] == effect.external_key
    assert effect.external_key.startswith(f"{effect.key}:")  # the key, and a random part
    assert run_of(sent).output == message["ts"]
    skipped = send_step(quiet)
    assert skipped.output == {"suppressed": True, "to": "c0quiet", "reason": "suppressed"}
    assert (run_of(quiet).status, run_of(quiet).output) == ("succeeded", "not sent")
