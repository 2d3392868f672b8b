"""The slack_message and model providers against the stubs, with the real clients
(slack-sdk's WebClient, httpx through the egress guard), called directly."""

from __future__ import annotations

import socket
from decimal import Decimal
from typing import Any

import pytest

from effects import steptypes
from effects.egress import Allowlist
from effects.perform import PROVIDERS
from effects.providers import model as model_module
from effects.providers import slack as slack_module
from effects.providers.base import (
    Ambiguous,
    AuthFailed,
    ConnectionInfo,
    RateLimited,
    Refused,
    Request,
    Unreachable,
)
from effects.providers.http import EgressDenied
from effects.providers.model import ModelProvider, read_completion
from effects.providers.slack import SlackMessageProvider
from tests.stubs import fixtures
from tests.stubs.base import Response
from tests.stubs.model import ModelStub
from tests.stubs.slack import SlackStub
from workflows.definitions.registry import StepReport, registry
from workflows.plugins import StepFailure

model_stub = fixtures.model_stub

LOCAL = Allowlist.parse(["127.0.0.1/32"])
TOKEN = "xoxb-valid"
MODEL_TOKEN = "sk-valid"


@pytest.fixture
def slack_stub():
    with SlackStub(valid_tokens=(TOKEN,)) as stub:
        yield stub
    assert not stub.errors, stub.errors


def slack_conn(
    url: str, *, secret: str = TOKEN, allow: Allowlist = LOCAL, timeout: float = 5
) -> ConnectionInfo:
    return ConnectionInfo(
        id=None, name="s", provider="slack_message", base_url=url + "/api/",
        options={}, secret=secret, timeout_seconds=timeout, allow=allow,
    )  # fmt: skip


def model_conn(
    stub: ModelStub, *, secret: str = MODEL_TOKEN, options: dict[str, Any] | None = None
) -> ConnectionInfo:
    return ConnectionInfo(id=None, name="m", provider="model", base_url=stub.url + "/v1",
                          options={"model": "stub-1", **(options or {})}, secret=secret,
                          timeout_seconds=5, allow=LOCAL)  # fmt: skip


SLACK = SlackMessageProvider()
MODEL = ModelProvider()


def slack_request(channel: str = "C0OPS", text: str = "Order {{ input.id }} shipped") -> Request:
    return SLACK.prepare({"channel": channel, "text": text}, {"input": {"id": 7}}, None)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- slack_message ------------------------------------------------------------------------------


def test_slack_prepare_renders_and_lowercases_only_the_recipient():
    request = slack_request(channel="{{ 'C0OPS' }}")
    assert request.payload == {"channel": "C0OPS", "text": "Order 7 shipped"}
    assert request.recipient == "c0ops"
    assert request.summary["channel"] == "C0OPS"
    with pytest.raises(StepFailure) as empty:
        slack_request(channel="{{ '' }}")
    assert empty.value.retryable is False


def test_slack_post_then_lookup_finds_it_by_its_key_only(slack_stub):
    conn = slack_conn(slack_stub.url)
    request = slack_request()
    answer = SLACK.call(request, "run-1/notify/0", conn)
    other = SLACK.call(request, "run-1/notify/1", conn)
    assert answer.result["channel"] == "C0OPS"
    assert answer.result["ts"] != other.result["ts"]
    posted = slack_stub.messages[0]
    assert posted["text"] == "Order 7 shipped"
    assert posted["metadata"] == {
        "event_type": "waymark_effect",
        "event_payload": {"effect_key": "run-1/notify/0"},
    }
    found = SLACK.lookup(request, "run-1/notify/0", conn)
    assert found is not None
    assert found.result == {"channel": "C0OPS", "ts": answer.result["ts"], "reconciled": True}
    found_other = SLACK.lookup(request, "run-1/notify/1", conn)
    assert found_other is not None and found_other.result["ts"] == other.result["ts"]
    assert SLACK.lookup(request, "run-1/notify/2", conn) is None
    assert SLACK.lookup(slack_request(channel="C0ELSE"), "run-1/notify/0", conn) is None
    assert SLACK.can_lookup and SLACK.supports_lookup(conn)


def test_slack_lookup_pages_through_the_history_by_its_cursor(slack_stub, monkeypatch):
    monkeypatch.setattr(slack_module, "HISTORY_PAGE", 2)
    conn = slack_conn(slack_stub.url)
    request = slack_request()
    for n in range(5):
        SLACK.call(request, f"k{n}", conn)
    found = SLACK.lookup(request, "k0", conn)  # the oldest: on the third page
    assert found is not None and found.result["ts"] == slack_stub.messages[0]["ts"]
    assert SLACK.lookup(request, "missing", conn) is None  # the whole history was read
    history = slack_stub.count("GET", "/api/conversations.history") + slack_stub.count(
        "POST", "/api/conversations.history"
    )
    assert history == 3 + 3  # three pages each, through the cursor


def test_slack_lookup_never_says_absent_when_history_remains(slack_stub, monkeypatch):
    monkeypatch.setattr(slack_module, "HISTORY_PAGE", 2)
    monkeypatch.setattr(slack_module, "HISTORY_PAGES", 1)
    conn = slack_conn(slack_stub.url)
    request = slack_request()
    for n in range(3):
        SLACK.call(request, f"k{n}", conn)
    assert SLACK.lookup(request, "k2", conn) is not None  # on the first page
    with pytest.raises(Ambiguous):  # older than the pages read: cannot tell
        SLACK.lookup(request, "missing", conn)


def test_slack_revoked_or_wrong_token_is_auth_failed(slack_stub):
    SLACK.probe(slack_conn(slack_stub.url))
    with pytest.raises(AuthFailed) as wrong:
        SLACK.call(slack_request(), "k", slack_conn(slack_stub.url, secret="xoxb-wrong"))
    assert "invalid_auth" in str(wrong.value)
    slack_stub.revoke_token(TOKEN)
    with pytest.raises(AuthFailed) as revoked:
        SLACK.call(slack_request(), "k", slack_conn(slack_stub.url))
    assert "token_revoked" in str(revoked.value)
    assert revoked.value.made == "no"
    with pytest.raises(AuthFailed):
        SLACK.probe(slack_conn(slack_stub.url))
    with pytest.raises(AuthFailed):
        SLACK.lookup(slack_request(), "k", slack_conn(slack_stub.url))
    assert slack_stub.messages == []


def test_slack_429_is_rate_limited_with_retry_after_and_not_retried(slack_stub):
    slack_stub.rate_limit_next(1, retry_after=3)
    with pytest.raises(RateLimited) as limited:
        SLACK.call(slack_request(), "k", slack_conn(slack_stub.url))
    assert limited.value.retry_after == 3.0
    assert limited.value.made == "no"
    assert slack_stub.count("POST", "/api/chat.postMessage") == 1  # slack-sdk did not retry
    assert slack_stub.messages == []


def test_slack_500_is_ambiguous(slack_stub):
    slack_stub.fail_next(1, status=500)
    with pytest.raises(Ambiguous) as failed:
        SLACK.call(slack_request(), "k", slack_conn(slack_stub.url))
    assert failed.value.made == "unknown"
    assert "500" in str(failed.value)


def test_slack_malformed_answer_is_ambiguous_and_the_lookup_finds_the_post(slack_stub):
    conn = slack_conn(slack_stub.url)
    slack_stub.malformed_next(1, path_prefix="/api/chat.postMessage")
    with pytest.raises(Ambiguous):
        SLACK.call(slack_request(), "run-2/notify/0", conn)
    assert len(slack_stub.messages) == 1  # it was posted
    found = SLACK.lookup(slack_request(), "run-2/notify/0", conn)
    assert found is not None and found.result["ts"] == slack_stub.messages[0]["ts"]
    slack_stub.malformed_next(1)
    with pytest.raises(Ambiguous):  # a malformed history cannot say "absent" either
        SLACK.lookup(slack_request(), "run-2/notify/0", conn)


def test_slack_dropped_connection_is_ambiguous_and_never_resent(slack_stub):
    slack_stub.drop_next(1)
    with pytest.raises(Ambiguous):
        SLACK.call(slack_request(), "k", slack_conn(slack_stub.url))
    # slack-sdk's default retry handler would post it a second time.
    assert slack_stub.count("POST", "/api/chat.postMessage") == 1
    assert len(slack_stub.messages) == 1


def test_slack_refusals(slack_stub):
    empty_channel = Request(payload={"channel": "", "text": "x"}, summary={})
    with pytest.raises(Refused) as refused:
        SLACK.call(empty_channel, "k", slack_conn(slack_stub.url))
    assert "channel_not_found" in str(refused.value)
    assert refused.value.retryable is False


def test_slack_timeout_is_ambiguous_and_refused_connection_unreachable(slack_stub):
    slack_stub.slow(2)
    with pytest.raises(Ambiguous) as late:
        SLACK.call(slack_request(), "k", slack_conn(slack_stub.url, timeout=0.5))
    assert "in time" in str(late.value)
    with pytest.raises(Unreachable):
        SLACK.call(slack_request(), "k", slack_conn(f"http://127.0.0.1:{closed_port()}"))


def test_slack_base_url_passes_the_egress_guard(slack_stub):
    with pytest.raises(EgressDenied) as denied:
        SLACK.call(slack_request(), "k", slack_conn(slack_stub.url, allow=Allowlist()))
    assert "loopback" in str(denied.value)
    assert slack_stub.requests == []


# --- model --------------------------------------------------------------------------------------


def model_step(**extra: Any) -> dict[str, Any]:
    return {"prompt": "Summarise order {{ input.id }}", "max_tokens": 50, **extra}


def test_model_prepare_reserves_the_budget_and_picks_the_model(model_stub):
    conn = model_conn(model_stub)
    request = MODEL.prepare(model_step(budget=0.25), {"input": {"id": 7}}, conn)
    assert request.reserve == Decimal("0.25")
    assert request.payload == {
        "model": "stub-1",
        "messages": [{"role": "user", "content": "Summarise order 7"}],
        "max_tokens": 50,
    }
    assert MODEL.prepare(model_step(), {"input": {"id": 7}}, conn).reserve == 0
    chosen = MODEL.prepare(model_step(model="big-2"), {"input": {"id": 7}}, conn)
    assert chosen.payload["model"] == "big-2"
    nameless = ConnectionInfo(None, "m", "model", model_stub.url, {}, "sk", allow=LOCAL)
    with pytest.raises(StepFailure):
        MODEL.prepare(model_step(), {"input": {"id": 7}}, nameless)
    bad_price = model_conn(model_stub, options={"price_prompt_per_1k": "cheap"})
    with pytest.raises(StepFailure):
        MODEL.prepare(model_step(), {"input": {"id": 7}}, bad_price)
    assert MODEL.repeatable is True


def test_model_answer_and_cost_from_usage_and_prices(model_stub):
    model_stub.require_token("sk-valid")
    model_stub.reply, model_stub.prompt_tokens, model_stub.completion_tokens = "Done.", 1200, 300
    prices = {"price_prompt_per_1k": "0.5", "price_completion_per_1k": 1.5}
    conn = model_conn(model_stub, options=prices)
    request = MODEL.prepare(model_step(), {"input": {"id": 7}}, conn)
    answer = MODEL.call(request, "run-1/think/0", conn)
    assert answer.result == {
        "text": "Done.",
        "model": "stub-1",
        "usage": {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500},
    }
    assert answer.cost == Decimal("1.05")  # 1200 * 0.5 / 1000 + 300 * 1.5 / 1000
    sent = model_stub.requests[-1]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["authorization"] == "Bearer sk-valid"
    assert sent["body"]["max_tokens"] == 50
    free = MODEL.call(request, "run-1/think/0", model_conn(model_stub))
    assert free.cost == 0


def test_model_malformed_answers_are_ambiguous(model_stub):
    conn = model_conn(model_stub)
    request = MODEL.prepare(model_step(), {"input": {"id": 7}}, conn)
    model_stub.malformed_next(1)
    with pytest.raises(Ambiguous) as malformed:
        MODEL.call(request, "k", conn)
    assert "malformed" in str(malformed.value)
    choices = [{"message": {"content": "x"}}]
    usage = {"prompt_tokens": 1, "completion_tokens": 2}
    text, counts, _ = read_completion({"choices": choices, "usage": usage})
    assert (text, counts) == ("x", {**usage, "total_tokens": 3})
    bad_bodies: list[Any] = [
        [],
        {"usage": usage},
        {"choices": [], "usage": usage},
        {"choices": [{"message": {"content": None}}], "usage": usage},
        {"choices": choices},
        {"choices": choices, "usage": {"prompt_tokens": "1", "completion_tokens": 2}},
    ]
    for bad in bad_bodies:
        with pytest.raises(Ambiguous):
            read_completion(bad)


def test_model_401_is_auth_failed_and_429_rate_limited(model_stub):
    model_stub.require_token("sk-other")
    conn = model_conn(model_stub)
    request = MODEL.prepare(model_step(), {"input": {"id": 7}}, conn)
    with pytest.raises(AuthFailed):
        MODEL.call(request, "k", conn)
    with pytest.raises(AuthFailed):
        MODEL.probe(conn)
    MODEL.probe(model_conn(model_stub, secret="sk-other"))  # accepted (no /models: a 404)
    ok = model_conn(model_stub, secret="sk-other")
    model_stub.rate_limit_next(1, retry_after=2)
    with pytest.raises(RateLimited) as limited:
        MODEL.call(request, "k", ok)
    assert limited.value.retry_after == 2.0
    model_stub.fail_next(1, status=502)
    with pytest.raises(Ambiguous):
        MODEL.call(request, "k", ok)
    assert MODEL.call(request, "k", ok).result["text"].startswith("echo:")


def test_model_goes_through_the_egress_guard(model_stub):
    conn = model_conn(model_stub)
    request = MODEL.prepare(model_step(), {"input": {"id": 7}}, conn)
    guarded = ConnectionInfo(None, "m", "model", conn.base_url, conn.options, "sk")
    with pytest.raises(EgressDenied):
        MODEL.call(request, "k", guarded)
    assert model_stub.requests == []
    assert model_module.endpoint(conn, "models") == model_stub.url + "/v1/models"


# --- registration --------------------------------------------------------------------------------


def test_both_are_registered_and_need_a_connection():
    assert isinstance(PROVIDERS["slack_message"], SlackMessageProvider)
    assert isinstance(PROVIDERS["model"], ModelProvider)
    slack, model = registry.get("slack_message"), registry.get("model")
    assert slack is not None and model is not None
    assert slack.built and model.built
    assert slack.execute is not None and model.execute is not None
    assert slack.retry is steptypes.EFFECT_RETRY and model.retry is steptypes.MODEL_RETRY
    assert slack.outcomes is not None and set(slack.outcomes({})) == {"ok", "failed",
                                                                      "suppressed"}  # fmt: skip
    for validate, step in (
        (steptypes.validate_slack_message, {"channel": "C1", "text": "t"}),
        (steptypes.validate_model, {"prompt": "p", "max_tokens": 5}),
    ):
        report = StepReport("x")
        validate(step, report)
        assert [issue[:2] for issue in report.issues] == [("missing_field", "connection")]
        report = StepReport("x")
        validate({**step, "connection": "c"}, report)
        assert report.issues == []


class NulTsSlack(SlackStub):
    """Slack, but each post's ts carries a NUL character (a JSON escape: Python reads it)."""

    def _post(self, args: dict[str, Any]) -> Response:
        posted = super()._post(args)
        if isinstance(posted.body, dict) and posted.body.get("ok"):
            posted.body["ts"] = posted.body["ts"] + "\x00"
        return posted


def test_a_slack_answer_whose_ts_cannot_be_stored_is_malformed() -> None:
    """Kept, such a ts failed every settle of the step; it is no ts the effect can keep."""
    with NulTsSlack(valid_tokens=(TOKEN,)) as stub:
        request = Request(payload={"channel": "C1", "text": "hi"}, summary={})
        with pytest.raises(Ambiguous, match="malformed answer from Slack"):
            SlackMessageProvider().call(request, "key-1", slack_conn(stub.url))
        assert len(stub.messages) == 1  # it posted: the outcome is unknown, not refused
