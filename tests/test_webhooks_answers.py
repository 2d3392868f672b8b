"""What an endpoint answers cannot cost the sender: a 300 MiB body is not read (only the
status and an excerpt are kept), a slow resolver is given up on at the attempt's timeout,
a bad Retry-After is ignored, and no delivery is sent past WAYMARK_WEBHOOK_MAX_ATTEMPTS
whatever failed in the sending path. Through the real claim, send and record (the sender's
``deliver``), real httpx, and stub endpoints on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from webhooks import delivery as sending
from webhooks.models import Delivery
from webhooks.services import purge_finished
from workflows.models import Organisation

from .memory import MIB, peak_rss
from .processes import spawn, stop, wait_for
from .stubs.flood import FloodStub
from .test_webhooks import make_due, run_once, send_due, subscribe

pytestmark = pytest.mark.django_db

MEMORY_BOUND_MIB = 50


@pytest.fixture(autouse=True)
def webhook_settings(settings: Any) -> None:
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_HTTP": True, "RETRY_BASE_SECONDS": 1.0,
                         "RETRY_MAX_SECONDS": 8.0, "TIMEOUT_SECONDS": 5.0}  # fmt: skip


@pytest.mark.parametrize("status", [500, 200])
def test_an_endpoint_answering_300_mib_costs_the_sender_no_memory(org, status: int) -> None:
    with FloodStub(status=status, size=300 * MIB, content_type="text/plain") as flood:
        subscribe(org, f"{flood.url}/hook", "run.succeeded")
        run_once(org)
        with peak_rss() as peak:
            (outcome,) = send_due()
        (sent,) = flood.wait_requests(1)

    assert peak.grew_mib < MEMORY_BOUND_MIB, f"the sender grew {peak.grew_mib:.0f} MiB"
    assert sent < 64 * MIB, f"the stub wrote {sent / MIB:.0f} MiB before the sender left"
    (row,) = Delivery.objects.filter(org=org)
    assert (row.last_status, row.status) == (
        (500, "pending") if status == 500 else (200, "delivered")
    )
    # The excerpt kept: the body's start, at most RESPONSE_CHARS.
    assert row.last_response.startswith('{"items": ["xxx')
    assert len(row.last_response) == sending.RESPONSE_CHARS
    assert outcome.delivered is (status == 200)


def test_a_slow_resolver_is_given_up_on_at_the_attempts_timeout(
    org, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 30 s resolver against a 1 s timeout: the attempt ends by its timeout, as a failure
    tried again (``dns_timeout``), and its sending thread is free again."""
    settings.WEBHOOKS = {**settings.WEBHOOKS, "TIMEOUT_SECONDS": 1.0}
    real = socket.getaddrinfo
    released = threading.Event()

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "slow.example":
            released.wait(30)
        return real("127.0.0.1" if host == "slow.example" else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        started = time.monotonic()
        outcome = sending.post(org.pk, "http://slow.example:9/hook", {}, b"{}")
        elapsed = time.monotonic() - started
    finally:
        released.set()
    assert elapsed < 10, f"the attempt took {elapsed:.1f} s against its 1 s timeout"
    assert not outcome.delivered and not outcome.final
    assert outcome.error.startswith("unreachable: dns_timeout:"), outcome.error


@pytest.fixture
def unreadable_retry_after() -> Iterator[FloodStub]:
    """An endpoint answering 503 with ``Retry-After: ²`` (a digit to str.isdigit, not to
    float)."""
    with FloodStub(status=503, size=2, prefix=b"{}", headers={"Retry-After": "²"}) as stub:
        yield stub


def test_a_bad_retry_after_is_ignored_and_the_delivery_fails_after_its_attempts(
    org: Organisation, settings: Any, unreadable_retry_after: FloodStub
) -> None:
    settings.WEBHOOKS = {**settings.WEBHOOKS, "MAX_ATTEMPTS": 3}
    subscribe(org, f"{unreadable_retry_after.url}/hook", "run.succeeded")
    run_once(org)

    for _ in range(5):  # more rounds than attempts: the last two find nothing to send
        make_due()
        send_due()

    (row,) = Delivery.objects.filter(org=org)
    assert (row.status, row.attempts, row.last_status) == ("failed", 3, 503)
    assert row.last_error.startswith("http_503")
    assert len(unreadable_retry_after.wait_requests(3)) == 3
    # Failed: deleted with the other finished ones after the retention
    # (docs/how-to/receive-webhooks.md).
    Delivery.objects.filter(pk=row.pk).update(created_at=Now() - timedelta(days=31))
    assert purge_finished() == 1
    assert not Delivery.objects.filter(pk=row.pk).exists()


def test_the_claim_fails_a_delivery_whose_attempts_are_used_instead_of_sending_it(
    org: Organisation, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever goes wrong between the claim and the record (a bug that raises, a sender
    killed), the claim counts attempts: the one after the last is never made."""
    settings.WEBHOOKS = {**settings.WEBHOOKS, "MAX_ATTEMPTS": 2}
    with FloodStub(status=200, size=2, prefix=b"{}") as endpoint:
        subscribe(org, f"{endpoint.url}/hook", "run.succeeded")
        run_once(org)

        def broken(item: sending.Claimed) -> sending.Outcome:
            raise RuntimeError("a fault in the sending path, before the record")

        monkeypatch.setattr(sending, "attempt", broken)
        for _ in range(4):
            make_due()
            for item in sending.claim(8):
                with pytest.raises(RuntimeError):  # the sender logs it; its lease lapses
                    sending.deliver(item)
            Delivery.objects.filter(org=org, status="pending").update(lease_until=None)
        monkeypatch.undo()
        make_due()
        assert send_due() == []

    (row,) = Delivery.objects.filter(org=org)
    assert (row.status, row.attempts) == ("failed", 2)
    assert row.last_error.startswith("attempts_used:"), row.last_error
    assert endpoint.sent == []  # never sent past its attempts


@pytest.mark.django_db(transaction=True)
def test_the_leading_sweepers_memory_stays_put_while_endpoints_answer_300_mib(org, procs) -> None:
    """The sweeper process (``manage.py sweep``, which sends the deliveries): its resident
    memory once it has sent one delivery, then its peak while two endpoints answer 300 MiB
    each (one 500, one 200)."""
    env = {"WAYMARK_WEBHOOK_ALLOW_HTTP": "1", "WAYMARK_WEBHOOK_POLL_SECONDS": "0.2",
           "WAYMARK_SWEEP_SECONDS": "0.3"}  # fmt: skip
    small = FloodStub(status=200, size=2, prefix=b"{}")
    failing = FloodStub(status=500, size=300 * MIB)
    answering = FloodStub(status=200, size=300 * MIB)
    with small, failing, answering:
        subscribe(org, f"{small.url}/hook", "run.succeeded")
        run_once(org, key="warm-up")
        sweeper = spawn("sweep", **env)
        procs.append(sweeper)
        wait_for(lambda: Delivery.objects.filter(org=org, status="delivered").exists(),
                 what="the sweeper's first delivery")  # fmt: skip
        subscribe(org, f"{failing.url}/hook", "run.succeeded")
        subscribe(org, f"{answering.url}/hook", "run.succeeded")
        with peak_rss(pid=sweeper.pid) as peak:
            run_once(org, key="huge")
            wait_for(lambda: Delivery.objects.filter(org=org, last_status__isnull=False)
                     .count() == 4, what="the three deliveries of the second run")  # fmt: skip
        stop(sweeper)
    statuses = Delivery.objects.filter(org=org).values_list("last_status", flat=True)
    assert sorted(s or 0 for s in statuses) == [200, 200, 200, 500]
    assert peak.grew_mib < MEMORY_BOUND_MIB, (
        f"the sweeper grew {peak.grew_mib:.0f} MiB from {peak.before / MIB:.0f} MiB"
    )
