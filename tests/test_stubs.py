"""The stubs in tests/stubs behave as the effect-ledger tests rely on, seen through real clients:
httpx for the provider and the model, smtplib for SMTP, slack-sdk's WebClient for Slack."""

from __future__ import annotations

import signal
import smtplib
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from email.message import EmailMessage
from typing import Any

import httpx
import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

from tests.stubs import fixtures
from tests.stubs.provider import ProviderStub
from tests.stubs.slack import SlackStub
from tests.stubs.smtp import SmtpStub

provider_stub = fixtures.provider_stub
model_stub = fixtures.model_stub
slack_stub = fixtures.slack_stub
smtp_stub = fixtures.smtp_stub


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Runs `call` in a thread; its result (or exception) lands in the returned list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def eventually(check: Callable[[], bool], timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# --- provider ----------------------------------------------------------------------------


def test_provider_without_idempotency_creates_every_time(provider_stub):
    for _ in range(2):
        r = httpx.post(
            provider_stub.url + "/items", json={"n": 1}, headers={"Idempotency-Key": "k"}
        )
        assert r.status_code == 201
    assert [i["id"] for i in provider_stub.created] == ["item_1", "item_2"]
    assert r.json() == {"id": "item_2", "key": "k", "body": {"n": 1}}


def test_provider_idempotent_repeat_returns_the_same_item(provider_stub):
    provider_stub.idempotent = True
    with httpx.Client(base_url=provider_stub.url) as client:
        first = client.post("/items", json={"n": 1}, headers={"Idempotency-Key": "k"})
        again = client.post("/items", json={"n": 1}, headers={"Idempotency-Key": "k"})
        other = client.post("/items", json={"n": 2}, headers={"Idempotency-Key": "k2"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert again.json() == first.json() == {"id": "item_1", "key": "k", "body": {"n": 1}}
    assert len(provider_stub.created) == 2
    assert provider_stub.count("POST", "/items") == 3


def test_provider_same_key_while_held_is_409(provider_stub):
    provider_stub.idempotent = True
    provider_stub.hold()
    headers = {"Idempotency-Key": "k"}
    thread, out = in_thread(lambda: httpx.post(provider_stub.url + "/items", headers=headers))
    assert provider_stub.wait_arrived(1, timeout=5)
    busy = httpx.post(provider_stub.url + "/items", headers=headers)
    assert busy.status_code == 409
    assert busy.json() == {"error": "key_in_use"}
    assert provider_stub.created == []
    provider_stub.release()
    thread.join(5)
    assert out[0].status_code == 201
    assert len(provider_stub.created) == 1


def test_provider_held_request_still_creates_after_the_client_is_sigkilled(provider_stub):
    provider_stub.hold()
    client = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import httpx, sys; httpx.post(sys.argv[1], json={'a': 1}, timeout=60)",
            provider_stub.url + "/items",
        ]
    )
    try:
        assert provider_stub.wait_arrived(1, timeout=10)
        client.send_signal(signal.SIGKILL)
        assert client.wait(5) == -signal.SIGKILL
    finally:
        client.kill()
        client.wait()
    assert provider_stub.created == []
    provider_stub.release()
    assert eventually(lambda: len(provider_stub.created) == 1)
    assert provider_stub.created[0]["body"] == {"a": 1}


def test_provider_held_request_still_creates_after_a_client_timeout(provider_stub):
    provider_stub.hold()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(provider_stub.url + "/items", json={}, timeout=0.3)
    assert provider_stub.arrived == 1
    provider_stub.release()
    assert eventually(lambda: len(provider_stub.created) == 1)


def test_provider_lookup_by_key(provider_stub):
    url = provider_stub.url + "/items"
    httpx.post(url, json={"n": 1}, headers={"Idempotency-Key": "a"})  # recorded, not honoured
    httpx.post(url, json={"n": 2}, headers={"Idempotency-Key": "b"})
    refused = httpx.get(url, params={"key": "a"})
    assert (refused.status_code, refused.json()) == (404, {"error": "no_lookup"})
    provider_stub.lookup = True
    found = httpx.get(url, params={"key": "a"}).json()["items"]
    assert found == [{"id": "item_1", "key": "a", "body": {"n": 1}}]
    assert httpx.get(url, params={"key": "zz"}).json() == {"items": []}


def test_provider_upserts_contacts_and_echoes(provider_stub):
    url = provider_stub.url
    first = httpx.put(url + "/contacts/ext-1", json={"name": "A"})
    second = httpx.put(url + "/contacts/ext-1", json={"name": "B"})
    assert (first.status_code, first.json()["created"]) == (201, True)
    assert second.json() == {"id": "ext-1", "created": False, "body": {"name": "B"}}
    assert provider_stub.contacts == {"ext-1": {"name": "B"}}
    echo = httpx.patch(url + "/echo/x?q=1", json={"v": 2}, headers={"X-Trace": "t"}).json()
    assert echo["method"] == "PATCH"
    assert (echo["path"], echo["query"], echo["body"]) == ("/echo/x", {"q": "1"}, {"v": 2})
    assert echo["headers"]["x-trace"] == "t"


def test_provider_fails_then_succeeds(provider_stub):
    provider_stub.fail_next(2, status=502)
    statuses = [httpx.post(provider_stub.url + "/items").status_code for _ in range(3)]
    assert statuses == [502, 502, 201]
    assert len(provider_stub.created) == 1
    provider_stub.fail_for(0.3)
    assert httpx.post(provider_stub.url + "/items").status_code == 503
    time.sleep(0.35)
    assert httpx.post(provider_stub.url + "/items").status_code == 201


def test_provider_rate_limit_carries_retry_after(provider_stub):
    provider_stub.rate_limit_next(1, retry_after=3)
    limited = httpx.post(provider_stub.url + "/items")
    assert limited.status_code == 429
    assert limited.headers["Retry-After"] == "3"
    assert provider_stub.created == []
    assert httpx.post(provider_stub.url + "/items").status_code == 201


def test_provider_fault_can_target_a_path(provider_stub):
    provider_stub.lookup = True
    provider_stub.fail_next(1, path_prefix="/items")
    assert httpx.get(provider_stub.url + "/echo").status_code == 200
    assert httpx.get(provider_stub.url + "/items").status_code == 503


def test_provider_malformed_and_dropped_answers_come_after_the_effect(provider_stub):
    provider_stub.malformed_next(1)
    r = httpx.post(provider_stub.url + "/items", json={})
    assert r.status_code == 200
    with pytest.raises(ValueError):
        r.json()
    provider_stub.drop_next(1)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(provider_stub.url + "/items", json={})
    assert len(provider_stub.created) == 2


def test_provider_tokens(provider_stub):
    url = provider_stub.url + "/items"
    assert httpx.post(url).status_code == 201  # no token required yet
    provider_stub.require_token("good")
    for headers in ({}, {"Authorization": "Bearer bad"}, {"Authorization": "Basic good"}):
        refused = httpx.post(url, headers=headers)
        assert (refused.status_code, refused.json()) == (401, {"error": "invalid_token"})
    assert httpx.post(url, headers={"Authorization": "Bearer good"}).status_code == 201
    provider_stub.revoke_token("good")
    assert httpx.post(url, headers={"Authorization": "Bearer good"}).status_code == 401
    assert len(provider_stub.created) == 2


def test_provider_slow_and_records(provider_stub):
    provider_stub.slow(0.3)
    started = time.monotonic()
    httpx.post(provider_stub.url + "/items?x=1", json={"a": 1}, headers={"X-Up": "v"})
    assert time.monotonic() - started >= 0.3
    (seen,) = provider_stub.requests
    assert (seen["method"], seen["path"], seen["query"]) == ("POST", "/items", {"x": "1"})
    assert seen["headers"]["x-up"] == "v"
    assert seen["body"] == {"a": 1}
    assert seen["raw"] == '{"a":1}'
    assert seen["monotonic"] >= started
    assert abs(seen["wall"] - time.time()) < 5
    provider_stub.slow(0)
    httpx.post(provider_stub.url + "/echo", content="plain")
    assert provider_stub.requests[1]["body"] == "plain"
    assert (provider_stub.count("POST"), provider_stub.count("POST", "/echo")) == (2, 1)
    provider_stub.clear()
    assert (provider_stub.requests, provider_stub.created, provider_stub.arrived) == ([], [], 0)


def test_stubs_stop_while_a_request_is_held_and_restart():
    stub = ProviderStub()
    for n in range(1, 3):
        with stub:
            stub.hold()
            thread, _ = in_thread(lambda: httpx.post(stub.url + "/items", timeout=5))
            assert stub.wait_arrived(n, timeout=5)
        thread.join(5)
        assert not thread.is_alive()
    assert eventually(lambda: len(stub.created) == 2)  # stop() released the held requests


# --- model -------------------------------------------------------------------------------


def test_model_answers_an_openai_completion(model_stub):
    body = {
        "model": "stub-1",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "say hi now"}]},
        ],
    }
    with httpx.Client(base_url=model_stub.url) as client:
        first = client.post("/v1/chat/completions", json=body).json()
        model_stub.reply, model_stub.prompt_tokens, model_stub.completion_tokens = "hi", 5, 2
        second = client.post("/v1/chat/completions", json=body).json()
    assert first == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "stub-1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "echo: say hi now"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
    }
    assert second["id"] == "chatcmpl-2"
    assert second["choices"][0]["message"]["content"] == "hi"
    assert second["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert model_stub.count("POST", "/v1/chat/completions") == 2


def test_model_token_faults_and_hold(model_stub):
    url = model_stub.url + "/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    model_stub.require_token("sk-1")
    assert httpx.post(url, json=body).status_code == 401
    auth = {"Authorization": "Bearer sk-1"}
    model_stub.rate_limit_next(1, retry_after=0.5)
    limited = httpx.post(url, json=body, headers=auth)
    assert (limited.status_code, limited.headers["retry-after"]) == (429, "0.5")
    model_stub.malformed_next(1)
    with pytest.raises(ValueError):
        httpx.post(url, json=body, headers=auth).json()
    model_stub.hold()
    thread, out = in_thread(lambda: httpx.post(url, json=body, headers=auth))
    assert model_stub.wait_arrived(2, timeout=5)  # the malformed one arrived too
    assert out == []
    model_stub.release()
    thread.join(5)
    assert out[0].json()["id"] == "chatcmpl-2"
    assert httpx.post(url, json={"model": "m"}, headers=auth).status_code == 400


# --- slack -------------------------------------------------------------------------------


SLACK_TOKEN = "xoxb-stub"  # the one SlackStub accepts by default


def slack_client(stub: SlackStub, token: str = SLACK_TOKEN, **kwargs: Any) -> WebClient:
    return WebClient(token=token, base_url=stub.url + "/api/", **kwargs)


def test_slack_posts_and_finds_by_metadata(slack_stub):
    client = slack_client(slack_stub)
    metadata = {"event_type": "waymark_effect", "event_payload": {"key": "eff-1"}}
    posted = client.chat_postMessage(channel="C1", text="hello", metadata=metadata)
    other = client.chat_postMessage(channel="C1", text="again")
    assert posted["ok"] is True
    assert (posted["channel"], posted["message"]["metadata"]) == ("C1", metadata)
    assert posted["ts"] != other["ts"]
    history = client.conversations_history(channel="C1", include_all_metadata=True)
    assert [m["text"] for m in history["messages"]] == ["again", "hello"]  # newest first
    assert history["messages"][1]["metadata"] == metadata
    plain = client.conversations_history(channel="C1")
    assert all("metadata" not in m for m in plain["messages"])
    assert client.conversations_history(channel="C2")["messages"] == []
    # A form body (how other clients send it) carries metadata as a JSON string.
    form = client.api_call(
        "chat.postMessage",
        data={"channel": "C2", "text": "f", "metadata": '{"event_type": "e"}'},
    )
    assert form["message"]["metadata"] == {"event_type": "e"}
    assert len(slack_stub.messages) == 3


def test_slack_auth(slack_stub):
    assert slack_client(slack_stub).auth_test()["user_id"] == "U0STUB"
    with pytest.raises(SlackApiError) as bad:
        slack_client(slack_stub, token="xoxb-wrong").chat_postMessage(channel="C1", text="x")
    assert bad.value.response["error"] == "invalid_auth"
    slack_stub.revoke_token("xoxb-stub")
    with pytest.raises(SlackApiError) as revoked:
        slack_client(slack_stub).auth_test()
    assert revoked.value.response["error"] == "token_revoked"
    assert slack_stub.messages == []


def test_slack_rate_limit_raises_unless_a_retry_handler_is_configured(slack_stub):
    slack_stub.rate_limit_next(1, retry_after=0)
    with pytest.raises(SlackApiError) as limited:
        slack_client(slack_stub).chat_postMessage(channel="C1", text="x")
    assert limited.value.response.status_code == 429
    assert limited.value.response.headers["Retry-After"] == "0"
    assert limited.value.response["error"] == "ratelimited"
    assert slack_stub.messages == []
    slack_stub.rate_limit_next(1, retry_after=0)
    retrying = slack_client(slack_stub, retry_handlers=[RateLimitErrorRetryHandler()])
    assert retrying.chat_postMessage(channel="C1", text="x")["ok"] is True
    assert slack_stub.count("POST", "/api/chat.postMessage") == 3
    assert len(slack_stub.messages) == 1


def test_slack_500_raises_and_a_dropped_answer_is_resent_by_default(slack_stub):
    slack_stub.fail_next(1)
    with pytest.raises(SlackApiError) as failed:
        slack_client(slack_stub).chat_postMessage(channel="C1", text="x")
    assert failed.value.response.status_code == 500
    # slack-sdk's default ConnectionErrorRetryHandler resends once when the connection drops
    # after the post took effect: two messages for one call.
    slack_stub.drop_next(1)
    slack_client(slack_stub).chat_postMessage(channel="C1", text="once?")
    assert [m["text"] for m in slack_stub.messages] == ["once?", "once?"]


def test_slack_hold(slack_stub):
    slack_stub.hold()
    client = slack_client(slack_stub)
    thread, out = in_thread(lambda: client.chat_postMessage(channel="C1", text="x"))
    assert slack_stub.wait_arrived(1, timeout=5)
    assert slack_stub.messages == []
    slack_stub.release()
    thread.join(5)
    assert out[0]["ok"] is True
    assert len(slack_stub.messages) == 1


# --- smtp --------------------------------------------------------------------------------


def email_message(n: int = 1) -> EmailMessage:
    message = EmailMessage()
    message["From"] = "sender@example.test"
    message["To"] = "a@example.test, b@example.test"
    message["Subject"] = f"Hello {n}"
    message["Message-ID"] = f"<m{n}@waymark.test>"
    message["X-Waymark-Effect"] = f"eff-{n}"
    message.set_content("body text")
    return message


def test_smtp_records_messages(smtp_stub):
    with smtplib.SMTP(smtp_stub.host, smtp_stub.port, timeout=5) as client:
        client.send_message(email_message())
    (seen,) = smtp_stub.messages
    assert seen.mail_from == "sender@example.test"
    assert seen.rcpt_tos == ["a@example.test", "b@example.test"]
    assert seen.message_id == "<m1@waymark.test>"
    assert seen.headers["x-waymark-effect"] == "eff-1"
    assert seen.message["Subject"] == "Hello 1"
    assert seen.message.get_content().strip() == "body text"
    assert smtp_stub.url == f"smtp://127.0.0.1:{smtp_stub.port}"


def test_smtp_temporary_failures(smtp_stub):
    smtp_stub.fail_next(1)
    with smtplib.SMTP(smtp_stub.host, smtp_stub.port, timeout=5) as client:
        with pytest.raises(smtplib.SMTPDataError) as data_error:
            client.send_message(email_message(1))
        assert data_error.value.smtp_code == 451
        smtp_stub.fail_next(2, code=452, at="RCPT")
        with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
            client.send_message(email_message(2))
        assert {code for code, _ in refused.value.recipients.values()} == {452}
        client.send_message(email_message(3))
    assert [m.message_id for m in smtp_stub.messages] == ["<m3@waymark.test>"]
    assert smtp_stub.rejected == 3


def test_smtp_hold_and_release(smtp_stub):
    smtp_stub.hold()

    def send() -> None:
        with smtplib.SMTP(smtp_stub.host, smtp_stub.port, timeout=5) as client:
            client.send_message(email_message())

    thread, out = in_thread(send)
    assert smtp_stub.wait_arrived(1, timeout=5)
    time.sleep(0.1)
    assert smtp_stub.messages == []
    smtp_stub.release()
    thread.join(5)
    assert out == [None]
    assert len(smtp_stub.messages) == 1


def test_smtp_held_message_is_delivered_after_the_client_went_away(smtp_stub):
    smtp_stub.hold()
    client = smtplib.SMTP(smtp_stub.host, smtp_stub.port, timeout=0.3)
    with pytest.raises(smtplib.SMTPServerDisconnected, match="timed out"):
        client.send_message(email_message())
    client.close()
    assert smtp_stub.arrived == 1
    time.sleep(0.1)  # let the server see the disconnect (it cancels the session's handler)
    smtp_stub.release()
    assert eventually(lambda: len(smtp_stub.messages) == 1)


def test_smtp_restarts_and_stops_with_an_open_session():
    stub = SmtpStub()
    ports = set()
    for n in range(3):
        with stub:
            ports.add(stub.port)
            client = smtplib.SMTP(stub.host, stub.port, timeout=5)
            client.send_message(email_message(n))
        client.close()  # after stop(): the server side went first
    assert len(stub.messages) == 3
    assert 0 not in ports


def test_smtp_auth(smtp_stub):
    smtp_stub.credentials = ("user", "secret")
    with smtplib.SMTP(smtp_stub.host, smtp_stub.port, timeout=5) as client:
        with pytest.raises(smtplib.SMTPAuthenticationError) as refused:
            client.login("user", "wrong")
        assert refused.value.smtp_code == 535
        client.login("user", "secret")
        client.send_message(email_message())
    assert [m.login for m in smtp_stub.messages] == ["user"]
