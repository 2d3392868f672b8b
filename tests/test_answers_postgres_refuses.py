"""Outside answers that Python reads as JSON but PostgreSQL cannot keep as JSON
(effects/answers.py, ``answer_json``): ``NaN`` and ``Infinity`` (Python's json reads them, no
JSON has them), ``\\u0000`` and a lone ``\\ud800`` (a jsonb column refuses them), a document
nested a hundred thousand deep (Python's parser raises RecursionError), a number of more
digits than Python reads, and a text body with a NUL character. Stored as they were read,
each failed its step's every settle with a database error, forever, or (raising out of the
call) put a person in front of a call that had been answered. Such a
body is kept as its text, as any body that is not JSON: the step has its answer and the run
goes on. Real runs through a real worker's code path, against a provider stub on 127.0.0.1
that answers with these bytes.

A lookup by key (a connection's ``lookup_url``) answered with what is not JSON (a page, an
empty body, JSON with NaN) says neither that the effect was made nor that it was not: the
effect stays unknown.
"""

from __future__ import annotations

from typing import Any

import pytest

from effects.egress import Allowlist
from effects.models import Effect
from effects.providers.base import Ambiguous, ConnectionInfo, Request
from effects.providers.http import HttpProvider
from effects.providers.model import ModelProvider
from workflows.models import Organisation, Run, RunEvent, Step

from .effect_setup import connect, drive, one_step, start
from .stubs.base import Request as StubRequest
from .stubs.base import Response
from .stubs.provider import ProviderStub

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = 100_000
# Each answer's body, and the text the step keeps of it (the http step keeps 16,384
# characters of a body that is not JSON).
ODD = {
    "nan": (b'{"id": "x", "amount": NaN}', '{"id": "x", "amount": NaN}'),
    "infinity": (b'{"id": "x", "amount": -Infinity}', '{"id": "x", "amount": -Infinity}'),
    # A number Python reads as infinity.
    "overflow": (b'{"id": "x", "amount": -1e400}', '{"id": "x", "amount": -1e400}'),
    "nul-escape": (b'{"id": "a\\u0000b"}', '{"id": "a\\u0000b"}'),
    "surrogate": (b'{"id": "\\ud800"}', '{"id": "\\ud800"}'),
    "deep": (b"[" * DEEP + b"]" * DEEP, "[" * 16_384),
    "nul-text": (b"plain \x00 text", "plain \\x00 text"),
    # More digits than Python turns into an int (4,300 by default): ValueError, not a
    # JSONDecodeError.
    "long-number": (b'{"n": ' + b"9" * 5000 + b"}", '{"n": ' + "9" * 5000 + "}"),
}


LOCAL = Allowlist.parse(["127.0.0.1/32"])


class OddProvider(ProviderStub):
    """Answers ``/<name>`` with the bytes of ODD[name], with ``status`` (a query parameter,
    200 when absent); a lookup (``/lookup/<key>``) with the bytes set in ``lookup_answer``;
    a model's ``/v1/chat/completions`` with a completion holding NaN."""

    lookup_answer = b"[]"

    def route(self, request: StubRequest) -> Response:
        name = request.path.strip("/")
        if name in ODD:
            status = int(request.query.get("status", "200"))
            return Response(status, raw=ODD[name][0])
        if request.path.startswith("/lookup/"):
            return Response(200, raw=self.lookup_answer)
        if request.path == "/v1/chat/completions":
            raw = (b'{"id": "c1", "model": "m", "choices": [{"message": {"content": "hi"}}],'
                   b' "usage": {"prompt_tokens": NaN, "completion_tokens": 1}}')  # fmt: skip
            return Response(200, raw=raw)
        return super().route(request)


@pytest.fixture
def odd_provider() -> Any:
    with OddProvider() as stub:
        yield stub
    assert not stub.errors, stub.errors


def get(url: str) -> dict[str, Any]:
    return {"type": "http", "connection": "api", "request": {"method": "GET", "url": url}}


@pytest.mark.parametrize("name", list(ODD))
def test_an_answer_postgresql_cannot_keep_as_json_is_kept_as_its_text(
    org: Organisation, odd_provider: OddProvider, name: str
) -> None:
    connect(org, base_url=odd_provider.url)
    run_id = start(org, one_step(get(f"{odd_provider.url}/{name}"), output="done"))
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("succeeded", ""), run.error
    send = Step.objects.get(run_id=run_id, step_id="send")
    assert (send.status, send.attempt) == ("done", 1)
    assert send.output == {"status": 200, "body": ODD[name][1]}
    # One call, answered and settled: nobody is asked about a call that was answered.
    assert list(Effect.objects.filter(run_id=run_id).values_list("state", "calls")) == [
        ("settled", 1)
    ]
    assert not RunEvent.objects.filter(run_id=run_id, kind="step.retry_scheduled").exists()


def test_a_refusal_whose_body_postgresql_cannot_keep_fails_the_step_with_its_text(
    org: Organisation, odd_provider: OddProvider
) -> None:
    connect(org, base_url=odd_provider.url)
    step = get(f"{odd_provider.url}/nan?status=400")
    run_id = start(org, one_step(step, output="done"))
    drive()
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    assert "the provider refused the request (400)" in run.error
    effect = Effect.objects.get(run_id=run_id)
    assert (effect.state, effect.calls) == ("failed", 1)
    assert effect.last_response == {"status": 400, "body": ODD["nan"][1]}


def test_a_model_answer_postgresql_cannot_keep_is_malformed(odd_provider: OddProvider) -> None:
    """A completion is read from the answer's JSON: one holding NaN is none (ambiguous: the
    model may have answered), never a result that cannot be stored."""
    conn = ConnectionInfo(None, "m", "model", odd_provider.url + "/v1", {"model": "m"}, "tok",
                          allow=LOCAL)  # fmt: skip
    prompt = Request(payload={"model": "m", "messages": []}, summary={})
    with pytest.raises(Ambiguous, match="malformed answer from the model: not JSON"):
        ModelProvider().call(prompt, "key-1", conn)


# --- a lookup's answer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [b"<html>OK</html>", b"", b'[{"id": "x", "amount": NaN}]'],
    ids=["a page", "nothing", "NaN"],
)
def test_a_lookup_whose_answer_is_not_json_says_neither_found_nor_absent(
    odd_provider: OddProvider, answer: bytes
) -> None:
    """Found would settle an effect nobody made; absent would make it a second time."""
    stub = odd_provider
    stub.lookup_answer = answer
    options = {"lookup_url": stub.url + "/lookup/{key}"}
    conn = ConnectionInfo(None, "c", "http", stub.url, options, "tok", allow=LOCAL)
    request = Request(payload={"method": "POST", "url": stub.url + "/items", "headers": {},
                               "body": {"n": 1}}, summary={})  # fmt: skip
    with pytest.raises(Ambiguous, match="the lookup URL's answer is not JSON"):
        HttpProvider().lookup(request, "key-1", conn)
    stub.lookup_answer = b'{"items": []}'  # JSON that lists nothing: absent
    assert HttpProvider().lookup(request, "key-1", conn) is None
    stub.lookup_answer = b'[{"id": "x"}]'
    found = HttpProvider().lookup(request, "key-1", conn)
    assert found is not None and found.result["body"] == {"id": "x"}
