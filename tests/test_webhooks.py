"""Outbound webhooks: deliveries queued in the event's own transaction (one per event and
subscription), sent signed through the egress rules, retried with backoff up to a limit, an
organisation's slow endpoint held to its own slots, at least once across a sender killed
mid-delivery (receivers dedupe by Waymark-Delivery-Id); subscriptions in the API and admin."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.test import Client

from effects.models import EgressAllow
from webhooks import delivery as sending
from webhooks.delivery import Claimed, Sender, backoff, claim, deliver
from webhooks.models import Delivery, Subscription
from webhooks.services import webhook_create
from webhooks.signing import signature_header, verify
from workflows.engine.health import Limits
from workflows.models import AuditEntry, Organisation, Run
from workflows.plugins import Actor, Sweep
from workflows.plugins.code import Context, workflow
from workflows.plugins.testing import WorkflowTest
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .processes import spawn, stop, wait_for
from .stubs.receiver import ReceiverStub
from .stubs.redirect import RedirectingStub
from .stubs.tls import self_signed

pytestmark = pytest.mark.django_db

ENDS: dict[str, Any] = {"start": "done", "steps": [{"id": "done", "type": "end"}]}
ENDS_FAILED: dict[str, Any] = {
    "start": "done",
    "steps": [{"id": "done", "type": "end", "status": "failed"}],
}


@pytest.fixture(autouse=True)
def webhook_settings(settings: Any) -> None:
    """Plain http to the loopback stub, fast retries; each test may change them further."""
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_HTTP": True, "RETRY_BASE_SECONDS": 1.0,
                         "RETRY_MAX_SECONDS": 8.0, "TIMEOUT_SECONDS": 5.0}  # fmt: skip


@pytest.fixture
def receiver() -> Iterator[ReceiverStub]:
    with ReceiverStub() as stub:
        yield stub
    assert not stub.errors, stub.errors


def subscribe(
    org: Organisation, url: str, *types: str, allow: bool = True, active: bool = True
) -> tuple[Subscription, str]:
    """A subscription of ``org`` (and, with ``allow``, loopback on its egress allowlist)."""
    if allow:
        EgressAllow.objects.get_or_create(org=org, entry="127.0.0.1/32")
    return webhook_create(org=org, url=url, event_types=types or ["run.succeeded"],
                          active=active, actor=Actor.system("test"))  # fmt: skip


def run_once(org: Organisation, definition: dict[str, Any] = ENDS, key: str = "k1") -> int:
    """A run that starts and ends in its start's transaction."""
    automation_publish_definition(org=org, slug="hooked", definition=definition)
    return run_start(org=org, automation_slug="hooked", run_input={"n": 1}, start_key=key).run_id


def send_due(free: int = 8) -> list[sending.Outcome]:
    """One claim of due deliveries, each sent and recorded, in this process."""
    return [deliver(item) for item in claim(free)]


def make_due() -> None:
    """Pending deliveries due now: an hour ago, since this test's transaction began earlier
    than the statement's clock (Django's Now) and the claim reads the transaction's (now())."""
    due = Now() - timedelta(hours=1)
    Delivery.objects.filter(status="pending", lease_until__isnull=True).update(next_at=due)


# --- queued with the event ------------------------------------------------------------------


def test_each_event_is_queued_once_per_subscription_that_wants_it(org, other_org) -> None:
    both, _ = subscribe(org, "https://a.example/hook", "run.started", "run.succeeded")
    failures, _ = subscribe(org, "https://b.example/hook", "run.failed")
    subscribe(org, "https://c.example/hook", "run.succeeded", active=False)
    subscribe(other_org, "https://d.example/hook", "run.succeeded")

    run_id = run_once(org)

    rows = list(Delivery.objects.filter(org=org).order_by("id"))
    assert [(d.subscription_id, d.event_type) for d in rows] == [
        (both.pk, "run.started"), (both.pk, "run.succeeded"),
    ]  # fmt: skip
    version = Run.objects.get(pk=run_id).version.number
    assert rows[1].payload == {  # a run's event names no step
        "run": {"id": run_id, "automation": "hooked", "version": version, "start_key": "k1"},
        "detail": {},
    }
    assert all(d.status == "pending" and d.run_id == run_id for d in rows)
    assert not Delivery.objects.filter(subscription=failures).exists()
    assert not Delivery.objects.filter(org=other_org).exists()


@pytest.mark.django_db(transaction=True)  # steps run as a worker runs them
def test_events_written_by_every_path_are_queued(org) -> None:
    from .effect_setup import drive
    from .test_approvals_setup import open_request
    from .test_run_control import TWO_IO

    subscribe(org, "https://a.example/hook", "run.started", "run.succeeded",
              "approval.requested")  # fmt: skip
    automation_publish_definition(org=org, slug="io", definition=TWO_IO)
    # The second start of an automation whose walk enters only worker steps is the
    # one-statement start (engine/starts.py); its steps settle as hops (server-side).
    run_ids = [run_start(org=org, automation_slug="io", run_input={}, start_key=f"io-{n}").run_id
               for n in range(2)]  # fmt: skip
    drive(lane="io")
    run, approval = open_request(org)

    queued = {(d.run_id, d.event_type): d.payload for d in Delivery.objects.filter(org=org)}
    for run_id in run_ids:
        for kind in ("run.started", "run.succeeded"):
            assert queued[(run_id, kind)]["run"]["automation"] == "io", (run_id, kind)
    requested = queued[(run.pk, "approval.requested")]
    assert requested["detail"]["approval"] == approval.pk
    assert requested["step"]["id"] == approval.step_id


def test_a_failed_step_and_run_are_queued_with_what_failed(org) -> None:
    subscribe(org, "https://a.example/hook", "run.failed")

    run_id = run_once(org, ENDS_FAILED)

    (failed,) = Delivery.objects.filter(org=org)
    assert (failed.event_type, failed.run_id) == ("run.failed", run_id)
    assert "failed" in failed.payload["detail"]["error"]


def refuse(what: str) -> str:
    raise LookupError(f"{what} not found")


@workflow("hooked-code-fails", version=1)
def fails_in_code(ctx: Context, run_input: dict[str, Any]) -> Any:
    """Fails the run itself (ctx.fail), or by a function's failure it does not catch."""
    if run_input["how"] == "fail":
        ctx.fail("out_of_stock")
    return ctx.run("look", refuse, "ada")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["fail", "uncaught"])
def test_a_code_run_s_failure_queues_the_events_its_workflow_s_steps_make(
    org: Organisation, how: str
) -> None:
    """Its turns are the engine's own steps: a turn that fails queues no step.failed (it
    queued one for "decide", a step the workflow never called, beside run.failed). A step the
    code called that fails is queued, as a definition's is."""
    subscribe(org, "https://a.example/hook", "step.failed", "run.failed")
    t = WorkflowTest(org=org)
    t.start("hooked-code-fails", version=1, input={"how": how})
    run = t.run_until_finished()
    assert run.status == "failed"
    queued = [(d.event_type, (d.payload.get("step") or {}).get("id"))
              for d in Delivery.objects.filter(org=org).order_by("id")]  # fmt: skip
    if how == "fail":
        assert queued == [("run.failed", None)]
    else:
        assert queued == [("step.failed", "look"), ("run.failed", None)]


def test_an_event_rolled_back_queues_nothing(org) -> None:
    subscribe(org, "https://a.example/hook", "run.started")
    automation_publish_definition(org=org, slug="hooked", definition=ENDS)

    with pytest.raises(RuntimeError), transaction.atomic():
        run_start(org=org, automation_slug="hooked", run_input={}, start_key="rolled-back")
        assert Delivery.objects.filter(org=org).count() == 1  # in the event's transaction
        raise RuntimeError("the start's transaction fails after its events were written")

    assert not Delivery.objects.filter(org=org).exists()


def test_the_database_holds_one_delivery_per_event_and_subscription(org) -> None:
    subscribe(org, "https://a.example/hook", "run.started")
    run_once(org)
    (first,) = Delivery.objects.filter(org=org)

    with pytest.raises(IntegrityError), transaction.atomic():
        Delivery.objects.create(
            org=org, subscription_id=first.subscription_id, event_id=first.event_id,
            event_type="run.started", payload={}, occurred_at=first.occurred_at, next_at=Now(),
        )  # fmt: skip


# --- sending -------------------------------------------------------------------------------------


def test_a_delivery_is_signed_and_the_signature_verifies(org, receiver: ReceiverStub) -> None:
    subscription, secret = subscribe(org, f"{receiver.url}/hook", "run.succeeded")
    receiver.secret = secret
    run_id = run_once(org)

    (outcome,) = send_due()

    assert outcome.delivered and outcome.status == 200
    (request,) = receiver.arrivals()
    headers, raw = request["headers"], request["raw"].encode()
    (row,) = Delivery.objects.filter(subscription=subscription)
    assert headers["waymark-delivery-id"] == str(row.pk)
    assert headers["waymark-event"] == "run.succeeded"
    assert headers["content-type"] == "application/json"
    assert verify(secret, headers["waymark-signature"], raw)
    assert not verify("whsec_another", headers["waymark-signature"], raw)
    assert not verify(secret, headers["waymark-signature"], raw + b" ")
    body = json.loads(raw)
    assert (body["id"], body["type"], body["data"]["run"]["id"]) == (
        str(row.pk), "run.succeeded", run_id,
    )  # fmt: skip
    row.refresh_from_db()
    assert (row.status, row.attempts, row.last_status) == ("delivered", 1, 200)
    assert receiver.bad_signatures == 0 and list(receiver.processed) == [str(row.pk)]


def test_the_signature_is_hmac_sha256_over_the_timestamp_and_the_body() -> None:
    # What docs/how-to/receive-webhooks.md tells a receiver to compute, with a fixed input.
    header = signature_header("whsec_test", b'{"id":"1"}', timestamp=1767225600)

    assert header == (
        "t=1767225600,v1="
        + __import__("hmac").new(b"whsec_test", b'1767225600.{"id":"1"}', "sha256").hexdigest()
    )
    assert verify("whsec_test", header, b'{"id":"1"}', now=1767225600 + 299)
    assert not verify("whsec_test", header, b'{"id":"1"}', now=1767225600 + 301)  # a replay


@pytest.mark.parametrize("stamp", ["²", "١٧٦٧٢٢٥٦٠٠", " ", ""])
def test_a_timestamp_of_other_digits_is_refused_not_raised(stamp: str) -> None:
    # "²".isdigit() is true and int("²") raises: a forged header was an exception (a 500 in
    # a receiver using the documented code), not a refusal. The page's code, run as shown.
    body = b'{"id":"1"}'
    header = f"t={stamp},v1=" + "0" * 64
    assert verify("whsec_test", header, body) is False
    page = (Path(__file__).parent.parent / "docs/how-to/receive-webhooks.md").read_text()
    code = page.split("In Python:\n\n```python\n", 1)[1].split("```", 1)[0]
    documented: dict[str, Any] = {}
    exec(code, documented)  # noqa: S102 (the page's own example)
    assert documented["verify"]("whsec_test", header, body) is False
    good = signature_header("whsec_test", body)
    assert documented["verify"]("whsec_test", good, body) is True


def test_it_retries_after_server_errors_then_succeeds(org, receiver: ReceiverStub) -> None:
    subscribe(org, f"{receiver.url}/hook", "run.succeeded")
    run_once(org)
    receiver.fail_next(2, status=500)

    first = send_due()
    (row,) = Delivery.objects.filter(org=org)
    delays = [_delay(row)]
    make_due()
    second = send_due()
    delays.append(_delay(row))
    make_due()
    third = send_due()

    assert [o.status for o in (*first, *second, *third)] == [500, 500, 200]
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("delivered", 3)
    # Exponential with jitter: after the n-th failure, from half of base * 2^(n-1) to all of it.
    assert 0.5 <= delays[0] <= 1.0 + 0.5 and 1.0 <= delays[1] <= 2.0 + 0.5
    arrivals = receiver.arrivals()
    assert len({a["headers"]["waymark-delivery-id"] for a in arrivals}) == 1
    assert len({a["raw"] for a in arrivals}) == 1  # the same body every time
    assert len(receiver.processed) == 1


def _delay(row: Delivery) -> float:
    row.refresh_from_db()
    assert row.status == "pending" and row.last_attempt_at is not None
    return (row.next_at - row.last_attempt_at).total_seconds()


def test_backoff_grows_to_its_ceiling_and_honours_retry_after(settings: Any) -> None:
    settings.WEBHOOKS = {**settings.WEBHOOKS, "RETRY_BASE_SECONDS": 30.0,
                         "RETRY_MAX_SECONDS": 3600.0}  # fmt: skip
    for attempts, full in [(1, 30), (2, 60), (3, 120), (8, 3600), (30, 3600)]:
        delays = [backoff(attempts) for _ in range(50)]
        assert all(full / 2 <= d <= full for d in delays), (attempts, min(delays), max(delays))
    asked = sending.Outcome(False, status=429, retry_after=600)
    assert backoff(1, asked) >= 600


def test_it_gives_up_after_the_limit_and_a_person_can_send_it_again(
    org, api, receiver: ReceiverStub, settings: Any
) -> None:
    settings.WEBHOOKS = {**settings.WEBHOOKS, "MAX_ATTEMPTS": 3}
    subscription, _ = subscribe(org, f"{receiver.url}/hook", "run.succeeded")
    run_once(org)
    receiver.fail_for(3600, status=503)

    for _ in range(3):
        make_due()
        send_due()

    (row,) = Delivery.objects.filter(org=org)
    assert (row.status, row.attempts, row.last_status) == ("failed", 3, 503)
    assert "503" in row.last_error
    make_due()
    assert send_due() == []  # failed: never claimed again
    listed = api.get(f"/api/v1/webhooks/{subscription.pk}/deliveries", {"status": "failed"})
    assert [d["id"] for d in listed.json()["results"]] == [row.pk]

    receiver._faults.clear()
    again = api.post(f"/api/v1/webhooks/{subscription.pk}/deliveries/{row.pk}/redeliver")
    assert again.status_code == 200 and again.json()["status"] == "pending"
    (outcome,) = send_due()
    assert outcome.delivered
    assert (
        api.post(f"/api/v1/webhooks/{subscription.pk}/deliveries/{row.pk}/redeliver").json()["code"]
        == "delivery_not_failed"
    )
    (audited,) = AuditEntry.objects.filter(org=org, action="webhook.redeliver")
    assert audited.detail["delivery"] == row.pk


def test_a_private_host_not_on_the_allowlist_is_refused_and_never_reached(
    org, receiver: ReceiverStub
) -> None:
    subscribe(org, f"{receiver.url}/hook", "run.succeeded", allow=False)
    run_once(org)

    (outcome,) = send_due()

    assert not outcome.delivered and outcome.final
    (row,) = Delivery.objects.filter(org=org)
    assert row.status == "failed" and row.attempts == 1
    assert row.last_error.startswith("egress_refused:") and "loopback" in row.last_error
    assert receiver.arrivals() == []


def test_metadata_addresses_are_refused_even_when_allowlisted(org) -> None:
    EgressAllow.objects.create(org=org, entry="169.254.0.0/16")  # as if saved before the rules
    subscribe(org, "http://169.254.169.254/latest/meta-data", "run.succeeded", allow=False)
    run_once(org)

    (outcome,) = send_due()

    assert outcome.final and "metadata" in outcome.error


def test_a_redirect_is_not_followed(org, receiver: ReceiverStub) -> None:
    with RedirectingStub(receiver.url) as moved:
        subscribe(org, f"{moved.url}/hook", "run.succeeded")
        run_once(org)

        (outcome,) = send_due()

    assert (outcome.delivered, outcome.status, outcome.final) == (False, 302, False)
    assert receiver.arrivals() == []  # tried again later, at the same URL


def test_an_inactive_or_deleted_subscription_fails_what_it_had_queued(org, api) -> None:
    subscription, _ = subscribe(org, "https://a.example/hook", "run.succeeded")
    run_once(org)
    assert api.patch(f"/api/v1/webhooks/{subscription.pk}", {"active": False},
                     format="json").status_code == 200  # fmt: skip

    (outcome,) = send_due()

    assert outcome.final and outcome.error.startswith("subscription_inactive")


def test_https_endpoints_are_verified_against_the_trusted_authorities(
    org, settings: Any, tmp_path: Path
) -> None:
    authority = self_signed(tmp_path)
    with ReceiverStub(tls=authority.server_context()) as tls_receiver:
        assert tls_receiver.url.startswith("https://")
        subscribe(org, f"{tls_receiver.url}/hook", "run.succeeded")
        run_once(org)

        (untrusted,) = send_due()  # its certificate is signed by nobody the client trusts
        settings.WEBHOOKS = {**settings.WEBHOOKS, "CA_FILE": str(authority.cert_file)}
        make_due()
        (trusted,) = send_due()

    assert not untrusted.delivered and "CERTIFICATE_VERIFY_FAILED" in untrusted.error
    assert trusted.delivered and len(tls_receiver.processed) == 1


# --- one organisation's slow endpoint ---------------------------------------------------------


def test_an_organisation_takes_no_more_than_its_share_of_the_sending_slots(
    org, other_org, settings: Any
) -> None:
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ORG_CONCURRENCY": 2}
    subscribe(org, "https://slow.example/hook", "run.started")
    subscribe(other_org, "https://fast.example/hook", "run.started")
    for n in range(5):
        run_once(org, key=f"slow-{n}")
    run_once(other_org, key="fast")

    first = claim(8)
    assert sorted(item.org_id for item in first) == sorted([org.pk, org.pk, other_org.pk])
    assert claim(8) == []  # the slow organisation's two are still in flight
    sending.record(next(i for i in first if i.org_id == org.pk), sending.Outcome(True, 200))
    (next_one,) = claim(8)
    assert next_one.org_id == org.pk


@pytest.mark.django_db(transaction=True)
def test_a_slow_endpoint_holds_its_organisations_slots_not_everyones(
    org, other_org, settings: Any
) -> None:
    settings.WEBHOOKS = {**settings.WEBHOOKS, "CONCURRENCY": 3, "ORG_CONCURRENCY": 2,
                         "POLL_SECONDS": 0.1}  # fmt: skip
    with ReceiverStub() as slow, ReceiverStub() as fast:
        subscribe(org, f"{slow.url}/hook", "run.started")
        subscribe(other_org, f"{fast.url}/hook", "run.started")
        for n in range(4):
            run_once(org, key=f"slow-{n}")
        slow.hold()  # the slow organisation's endpoint answers nothing for now
        stop_sending = threading.Event()
        sweep = Sweep(name="test-sweep", tick=1.0)
        sweep.leading.set()
        threads = Sender(sweep).start(stop_sending)
        try:
            assert slow.wait_arrived(2, timeout=60)
            run_once(other_org, key="fast")  # arrives while every slow slot is held
            wait_for(lambda: len(fast.processed) == 1, timeout=60, what="the other org's delivery")
            assert slow.arrived == 2  # its third slot went to the other organisation
            slow.release()
            wait_for(lambda: len(slow.processed) == 4, timeout=60, what="the slow ones, in the end")
        finally:
            slow.release()
            stop_sending.set()
            for thread in threads:
                thread.join(30)
    assert Delivery.objects.filter(status="delivered").count() == 5


# --- at least once across a crash ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_sender_killed_mid_delivery_is_replaced_and_the_receiver_dedupes(org, procs) -> None:
    with ReceiverStub() as receiver:
        subscription, secret = subscribe(org, f"{receiver.url}/hook", "run.succeeded")
        receiver.secret = secret
        run_once(org)
        (row,) = Delivery.objects.filter(subscription=subscription)
        receiver.hold()
        env = {"WAYMARK_WEBHOOK_ALLOW_HTTP": "1", "WAYMARK_WEBHOOK_TIMEOUT_SECONDS": "2",
               "WAYMARK_WEBHOOK_POLL_SECONDS": "0.2", "WAYMARK_SWEEP_SECONDS": "0.3"}  # fmt: skip
        first = spawn("sweep", **env)
        procs.append(first)
        assert receiver.wait_arrived(1, timeout=120), "the first sender never sent it"
        stop(first, signal.SIGKILL)  # mid-delivery: sent, no answer yet, nothing recorded
        receiver.release()  # the receiver processes it anyway, as a real one would
        wait_for(lambda: len(receiver.processed) == 1, timeout=30, what="the first arrival")
        row.refresh_from_db()
        assert (row.status, row.attempts) == ("pending", 1)  # in flight, its lease running

        second = spawn("sweep", **env)
        procs.append(second)
        wait_for(lambda: Delivery.objects.get(pk=row.pk).status == "delivered", timeout=120,
                 what="the delivery, sent again once its lease lapsed")  # fmt: skip
        stop(second)

    arrivals = receiver.arrivals()
    assert len(arrivals) == 2  # at least once: twice here
    assert {a["headers"]["waymark-delivery-id"] for a in arrivals} == {str(row.pk)}
    assert arrivals[0]["raw"] == arrivals[1]["raw"]
    assert list(receiver.processed) == [str(row.pk)] and receiver.bad_signatures == 0
    assert Delivery.objects.filter(subscription=subscription).count() == 1
    row.refresh_from_db()
    assert row.attempts == 2


# --- subscriptions in the API and the admin -------------------------------------------------------


def test_subscriptions_in_the_api_show_the_secret_once_and_are_audited(org, api, other_api) -> None:
    made = api.post("/api/v1/webhooks", {"url": "https://hooks.example/w",
                                         "event_types": ["run.failed", "step.failed"]},
                    format="json")  # fmt: skip
    assert made.status_code == 201, made.json()
    hook = made.json()
    assert hook["secret"].startswith("whsec_") and hook["active"] is True
    webhook_id = hook["id"]
    shown = api.get(f"/api/v1/webhooks/{webhook_id}").json()
    assert "secret" not in shown and hook["secret"] not in json.dumps(shown)
    assert hook["secret"] not in json.dumps(api.get("/api/v1/webhooks").json())
    assert other_api.get(f"/api/v1/webhooks/{webhook_id}").json()["code"] == "unknown_webhook"

    changed = api.patch(f"/api/v1/webhooks/{webhook_id}", {"event_types": ["run.failed"]},
                        format="json")  # fmt: skip
    assert changed.json()["event_types"] == ["run.failed"]
    rotated = api.post(f"/api/v1/webhooks/{webhook_id}/rotate-secret").json()
    assert rotated["secret"] != hook["secret"]
    assert api.delete(f"/api/v1/webhooks/{webhook_id}").status_code == 204

    rows = AuditEntry.objects.filter(org=org, target_type="webhook").order_by("id")
    assert [e.action for e in rows] == [
        "webhook.create", "webhook.update", "webhook.rotate_secret", "webhook.delete",
    ]  # fmt: skip
    assert all(e.actor_kind == "api_key" for e in rows)
    assert not AuditEntry.objects.filter(detail__icontains="whsec_").exists()


TOKEN_URL = "https://hooks.example/abc?token=SECRET"


def audit_text(org: Organisation) -> str:
    """Every audit entry of the organisation, and every admin history row, as text."""
    entries = list(AuditEntry.objects.filter(org=org).values())
    history = list(LogEntry.objects.values())
    return json.dumps([entries, history], default=str)


def test_the_audit_keeps_a_webhook_urls_origin_never_its_path_or_token(
    org, api, admin_client: Client
) -> None:
    made = api.post("/api/v1/webhooks", {"url": TOKEN_URL, "event_types": ["run.failed"]},
                    format="json").json()  # fmt: skip
    moved = {"url": "https://hooks.example:8443/abc/v2?token=SECRET2"}
    assert api.patch(f"/api/v1/webhooks/{made['id']}", moved, format="json").status_code == 200
    page = admin_client.post("/admin/webhooks/subscription/add/", {
        "org": org.pk, "url": TOKEN_URL, "event_types": ["run.failed"], "active": "on",
    })  # fmt: skip
    assert page.status_code == 200, page.content[:2000]
    by_admin = Subscription.objects.filter(org=org).exclude(pk=made["id"]).get()
    changed = admin_client.post(f"/admin/webhooks/subscription/{by_admin.pk}/change/", {
        "url": "https://other.example/abc?token=SECRET3", "event_types": ["run.failed"],
        "active": "on", "description": "",
    })  # fmt: skip
    assert changed.status_code == 302, changed.content[:2000]
    assert api.delete(f"/api/v1/webhooks/{made['id']}").status_code == 204
    admin_client.post(f"/admin/webhooks/subscription/{by_admin.pk}/delete/", {"post": "yes"})
    assert not Subscription.objects.filter(org=org).exists()

    urls = [(e.action, e.detail.get("url")) for e in
            AuditEntry.objects.filter(org=org, target_type="webhook").order_by("id")]  # fmt: skip
    assert urls == [
        ("webhook.create", "https://hooks.example"),
        ("webhook.update", "https://hooks.example:8443"),
        ("webhook.create", "https://hooks.example"),
        ("webhook.update", "https://other.example"),
        ("webhook.delete", "https://hooks.example:8443"),
        ("webhook.delete", "https://other.example"),
    ]
    said = audit_text(org)
    assert "SECRET" not in said and "/abc" not in said and "token" not in said


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"url": "ftp://hooks.example/w", "event_types": ["run.failed"]}, "https"),
        ({"url": "https://u:p@hooks.example/w", "event_types": ["run.failed"]}, "credentials"),
        ({"url": "https://hooks.example/w", "event_types": ["run.exploded"]}, "Must be one of"),
        ({"url": "https://hooks.example/w", "event_types": []}, "event_types"),
        (
            {"url": "https://hooks.example/w", "event_types": ["run.failed"], "secret": "x"},
            "secret",
        ),
    ],
)
def test_bad_subscriptions_are_refused_with_a_code(api, body: dict[str, Any], says: str) -> None:
    answer = api.post("/api/v1/webhooks", body, format="json")

    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_input" and says in json.dumps(answer.json())
    assert not Subscription.objects.exists()


def test_plain_http_is_refused_unless_the_operator_allows_it(api, settings: Any) -> None:
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_HTTP": False}

    body = {"url": "http://hooks.example/w", "event_types": ["run.failed"]}
    answer = api.post("/api/v1/webhooks", body, format="json")

    assert answer.status_code == 400 and "WAYMARK_WEBHOOK_ALLOW_HTTP" in answer.json()["detail"]


def test_an_organisation_has_at_most_its_subscriptions(org, api, settings: Any) -> None:
    settings.WEBHOOKS = {**settings.WEBHOOKS, "MAX_SUBSCRIPTIONS": 1}
    body = {"url": "https://hooks.example/w", "event_types": ["run.failed"]}

    assert api.post("/api/v1/webhooks", body, format="json").status_code == 201
    answer = api.post("/api/v1/webhooks", body, format="json")

    assert (answer.status_code, answer.json()["code"]) == (409, "quota_exceeded")


def test_the_admin_shows_a_new_secret_once_and_audits_the_person(org, admin_client: Client) -> None:
    page = admin_client.post("/admin/webhooks/subscription/add/", {
        "org": org.pk, "url": "https://hooks.example/w", "description": "ops",
        "event_types": ["run.failed", "approval.requested"], "active": "on",
    })  # fmt: skip

    assert page.status_code == 200, page.content[:2000]
    assert "admin/webhooks/subscription/secret.html" in [t.name for t in page.templates]
    assert "no-store" in page["Cache-Control"]
    (subscription,) = Subscription.objects.filter(org=org)
    assert subscription.event_types == ["run.failed", "approval.requested"]
    secret = page.context["secret"]
    assert secret.startswith("whsec_") and secret in page.content.decode()
    shown = admin_client.get(f"/admin/webhooks/subscription/{subscription.pk}/change/")
    assert secret not in shown.content.decode()
    (entry,) = AuditEntry.objects.filter(org=org, action="webhook.create")
    assert (entry.actor_kind, entry.actor_display) == ("user", "admin")


def test_deliveries_in_the_admin_are_read_only(org, admin_client: Client) -> None:
    subscribe(org, "https://a.example/hook", "run.succeeded")
    run_once(org)
    (row,) = Delivery.objects.filter(org=org)

    page = admin_client.get(f"/admin/webhooks/delivery/{row.pk}/change/")

    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert admin_client.get("/admin/webhooks/delivery/add/").status_code == 403


# --- the absence monitor and retention ------------------------------------------------------------


def test_the_doctor_finds_deliveries_nobody_sends(org) -> None:
    from webhooks.health import overdue

    subscribe(org, "https://a.example/hook", "run.succeeded")
    run_once(org)
    limits = Limits(late_seconds=300, examples=5)
    assert [f.severity for f in overdue(limits)] == ["ok"]

    Delivery.objects.filter(org=org).update(next_at=Now() - timedelta(minutes=10))

    (finding,) = overdue(limits)
    assert (finding.severity, finding.count) == ("broken", 1)


def test_retention_deletes_finished_deliveries_only(org, settings: Any) -> None:
    from webhooks.services import purge_finished

    subscribe(org, "https://a.example/hook", "run.started", "run.succeeded")
    run_once(org)
    done, waiting = Delivery.objects.filter(org=org).order_by("id")
    Delivery.objects.filter(pk=done.pk).update(status="delivered")
    Delivery.objects.filter(org=org).update(created_at=Now() - timedelta(days=31))

    assert purge_finished() == 1

    assert list(Delivery.objects.filter(org=org)) == [waiting]


def test_a_claimed_delivery_body_is_stable(org) -> None:
    subscribe(org, "https://a.example/hook", "run.succeeded")
    run_once(org)
    (item,) = claim(1)

    again = Claimed(**{**item.__dict__, "attempts": 5, "token": "another"})

    assert item.body() == again.body()
    assert json.loads(item.body())["occurred_at"] == item.occurred_at.isoformat()


def test_rotating_the_secrets_key_keeps_every_signing_secret(org, settings: Any) -> None:
    from io import StringIO

    from cryptography.fernet import Fernet
    from django.core.management import call_command

    from effects.public import decrypt

    subscription, secret = subscribe(org, "https://a.example/hook", "run.failed")
    before = subscription.secret_encrypted
    settings.EFFECTS = {**settings.EFFECTS,
                        "SECRET_KEYS": [Fernet.generate_key().decode()]}  # fmt: skip
    out = StringIO()

    call_command("rotate_webhook_secrets", stdout=out)

    subscription.refresh_from_db()
    assert "rotated 1 webhook secret(s)" in out.getvalue() and secret not in out.getvalue()
    assert subscription.secret_encrypted != before
    assert decrypt(subscription.secret_encrypted) == secret
