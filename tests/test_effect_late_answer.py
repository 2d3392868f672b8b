"""A person chose "retry" on an effect whose outcome nobody knew, and then the provider's real
answer turns up: the first call's own answer, late (a stub that holds it), or a lookup that
finds what the first call made. Before the retry is sent, what arrived wins and the retry is
not sent; once it was sent, it cannot be taken back, and the history shows both answers
(docs/reference/effect-people-code-steps.md, "How effects are made")."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from effects.ledger import RETRY_FOUND, RETRY_NOT_SENT
from effects.models import Effect
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import claim, claim_suspect
from workflows.engine.worker import Attempt, Worker
from workflows.models import Step

from .effect_setup import connect, drive, events, one_step, post_item, start
from .test_effects import info, run_of, send_step

pytestmark = pytest.mark.django_db(transaction=True)

CEILING = 60.0  # seconds: generous, for a loaded machine


@pytest.fixture(autouse=True)
def _held_calls_keep_no_lease(settings: Any) -> None:
    """A held call's lease is renewed every third of it: pushed out of the test's way, so
    the lease the test lapses stays lapsed."""
    settings.EFFECTS = {**settings.EFFECTS, "LEASE_MARGIN_SECONDS": 600}


def attempt(step: Any) -> Attempt:
    return Attempt(step, deadline=time.monotonic() + CEILING, extended=time.monotonic())


def item_id(result: Any) -> str:
    """The id of the item an http step's stored result says was created."""
    assert isinstance(result, dict)
    return str(result["body"]["id"])


def in_thread(work: Any) -> threading.Thread:
    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def first_call_held_then_reviewed(
    org: Any, stub: Any, api: Any, action: str = "retry"
) -> tuple[int, Effect, Any]:
    """The first call reaches the provider, which holds its answer; its worker is cut off (its
    step's lease and its effect's lapse); the step's next attempt cannot tell what was made
    (no keys, no lookup) and parks the effect for a person, who chooses ``action``."""
    connect(org, base_url=stub.url)
    run_id = start(org, one_step(post_item(stub.url)))
    stub.hold()
    first_worker = Worker(lane_policy("io"), concurrency=1, name="w1")
    (first,) = claim(policy=first_worker.policy, worker="w1", limit=1)
    held = in_thread(lambda: first_worker._run_executor(attempt(first)))
    assert stub.wait_arrived(1, timeout=CEILING)

    lapsed = timezone.now() - timedelta(minutes=1)
    Step.objects.filter(run_id=run_id, step_id="send").update(lease_until=lapsed)
    Effect.objects.filter(run_id=run_id).update(lease_until=lapsed)
    second_worker = Worker(lane_policy("io"), concurrency=1, name="w2")
    second = claim_suspect(policy=second_worker.policy, worker="w2")
    assert second is not None
    second_worker._execute(attempt(second))
    effect = Effect.objects.get(run_id=run_id)
    assert effect.state == "needs_review" and send_step(run_id).status == "waiting"

    answer = api.post(f"/api/v1/effects/{effect.pk}/resolve",
                      {"action": action, "reason": "not made"}, format="json")  # fmt: skip
    assert answer.status_code == 200, answer.json()
    assert send_step(run_id).status == "ready"
    return run_id, effect, held


def test_the_first_calls_late_answer_wins_over_a_retry_not_yet_sent(org, provider_stub, api):
    run_id, effect, held = first_call_held_then_reviewed(org, provider_stub, api)

    provider_stub.release()  # the first call's answer arrives, before the retry went out
    held.join(CEILING)
    assert not held.is_alive()
    effect.refresh_from_db()
    assert (effect.state, item_id(effect.result)) == ("settled", "item_1")
    [settled] = events(run_id, "effect.settled")
    assert info(settled)["retry"] == RETRY_NOT_SENT

    drive(fast_forward=False)  # the retry's attempt finds the answer: nothing is sent
    assert (run_of(run_id).status, run_of(run_id).output) == ("succeeded", "item_1")
    assert provider_stub.count("POST") == 1 and len(provider_stub.created) == 1
    shown = api.get(f"/api/v1/effects/{effect.pk}").json()  # what the person sees
    assert shown["state"] == "settled" and shown["error"] == RETRY_NOT_SENT


def test_a_late_answer_after_the_retry_was_sent_is_kept_in_the_history(org, provider_stub, api):
    run_id, effect, held = first_call_held_then_reviewed(org, provider_stub, api)
    retry = in_thread(lambda: drive(fast_forward=False))
    assert provider_stub.wait_arrived(2, timeout=CEILING)  # the retry is at the provider too

    provider_stub.release()  # both answers arrive; the retry's call owns the effect
    for thread in (held, retry):
        thread.join(CEILING)
        assert not thread.is_alive()
    drive(fast_forward=False)
    effect.refresh_from_db()
    assert effect.state == "settled" and run_of(run_id).status == "succeeded"
    [late] = events(run_id, "effect.late_answer")
    detail = info(late)
    assert (detail["call"], detail["calls"]) == (1, 2)
    # Both were made (the provider honours no keys): the history says to check for that.
    assert len(provider_stub.created) == 2 and "made twice" in detail["note"]
    assert item_id(effect.result) in {item["id"] for item in provider_stub.created}


def test_an_answer_after_a_person_failed_the_effect_is_kept_in_the_history(org, provider_stub, api):
    run_id, effect, held = first_call_held_then_reviewed(org, provider_stub, api, "fail")
    provider_stub.release()
    held.join(CEILING)
    assert not held.is_alive()
    drive(fast_forward=False)
    effect.refresh_from_db()
    assert effect.state == "failed" and run_of(run_id).status == "failed"  # the person's word
    [late] = events(run_id, "effect.late_answer")
    assert "after the effect was failed by api_key:" in info(late)["note"]
    assert provider_stub.count("POST") == 1


def test_a_lookup_that_finds_the_first_call_made_cancels_a_persons_retry(org, provider_stub, api):
    provider_stub.lookup = True
    options = {"lookup_url": f"{provider_stub.url}/items?key={{key}}"}
    connect(org, base_url=provider_stub.url, options=options)
    run_id = start(org, one_step(post_item(provider_stub.url)))
    provider_stub.drop_next(1)  # made, its answer lost
    drive(rounds=1, fast_forward=False)
    provider_stub.fail_next(5, path_prefix="/items")  # then every lookup fails: a person
    drive()
    effect = Effect.objects.get(run_id=run_id)
    assert effect.state == "needs_review" and "lookups could not tell" in effect.error

    answer = api.post(f"/api/v1/effects/{effect.pk}/resolve", {"action": "retry"},
                      format="json")  # fmt: skip
    assert answer.status_code == 200, answer.json()
    drive()  # the provider answers lookups again: the first call is found before the retry
    assert (run_of(run_id).status, run_of(run_id).output) == ("succeeded", "item_1")
    assert provider_stub.count("POST") == 1 and len(provider_stub.created) == 1
    effect.refresh_from_db()
    assert (effect.state, effect.error) == ("settled", RETRY_FOUND)
    assert info(events(run_id, "effect.reconciled")[-1])["action"] == RETRY_FOUND
