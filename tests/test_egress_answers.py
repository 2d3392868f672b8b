"""Outside answers of any size, slow resolvers and bad Retry-Afters (effects/answers.py,
effects/egress.py): a body is read streamed up to WAYMARK_OUTSIDE_ANSWER_MAX_BYTES and the
rest never received; a name resolves within its call's time; Retry-After is read by one
parser that never raises. Against real servers on 127.0.0.1 through real httpx, the memory
of this process (the caller) measured while a 300 MiB answer comes."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from effects import answers
from effects.answers import RETRY_AFTER_MAX_SECONDS, retry_after_seconds
from effects.egress import Allowlist
from effects.providers.base import Ambiguous, ConnectionInfo, RateLimited, Request, Unreachable
from effects.providers.http import HttpProvider, send
from effects.providers.model import ModelProvider
from effects.providers.slack import SlackMessageProvider

from .memory import MIB, peak_rss
from .stubs.flood import FloodStub

LOCAL = Allowlist.parse(["127.0.0.1/32"])
HUGE = 300 * MIB
MEMORY_BOUND_MIB = 50  # the caller's growth while a 300 MiB answer comes
HTTP = HttpProvider()


def conn_for(url: str = "", *, provider: str = "http", timeout: float = 10) -> ConnectionInfo:
    return ConnectionInfo(id=None, name="c", provider=provider, base_url=url, options={},
                          secret="tok", timeout_seconds=timeout, allow=LOCAL)  # fmt: skip


def http_request(url: str) -> Request:
    payload = {"method": "POST", "url": url, "headers": {}, "body": {"n": 1}}
    return Request(payload=payload, summary={})


# --- a 300 MiB answer ----------------------------------------------------------------------


def test_an_http_effect_answered_with_300_mib_keeps_a_stable_error_and_no_memory() -> None:
    """A 2xx made the effect: the step has its answer, whose body is over the cap, so none
    of it is kept (half a JSON document is not one) and ``body_error`` says so by code."""
    with FloodStub(status=200, size=HUGE) as flood, peak_rss() as peak:
        answer = HTTP.call(http_request(flood.url + "/orders"), "key-1", conn_for())
        (sent,) = flood.wait_requests(1)

    assert peak.grew_mib < MEMORY_BOUND_MIB, f"the caller grew {peak.grew_mib:.0f} MiB"
    assert sent < 64 * MIB, f"the stub wrote {sent / MIB:.0f} MiB before the client left"
    assert answer.result["status"] == 200 and answer.result["body"] is None
    assert answer.result["body_error"]["code"] == "answer_too_large"
    assert "WAYMARK_OUTSIDE_ANSWER_MAX_BYTES" in answer.result["body_error"]["detail"]


def test_a_provider_failing_with_300_mib_is_ambiguous_and_costs_no_memory() -> None:
    with FloodStub(status=500, size=HUGE) as flood, peak_rss() as peak:
        with pytest.raises(Ambiguous) as failed:
            HTTP.call(http_request(flood.url + "/orders"), "key-1", conn_for())
        (sent,) = flood.wait_requests(1)

    assert peak.grew_mib < MEMORY_BOUND_MIB, f"the caller grew {peak.grew_mib:.0f} MiB"
    assert sent < 64 * MIB
    assert failed.value.response is not None
    assert failed.value.response["status"] == 500
    assert failed.value.response["body_error"]["code"] == "answer_too_large"


def test_a_connection_check_answered_with_300_mib_costs_no_memory() -> None:
    """A check (the provider's probe) reads its answer as a call does."""
    with FloodStub(status=503, size=HUGE) as flood, peak_rss() as peak:
        with pytest.raises(Ambiguous) as failed:
            HTTP.probe(conn_for(flood.url + "/health"))
        (sent,) = flood.wait_requests(1)

    assert peak.grew_mib < MEMORY_BOUND_MIB, f"the check grew {peak.grew_mib:.0f} MiB"
    assert sent < 64 * MIB
    assert failed.value.response is not None
    assert failed.value.response["body_error"]["code"] == "answer_too_large"


def test_a_gzip_bomb_is_decompressed_no_further_than_the_cap() -> None:
    """300 MiB of zeros gzipped is ~300 KiB on the wire: the cap counts what it grows to."""
    with FloodStub(status=200, size=HUGE, gzip=True, prefix=b"") as flood, peak_rss() as peak:
        response = send(conn_for(), "GET", flood.url + "/bomb")

    assert peak.grew_mib < MEMORY_BOUND_MIB, f"the caller grew {peak.grew_mib:.0f} MiB"
    assert answers.was_cut(response)
    assert len(response.content) == answers.answer_max_bytes()
    assert "content-encoding" not in response.headers


def test_an_answer_within_the_cap_is_read_whole(settings: Any) -> None:
    settings.EFFECTS = {**settings.EFFECTS, "OUTSIDE_ANSWER_MAX_BYTES": 4096}
    body = b'{"id": "' + b"x" * 4000 + b'"}'  # 4,010 bytes: within
    with FloodStub(status=201, size=len(body), prefix=body) as flood:
        answer = HTTP.call(http_request(flood.url + "/orders"), "key-1", conn_for())
    assert answer.result == {"status": 201, "body": {"id": "x" * 4000}}
    with FloodStub(status=201, size=4097, prefix=body) as flood:  # one byte over
        answer = HTTP.call(http_request(flood.url + "/orders"), "key-1", conn_for())
    assert answer.result["body"] is None
    assert answer.result["body_error"]["code"] == "answer_too_large"


def test_a_lookup_whose_answer_is_over_the_cap_never_says_absent(settings: Any) -> None:
    """The list it gave cannot be read: "not made" would make the effect again."""
    settings.EFFECTS = {**settings.EFFECTS, "OUTSIDE_ANSWER_MAX_BYTES": 4096}
    with FloodStub(status=200, size=MIB, prefix=b'{"items": []') as flood:
        conn = ConnectionInfo(None, "c", "http", flood.url, {"lookup_url": flood.url + "/k/{key}"},
                              "tok", allow=LOCAL)  # fmt: skip
        with pytest.raises(Ambiguous, match="answer_too_large"):
            HTTP.lookup(http_request(flood.url), "key-1", conn)


def test_slack_and_model_answers_over_the_cap_are_ambiguous_with_the_code(settings: Any) -> None:
    """Their JSON cannot be read from its start: whether Slack posted, what the model said."""
    settings.EFFECTS = {**settings.EFFECTS, "OUTSIDE_ANSWER_MAX_BYTES": 65_536}
    with FloodStub(status=200, size=8 * MIB, prefix=b'{"ok": true, "x": "') as flood:
        slack = conn_for(flood.url + "/api/", provider="slack_message")
        request = Request(payload={"channel": "C1", "text": "hi"}, summary={})
        with pytest.raises(Ambiguous, match="answer_too_large"):
            SlackMessageProvider().call(request, "key-1", slack)
        model = ConnectionInfo(None, "m", "model", flood.url + "/v1", {"model": "m"}, "tok",
                               allow=LOCAL)  # fmt: skip
        prompt = Request(payload={"model": "m", "messages": []}, summary={})
        with pytest.raises(Ambiguous, match="answer_too_large"):
            ModelProvider().call(prompt, "key-1", model)


# --- the name resolved within the call's time ----------------------------------------------


@pytest.fixture
def slow_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """``slow.example`` takes 30 s to resolve (to 127.0.0.1), until the test ends; every
    other name resolves as usual."""
    real = socket.getaddrinfo
    done = threading.Event()

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "slow.example":
            done.wait(30)
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield done
    done.set()  # the resolver threads still waiting end now


def test_a_slow_resolver_is_given_up_on_at_the_calls_timeout(slow_dns) -> None:
    """Resolution counts in the call's time: an unreachable host (nothing was sent), with
    the code, by its timeout, not when the resolver answers."""
    started = time.monotonic()
    with pytest.raises(Unreachable, match="dns_timeout") as failed:
        send(conn_for(timeout=1), "POST", "http://slow.example:9/orders")
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"the call took {elapsed:.1f} s against its 1 s timeout"
    assert failed.value.made == "no" and failed.value.retryable


def test_rate_limits_with_a_bad_retry_after_are_bounded_never_raised() -> None:
    for value, expected in [("1e400", None), ("999999999999999", RETRY_AFTER_MAX_SECONDS),
                            ("²", None), ("7", 7.0)]:  # fmt: skip
        limiting = FloodStub(status=429, size=2, prefix=b"{}", headers={"Retry-After": value})
        with limiting as flood, pytest.raises(RateLimited) as limited:
            HTTP.call(http_request(flood.url + "/orders"), "key-1", conn_for())
        assert limited.value.retry_after == expected, value


# --- Retry-After, one parser ---------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["²", "١٢", "-5", "+5", "1e400", "inf", "nan", "9" * 5000, "5 s", "0x10", "", "   ",
     "Wed, 99 Oct 2015 07:28:00 GMT", "Wed, 21 Oct 99999 07:28:00 GMT", "not a date",
     "Wed, 21 Oct 2015 25:61:00 GMT", "\x00", "9" * 200 + " GMT"],
)  # fmt: skip
def test_a_bad_retry_after_is_none_never_an_exception(value: str) -> None:
    assert retry_after_seconds(value, now=lambda: 0.0) is None


def test_retry_after_seconds_and_dates_within_their_bounds() -> None:
    assert retry_after_seconds("120") == 120.0
    assert retry_after_seconds(" 1.5 ") == 1.5
    assert retry_after_seconds("0") == 0.0
    assert retry_after_seconds("999999999999999") == RETRY_AFTER_MAX_SECONDS
    assert retry_after_seconds(None) is None
    later, sent = "Wed, 21 Oct 2015 07:30:00 GMT", "Wed, 21 Oct 2015 07:28:00 GMT"
    assert retry_after_seconds(later, sent) == 120.0
    assert retry_after_seconds(sent, later) == 0.0  # a date past is "now"
    far = "Wed, 21 Oct 2099 07:30:00 GMT"
    assert retry_after_seconds(far, sent) == RETRY_AFTER_MAX_SECONDS
    # Without the answer's Date, counted from the clock given.
    assert retry_after_seconds(later, now=lambda: 1445412480.0) == 120.0
    assert retry_after_seconds(later, "garbage", now=lambda: 1445412480.0) == 120.0


def test_a_mail_server_whose_reply_never_ends_is_given_up_on_at_the_cap() -> None:
    """smtplib keeps every line of a reply: a greeting of 300 MiB of "220-" lines would be
    held whole. Read to the cap, then the call ends (the server said nothing usable)."""
    from effects.providers.email import EmailProvider

    from .stubs.flood import SmtpFlood

    with SmtpFlood() as server, peak_rss() as peak:
        options = {"host": "127.0.0.1", "port": server.port}
        conn = ConnectionInfo(None, "", "email", "", options, "", timeout_seconds=20, allow=LOCAL)
        request = Request(payload={"to": "a@example.com", "subject": "s", "body": "b"}, summary={})
        started = time.monotonic()
        with pytest.raises(Ambiguous, match="answer_too_large"):
            EmailProvider().call(request, "k", conn)
        elapsed = time.monotonic() - started

    assert peak.grew_mib < MEMORY_BOUND_MIB, f"the caller grew {peak.grew_mib:.0f} MiB"
    assert elapsed < 15, f"given up on after {elapsed:.1f} s, not at the cap"


def test_lookups_under_way_are_bounded_and_a_call_waits_for_one_within_its_time(
    slow_dns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resolver that never answers holds its lookup threads, not the callers: past the
    process's bound a call waits for a free one within its own time, then gives up."""
    from effects import egress

    monkeypatch.setattr(egress, "_resolvers", threading.BoundedSemaphore(1))
    with pytest.raises(Unreachable, match="did not resolve within"):
        send(conn_for(timeout=0.5), "GET", "http://slow.example:9/")  # its lookup goes on
    started = time.monotonic()
    with pytest.raises(Unreachable, match="dns_timeout: no resolver free"):
        send(conn_for(timeout=0.5), "GET", "http://slow.example:9/")
    assert time.monotonic() - started < 10
    slow_dns.set()  # the lookup ends, its thread with it: resolving works again
    assert egress._resolvers.acquire(timeout=10)
    egress._resolvers.release()
