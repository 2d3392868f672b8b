"""A connection's credentials go to the host the egress guard vetted, and nowhere else.

Each provider with credentials runs a real effect step against a local API that answers with
a redirect to a second local server, which records what reaches it: on another port of the
same (allowlisted) host, and on 127.0.0.2, a host the organisation's egress rules refuse. No
client follows the redirect, so the second server never sees the token. The mail server is
reached by name through a rebinding resolver: the password goes to the address that was
vetted, never to the one a second lookup answers.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from effects.models import Effect
from tests.stubs.redirect import RecordingStub, RedirectingStub
from tests.stubs.smtp import SmtpStub
from workflows.models import Run, Step

from .effect_setup import connect, drive, one_step, start

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "tok-must-stay-home"
SLACK_OK = {"ok": True, "channel": "C0OPS", "ts": "1700000000.000100"}
COMPLETION = {"model": "m", "choices": [{"message": {"content": "hi"}}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1}}  # fmt: skip

# Same host on another port (allowlisted: only the credentials' origin differs), and a host
# the egress rules refuse (only 127.0.0.1/32 is allowlisted by `connect`).
TARGET_HOSTS = ["127.0.0.1", "127.0.0.2"]


@pytest.fixture(params=TARGET_HOSTS)
def elsewhere(request: pytest.FixtureRequest) -> Iterator[RecordingStub]:
    """Where the API redirects to; a test sets the ``answer`` its real API would give."""
    with RecordingStub(host=request.param) as stub:
        yield stub
    assert not stub.errors, stub.errors


@pytest.fixture
def api(elsewhere: RecordingStub) -> Iterator[RedirectingStub]:
    """The API at the connection's base URL: answers every call with a 302 to ``elsewhere``."""
    with RedirectingStub(elsewhere.url) as stub:
        yield stub
    assert not stub.errors, stub.errors


def only_the_vetted_host_saw_it(api: RedirectingStub, elsewhere: RecordingStub) -> None:
    assert len(api.requests) == 1 and api.saw(SECRET)  # sent once, to the vetted host
    assert elsewhere.requests == []  # nothing followed the redirect
    assert not elsewhere.saw(SECRET)


def failed_with(run_id: int, code: str) -> Step:
    """The effect step failed for good at once with ``code``; nothing waits for a person."""
    step = Step.objects.get(run_id=run_id, step_id="send")
    assert step.status == "failed", (step.status, step.error, step.wait_detail)
    assert step.error.startswith(f"{code}:"), step.error
    assert step.attempt == 1  # not retried: it would fail the same way
    assert Run.objects.get(pk=run_id).status == "failed"
    states = set(Effect.objects.filter(run_id=run_id).values_list("state", flat=True))
    assert states <= {"failed"}, states  # never outcome_unknown or needs_review
    return step


def test_a_slack_redirect_is_not_followed_and_the_bot_token_stays_with_slack(org, api, elsewhere):
    elsewhere.answer = SLACK_OK
    connect(org, provider="slack_message", name="slack", base_url=f"{api.url}/api/",
            secret=SECRET)  # fmt: skip
    step = {"type": "slack_message", "connection": "slack", "channel": "C0OPS", "text": "hi"}
    run_id = start(org, one_step(step, output="sent"))
    drive()
    assert api.count("POST", "/api/chat.postMessage") == 1
    assert api.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    only_the_vetted_host_saw_it(api, elsewhere)
    error = failed_with(run_id, "redirect_refused").error
    assert "302" in error and elsewhere.host in error


def test_a_model_endpoint_redirect_is_refused_and_the_key_stays_home(org, api, elsewhere):
    elsewhere.answer = COMPLETION
    connect(org, provider="model", name="llm", base_url=f"{api.url}/v1", secret=SECRET)
    step = {"type": "model", "connection": "llm", "prompt": "hi", "model": "m"}
    run_id = start(org, one_step(step, output="sent"))
    drive(lane="slow")
    assert api.count("POST", "/v1/chat/completions") == 1
    only_the_vetted_host_saw_it(api, elsewhere)
    failed_with(run_id, "redirect_refused")


def test_a_crm_redirect_upserts_nothing_and_is_not_taken_for_success(org, api, elsewhere):
    elsewhere.answer = {"id": "c1"}
    connect(org, provider="crm_upsert", name="crm", base_url=api.url, secret=SECRET,
            options={"auth_header": "X-Api-Key", "auth_scheme": ""})  # fmt: skip
    step = {"type": "crm_upsert", "connection": "crm", "object": "contacts",
            "external_id": "{{ input.n }}", "fields": {"name": "Ada"}}  # fmt: skip
    run_id = start(org, one_step(step, output="sent"))
    drive()
    assert api.requests[0]["headers"]["x-api-key"] == SECRET
    only_the_vetted_host_saw_it(api, elsewhere)
    failed_with(run_id, "redirect_refused")


def test_an_http_step_returns_a_redirect_as_its_answer_and_never_carries_the_secret_on(
    org, api, elsewhere
):
    """The generic http step's answer is the 3xx itself (it is not followed): the custom
    secret header, which httpx would keep on a cross-origin hop, never leaves the API."""
    elsewhere.answer = {"ok": True}
    connect(org, base_url=api.url, secret=SECRET,
            options={"auth_header": "X-Api-Key", "auth_scheme": ""})  # fmt: skip
    request = {"method": "POST", "url": f"{api.url}/items", "body": {}}
    run_id = start(org, one_step({"type": "http", "connection": "api", "request": request},
                                 output="{{ steps.send.output.status }}"))  # fmt: skip
    drive()
    assert api.requests[0]["headers"]["x-api-key"] == SECRET
    only_the_vetted_host_saw_it(api, elsewhere)
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.output) == ("succeeded", "302")


# --- the mail server: connected at the vetted address ----------------------------------------


@pytest.fixture
def rebinding_dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names mapped to the answers of successive lookups (the last one repeats); every
    other name goes to the real resolver."""
    answers: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in answers:
            return real(host, port, *args, **kwargs)
        address = answers[host][0] if len(answers[host]) == 1 else answers[host].pop(0)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port)))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


def test_the_smtp_password_goes_only_to_the_address_the_guard_vetted(org, rebinding_dns):
    """The name first answers the allowlisted 127.0.0.1, then 127.0.0.2 (refused). smtplib
    resolving the name again itself would log in at 127.0.0.2 with the password."""
    with SmtpStub(credentials=("mailer", SECRET)) as vetted, \
            SmtpStub(hostname="127.0.0.2", port=vetted.port) as decoy:  # fmt: skip
        rebinding_dns["mail.rebind.test"] = ["127.0.0.1", "127.0.0.2"]
        connect(org, provider="email", name="mail", secret=SECRET,
                options={"host": "mail.rebind.test", "port": vetted.port,
                         "username": "mailer"})  # fmt: skip
        step = {"type": "email", "connection": "mail", "to": "ada@example.com",
                "subject": "Hi", "body": "Hello"}  # fmt: skip
        run_id = start(org, one_step(step, output="sent"))
        drive()
        assert decoy.logins == [] and decoy.messages == []
        assert vetted.logins == [("mailer", SECRET)]
        assert [m.rcpt_tos for m in vetted.messages] == [["ada@example.com"]]
        assert Run.objects.get(pk=run_id).status == "succeeded"
