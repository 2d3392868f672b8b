"""Input that can never be sent fails its step at once, with the code ``invalid_request``.

A header value that is not ASCII, a URL httpx will not parse, a subject with a line break (a
header injection), a ``to`` of two addresses: nothing was sent, and sending again would fail
the same way. So the step fails for good on its first attempt, nothing reaches the stub, no
traceback is logged at ERROR, and no effect waits for a person (``needs_review`` is for
calls that may have reached the provider). Also when the request is built only inside the
call (the connection's own credential header, its sender address), past every check of the
step's input.
"""

from __future__ import annotations

import logging

import pytest

from effects.egress import Allowlist
from effects.models import Effect
from effects.providers.base import ConnectionInfo, Invalid
from effects.providers.slack import slack_call
from workflows.models import Run, Step

from .effect_setup import connect, drive, one_step, start

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The records logged at ERROR or above while the test runs (the worker runs in-process)."""
    caplog.set_level(logging.INFO)
    return caplog.records


def failed_at_once(run_id: int, message: str, errors: list[logging.LogRecord]) -> Step:
    step = Step.objects.get(run_id=run_id, step_id="send")
    assert step.status == "failed", (step.status, step.error, step.wait_detail)
    assert step.error.startswith("invalid_request: "), step.error
    assert message in step.error, step.error
    assert step.attempt == 1  # not retried
    assert Run.objects.get(pk=run_id).status == "failed"
    # Never outcome_unknown, never needs_review: nothing may have left.
    states = set(Effect.objects.filter(run_id=run_id).values_list("state", flat=True))
    assert states <= {"failed"}, states
    loud = [r for r in errors if r.levelno >= logging.ERROR]
    assert loud == [], [(r.name, r.getMessage()) for r in loud]
    return step


def http_step(url: str, **headers: str) -> dict:
    return {"type": "http", "connection": "api",
            "request": {"method": "POST", "url": url, "headers": headers, "body": {}}}  # fmt: skip


def email_step(**fields: str) -> dict:
    return {"type": "email", "connection": "mail", "to": "ada@example.com", "subject": "Hi",
            "body": "Hello", **fields}  # fmt: skip


def test_a_header_value_that_is_not_ascii(org, provider_stub, errors):
    connect(org, base_url=provider_stub.url)
    step = http_step(f"{provider_stub.url}/echo", **{"X-Name": "{{ input.name }}"})
    run_id = start(org, one_step(step), run_input={"name": "Zoë"})
    drive()
    failed_at_once(run_id, "header X-Name has a non-ASCII value", errors)
    assert provider_stub.requests == []


def test_a_header_value_with_a_line_break(org, provider_stub, errors):
    connect(org, base_url=provider_stub.url)
    step = http_step(f"{provider_stub.url}/echo", **{"X-Name": "{{ input.name }}"})
    run_id = start(org, one_step(step), run_input={"name": "Zoe\r\nX-Admin: yes"})
    drive()
    failed_at_once(run_id, "header X-Name has a line break", errors)
    assert provider_stub.requests == []


def test_an_octal_looking_address_is_not_a_url(org, provider_stub, errors):
    """0177.0.0.1 is 127.0.0.1 to inet_aton, where the stub listens (and is allowlisted):
    refused as a URL, it never gets that far."""
    connect(org, base_url=provider_stub.url)
    url = f"http://0177.0.0.1:{provider_stub.port}/echo"
    run_id = start(org, one_step(http_step("{{ input.url }}")), run_input={"url": url})
    drive()
    failed_at_once(run_id, "the URL is not valid", errors)
    assert provider_stub.requests == []


def test_a_subject_with_a_header_injection(org, smtp_stub, errors):
    connect(org, provider="email", name="mail",
            options={"host": smtp_stub.host, "port": smtp_stub.port})  # fmt: skip
    step = email_step(subject="{{ input.subject }}")
    subject = "Hi\r\nBcc: everyone@victim.example"
    run_id = start(org, one_step(step, output="sent"), run_input={"subject": subject})
    drive()
    failed_at_once(run_id, "subject has a line break", errors)
    assert smtp_stub.messages == []


def test_a_to_of_two_addresses(org, smtp_stub, errors):
    connect(org, provider="email", name="mail",
            options={"host": smtp_stub.host, "port": smtp_stub.port})  # fmt: skip
    step = email_step(to="{{ input.to }}")
    to = "ada@example.com, eve@example.com"
    run_id = start(org, one_step(step, output="sent"), run_input={"to": to})
    drive()
    failed_at_once(run_id, "to must be one email address", errors)
    assert smtp_stub.messages == []


# --- built inside the call: the connection's own values ---------------------------------------


def test_a_connection_secret_that_cannot_be_a_header(org, provider_stub, errors):
    """The credential header is built from the connection only when the call is made: the
    step's checks never see it. Still nothing left, so still invalid_request."""
    connect(org, base_url=provider_stub.url, secret="tökén")
    run_id = start(org, one_step(http_step(f"{provider_stub.url}/items")))
    drive()
    step = failed_at_once(run_id, "the POST request cannot be sent", errors)
    assert "tökén" not in step.error
    [effect] = Effect.objects.filter(run_id=run_id)
    assert effect.state == "failed"
    assert provider_stub.requests == []


def test_a_sender_address_with_a_header_injection(org, smtp_stub, errors):
    sender = "shop@example.com\r\nBcc: everyone@victim.example"
    options = {"host": smtp_stub.host, "port": smtp_stub.port, "from_address": sender}
    connect(org, provider="email", name="mail", options=options)
    run_id = start(org, one_step(email_step(), output="sent"))
    drive()
    failed_at_once(run_id, "the email cannot be sent", errors)
    assert smtp_stub.messages == []


def test_a_slack_call_slack_sdk_cannot_build_is_invalid_not_unknown(slack_stub):
    """slack-sdk serialises the call before handing it to the transport: what fails there
    never left (before, it was taken for an unreadable answer: it may have posted)."""
    conn = ConnectionInfo(id=None, name="s", provider="slack_message",
                          base_url=f"{slack_stub.url}/api/", options={}, secret="xoxb-stub",
                          allow=Allowlist.parse(["127.0.0.1/32"]))  # fmt: skip
    with pytest.raises(Invalid) as invalid:
        slack_call(conn, "chat_postMessage", channel="C0OPS", text="hi",
                   metadata={"event_type": "x", "event_payload": {"not_json": {1, 2}}})  # fmt: skip
    assert str(invalid.value).startswith("invalid_request: ")
    assert invalid.value.made == "no" and not invalid.value.retryable
    assert slack_stub.requests == []
