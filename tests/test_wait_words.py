"""What a waiting step waits on, in words and with a link, on the run page and in the API's
run detail: each app says it for the waits it parks steps on (register_wait_describer), the
engine for its own; never a Python dict, never another organisation's row."""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import unescape

import pytest
from django.test import Client
from rest_framework.test import APIClient

from effects.models import Effect
from workflows.engine.wait_words import WAIT_DESCRIBERS, describe_waits
from workflows.models import Organisation, Run, Step
from workflows.plugins.admin import Wait, WaitDescription, register_wait_describer

from .effect_setup import connect, drive, one_step, post_item, start
from .factories import SIGNAL_WAIT_DEFINITION
from .test_approvals_setup import open_request
from .test_effect_review import unknown_effect

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/workflows/run"
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"

PAUSE_DEFINITION = {
    "start": "pause",
    "steps": [
        {"id": "pause", "type": "wait", "duration": "2h", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


def waiting_step(api: APIClient, run_id: int) -> dict:
    detail = api.get(f"/api/v1/runs/{run_id}").json()
    waiting: list[dict] = [s for s in detail["steps"] if s["status"] == "waiting"]
    assert len(waiting) == 1
    return waiting[0]


def waiting_cell(admin_client: Client, run_id: int) -> str:
    html = admin_client.get(f"{RUNS}/{run_id}/change/").content.decode()
    row = html[html.index('<tr class="step step-waiting"') :].split("</tr>")[0]
    return unescape(row[row.index('class="waiting-on"') :])


def test_a_signal_wait_says_its_name_key_and_deadline(
    org: Organisation, api: APIClient, admin_client: Client
) -> None:
    run_id = start(org, SIGNAL_WAIT_DEFINITION, run_input={"order": "o-7"})

    step = waiting_step(api, run_id)
    assert re.fullmatch(
        f"signal order.paid with key o-7; at {WHEN} it wakes and takes the outcome timed_out",
        step["waiting_on"],
    )
    assert step["waiting_on_link"] == "/api/v1/signals?name=order.paid"
    cell = waiting_cell(admin_client, run_id)
    assert "signal order.paid with key o-7" in cell
    assert '<a href="/admin/workflows/signal/?q=order.paid" class="wait-link">' in cell


def test_a_timer_wait_says_its_intent_and_instant_and_links_to_the_timer(
    org: Organisation, api: APIClient, admin_client: Client
) -> None:
    run_id = start(org, PAUSE_DEFINITION)

    step = waiting_step(api, run_id)
    assert re.fullmatch(rf"timer \d+: wait 2h; fires at {WHEN}", step["waiting_on"])
    timer_id = int(step["waiting_on"].split()[1].rstrip(":"))
    cell = waiting_cell(admin_client, run_id)
    assert f'<a href="/admin/timers/timer/{timer_id}/change/" class="wait-link">' in cell
    timer_page = admin_client.get(f"/admin/timers/timer/{timer_id}/change/")
    assert timer_page.status_code == 200
    assert "wait 2h" in timer_page.content.decode()


def test_an_approval_wait_says_who_decides_and_links_to_its_review(
    org: Organisation, api: APIClient, admin_client: Client
) -> None:
    run, approval = open_request(org)

    step = waiting_step(api, run.pk)
    assert re.fullmatch(
        rf"a decision on approval {approval.pk} by group:finance, expires at {WHEN}; "
        f"at {WHEN} it wakes",
        step["waiting_on"],
    )
    assert step["waiting_on_link"] == f"/api/v1/approvals/{approval.pk}"
    cell = waiting_cell(admin_client, run.pk)
    assert f'href="/admin/approvals/approvalrequest/{approval.pk}/review/"' in cell


def test_an_effect_in_review_says_its_full_key_and_links_to_it(
    org: Organisation, api: APIClient, admin_client: Client, provider_stub
) -> None:
    conn = connect(org, base_url=provider_stub.url)
    run_id = start(org, one_step(post_item(provider_stub.url)))
    effect = unknown_effect(org, run_id, conn, state="needs_review", error="timed out")
    drive(rounds=1, fast_forward=False)

    step = waiting_step(api, run_id)
    assert step["waiting_on"].startswith(
        f"effect {run_id}/send/1:abc (needs review: timed out) to be resolved by a person; at "
    )
    assert step["waiting_on_link"] == f"/api/v1/effects/{effect.pk}"
    cell = waiting_cell(admin_client, run_id)
    assert f'href="/admin/effects/effect/{effect.pk}/change/"' in cell
    assert "{" not in cell


def test_a_broken_connection_says_which_and_why(
    org: Organisation, api: APIClient, provider_stub
) -> None:
    connect(org, base_url=provider_stub.url, status="broken", broken_reason="token revoked")
    run_id = start(org, one_step(post_item(provider_stub.url)))
    drive(rounds=1, fast_forward=False)

    assert waiting_step(api, run_id)["waiting_on"].startswith(
        "connection api (broken: token revoked) to be repaired; at "
    )


def test_the_engines_own_waits_are_said_in_words(org: Organisation) -> None:
    run_id = start(org, SIGNAL_WAIT_DEFINITION, run_input={"order": "o-1"})
    step = Step.objects.get(run_id=run_id, step_id="wait")
    retry = Step(pk=1, org_id=org.pk, run_id=run_id, step_id="a", iteration=1, status="waiting",
                 wait_kind="retry", attempt=2, max_attempts=5, wake_at=step.wake_at)  # fmt: skip
    paused = Step(pk=2, org_id=org.pk, run_id=run_id, step_id="b", iteration=1, status="waiting",
                  wait_kind="paused", attempt=0, max_attempts=5)  # fmt: skip
    arrived = {"need": 2, "branches": 3, "arrived": [1], "fork": "split"}
    join = Step(pk=3, org_id=org.pk, run_id=run_id, step_id="meet", iteration=1, status="waiting",
                wait_kind="join", attempt=0, max_attempts=1, wait_detail=arrived)  # fmt: skip
    words = {pk: w.text for pk, w in describe_waits([retry, paused, join]).items()}
    assert re.fullmatch(rf"its next attempt \(3 of 5\) at {WHEN}, after a backoff", words[1])
    assert words[2] == "its run to be resumed (the run is paused)"
    assert words[3] == "2 of the 3 branches of parallel split (arrived: 2)"


def test_another_organisations_row_is_never_described(
    org: Organisation, other_org: Organisation, api: APIClient, provider_stub
) -> None:
    conn = connect(other_org, base_url=provider_stub.url)
    theirs = start(other_org, one_step(post_item(provider_stub.url)), key="theirs")
    effect = unknown_effect(other_org, theirs, conn, state="needs_review")
    run_id = start(org, SIGNAL_WAIT_DEFINITION, run_input={"order": "o-1"})
    # A detail naming their effect (as no park of ours ever would).
    Step.objects.filter(run_id=run_id, step_id="wait").update(
        wait_detail={"parked_on": f"effect:{effect.pk}", "reason": "in review"}
    )

    said = waiting_step(api, run_id)["waiting_on"]
    assert effect.sent_key not in said
    assert said.startswith(f"parked on effect:{effect.pk} (in review)")


def test_a_describer_that_fails_leaves_the_details_own_words(org: Organisation) -> None:
    def broken(waits: Sequence[Wait]) -> list[WaitDescription | None]:
        raise RuntimeError("a plugin's bug")

    run_id = start(org, SIGNAL_WAIT_DEFINITION, run_input={"order": "o-1"})
    Step.objects.filter(run_id=run_id).update(wait_detail={"parked_on": "gadget:9"})
    step = Step.objects.get(run_id=run_id, step_id="wait")
    register_wait_describer("gadget", broken)
    try:
        assert describe_waits([step])[step.pk].text.startswith("parked on gadget:9; at ")
    finally:
        del WAIT_DESCRIBERS["gadget"]
    assert Run.objects.get(pk=run_id).status == "running"
    assert Effect.objects.count() == 0
