"""The ``model`` provider: one chat completion from an OpenAI-compatible endpoint.

``POST {base_url}/chat/completions`` (``base_url`` like ``https://api.example.com/v1``)
through the egress guard, with the secret as a bearer token; a redirect is refused, never
followed (``http.refuse_redirect``). A completion makes nothing
outside, so an unknown outcome is simply asked again (``repeatable``), at the cost of the
budget it reserved.

The step's ``budget`` (the most the call may cost; 0 when absent) is reserved against the
organisation's model budget before the call; the real cost is settled after, from the
answer's token usage and the connection's prices.

Connection options: ``model`` (used when the step names none), ``price_prompt_per_1k`` and
``price_completion_per_1k`` (the cost of 1000 tokens; 0 when absent).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from workflows.plugins import StepFailure, render

from ..answers import answer_json, answer_text, too_large, was_cut
from .base import Ambiguous, Answer, ConnectionInfo, Provider, Request
from .http import auth_headers, raise_for_status, refuse_redirect, send

PRICE_OPTIONS = ("price_prompt_per_1k", "price_completion_per_1k")
PROMPT_KEPT = 500  # characters of the prompt kept in the ledger's summary
MONEY = Decimal("0.000001")  # the ledger's and the budget's precision (decimal_places=6)


def endpoint(conn: ConnectionInfo | None, path: str) -> str:
    return f"{(conn.base_url if conn else '').rstrip('/')}/{path}"


def price(conn: ConnectionInfo | None, option: str) -> Decimal:
    """A price from the connection's options, per 1000 tokens (0 when absent)."""
    value = (conn.options if conn else {}).get(option)
    if value is None:
        return Decimal(0)
    try:
        if isinstance(value, bool):
            raise InvalidOperation
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        amount = Decimal(-1)
    if not amount.is_finite() or amount < 0:
        raise StepFailure(f"the connection's {option} must be a number of at least 0, "
                          f"not {value!r}", retryable=False)  # fmt: skip
    return amount


def cost(conn: ConnectionInfo | None, prompt_tokens: int, completion_tokens: int) -> Decimal:
    spent = (prompt_tokens * price(conn, "price_prompt_per_1k")
             + completion_tokens * price(conn, "price_completion_per_1k")) / 1000  # fmt: skip
    return spent.quantize(MONEY)


def _tokens(usage: Mapping[str, Any], name: str) -> int:
    value = usage.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Ambiguous(f"malformed answer from the model: usage.{name} is {value!r}")
    return value


def read_completion(body: Any) -> tuple[str, dict[str, int], str | None]:
    """The text, the token usage and the model of a completion; Ambiguous if missing."""
    if not isinstance(body, dict):
        raise Ambiguous("malformed answer from the model: not a JSON object")
    choices, usage = body.get("choices"), body.get("usage")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    text = message.get("content") if isinstance(message, dict) else None
    if not isinstance(text, str):
        raise Ambiguous("malformed answer from the model: no choices[0].message.content")
    if not isinstance(usage, dict):
        raise Ambiguous("malformed answer from the model: no usage")
    prompt, completion = _tokens(usage, "prompt_tokens"), _tokens(usage, "completion_tokens")
    counts = {"prompt_tokens": prompt, "completion_tokens": completion,
              "total_tokens": prompt + completion}  # fmt: skip
    model = body.get("model")
    return text, counts, model if isinstance(model, str) else None


class ModelProvider(Provider):
    name = "model"
    repeatable = True  # a completion makes nothing outside: an unknown outcome is asked again
    budgeted = True

    def prepare(
        self, step: Mapping[str, Any], context: Mapping[str, Any], conn: ConnectionInfo | None
    ) -> Request:
        prompt = str(render(step["prompt"], dict(context)))
        if not prompt.strip():
            raise StepFailure("the prompt rendered empty", retryable=False)
        model = step.get("model") or (conn.options.get("model") if conn else None)
        if not model or not isinstance(model, str):
            raise StepFailure("no model: name one in the step or in the connection's "
                              "'model' option", retryable=False)  # fmt: skip
        for option in PRICE_OPTIONS:
            price(conn, option)  # a bad price fails now, not after the call was paid for
        body: dict[str, Any] = {"model": model,
                                "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
        if step.get("max_tokens") is not None:
            body["max_tokens"] = int(step["max_tokens"])
        budget = step.get("budget")
        reserve = Decimal(str(budget)).quantize(MONEY) if budget is not None else Decimal(0)
        summary = {"model": model, "max_tokens": body.get("max_tokens"),
                   "prompt": prompt[:PROMPT_KEPT], "budget": str(reserve)}  # fmt: skip
        return Request(payload=body, summary=summary, reserve=reserve)

    def call(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer:
        response = send(conn, "POST", endpoint(conn, "chat/completions"),
                        json=dict(request.payload), headers=auth_headers(conn))  # fmt: skip
        refuse_redirect(response, "the model endpoint")
        raise_for_status(response, keyed=False)
        if was_cut(response):  # half a JSON document: no completion can be read from it
            raise Ambiguous(too_large("the model's answer"), {"status": response.status_code})
        try:
            body = answer_json(response)
        except ValueError as exc:  # not JSON, or none a jsonb column keeps
            raise Ambiguous(
                f"malformed answer from the model: not JSON ({answer_text(response, 200)!r})",
                {"status": response.status_code},
            ) from exc
        text, usage, model = read_completion(body)
        spent = cost(conn, usage["prompt_tokens"], usage["completion_tokens"])
        result = {"text": text, "model": model or request.payload["model"], "usage": usage}
        said = {"id": body.get("id"), "model": result["model"], "usage": usage,
                "cost": str(spent)}  # fmt: skip
        return Answer(result=result, response=said, cost=spent)

    def probe(self, conn: ConnectionInfo) -> None:
        response = send(conn, "GET", endpoint(conn, "models"), headers=auth_headers(conn))
        if response.status_code == 404:
            return  # no model list here; the credentials were not refused
        refuse_redirect(response, "the model endpoint")
        raise_for_status(response, keyed=False)
