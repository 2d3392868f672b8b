"""The ``http`` provider: any method, templated URL, headers and body, through the egress
guard. The effect key goes out as an ``Idempotency-Key`` header.

Connection options (all optional; a step without a connection calls a public URL with no
credentials and no idempotency):
- ``idempotency_keys`` (bool): the endpoint honours Idempotency-Key, so a repeat with the
  same key is safe; ``key_retention_seconds``: for how long it remembers a key;
- ``lookup_url``: a URL with ``{key}`` that answers 200 with the effect made under the key
  (a non-empty JSON object, list, or ``{"items": [...]}``) or 404 / an empty list;
- ``auth_header`` (default ``Authorization``) and ``auth_scheme`` (default ``Bearer``) for
  the secret, which goes only to ``base_url``'s origin (``auth_headers``): a step's URL, a
  ``lookup_url`` or a ``health_url`` elsewhere is called without it.

Redirects are never followed by an effect call (``send``): the request already acted, and a
hop would carry the connection's credentials (a custom ``auth_header`` too, which httpx keeps
across origins) to a host nobody vetted for them. The generic ``http`` step returns a 3xx as
its answer; the API providers built on ``send`` (model, crm_upsert, Slack) refuse it
(``refuse_redirect``).

A request that cannot be sent as rendered (a header value that is not ASCII or has a line
break, a URL that is not one) fails the step in ``prepare`` with ``invalid_request``, before
the ledger claims anything; what only the call builds (the connection's credential header) is
built inside ``before_sending``, so it fails the same way and never counts as "it may have
left".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from workflows.plugins import StepFailure, render
from workflows.plugins.definitions import as_stored

from ..answers import (
    ANSWER_TOO_LARGE,
    answer_json,
    answer_text,
    read_capped,
    retry_after_of,
    too_large,
    was_cut,
)
from ..answers import (
    retry_after_seconds as retry_after_seconds,  # the one parser, where callers knew it
)
from ..egress import Allowlist, CallDeadline, EgressRefused, egress_client
from .base import (
    INVALID_REQUEST,
    Ambiguous,
    Answer,
    AuthFailed,
    CallError,
    ConnectionInfo,
    Invalid,
    KeyInUse,
    Provider,
    RateLimited,
    Refused,
    Request,
    Unreachable,
    before_sending,
)

MAX_BODY_KEPT = 16_384  # characters of a provider's answer kept in the ledger
# What httpx (and HTTP/1.1) can put in a header value: visible ASCII, space and tab. httpx
# encodes values as ASCII, and h11 refuses line breaks and other control characters.
_HEADER_VALUE_RE = re.compile(r"[\t\x20-\x7e]*")


def invalid_input(message: str) -> StepFailure:
    """The step's rendered input can never be sent: a permanent failure, code first."""
    return StepFailure(f"{INVALID_REQUEST}: {message}", retryable=False,
                       error_class=INVALID_REQUEST)  # fmt: skip


def check_url(url: str) -> None:
    """Raise invalid_input unless ``url`` is an http(s) URL with a host that httpx accepts
    (``http://0177.0.0.1/`` is not one: an octal-looking address httpx refuses to guess)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise invalid_input(f"the URL is not valid ({exc})") from None
    if parsed.scheme not in ("http", "https"):
        raise invalid_input(f"the URL must start with http:// or https://, not {url[:100]!r}")
    if not parsed.host:
        raise invalid_input(f"the URL has no host: {url[:100]!r}")


def check_headers(headers: Mapping[str, str]) -> None:
    """Raise invalid_input when a header value cannot be sent. The message names the header,
    never its value (a header may carry a credential)."""
    for name, value in headers.items():
        if not value.isascii():
            raise invalid_input(
                f"header {name} has a non-ASCII value (HTTP header values are ASCII: "
                "percent-encode it or send it in the body)"
            )
        if not _HEADER_VALUE_RE.fullmatch(value):
            raise invalid_input(f"header {name} has a line break or control character in "
                                "its value")  # fmt: skip


def response_body(response: httpx.Response) -> Any:
    """The answer's JSON, or its text (cut) when it is not JSON a jsonb column keeps
    (answers.answer_json); None when its body was over the cap (``summary`` says so: half a
    JSON document is no answer)."""
    if was_cut(response):
        return None
    try:
        return answer_json(response)
    except ValueError:  # (a JSONDecodeError and a UnicodeDecodeError are ValueErrors)
        return answer_text(response, MAX_BODY_KEPT)


def summary(response: httpx.Response) -> dict[str, Any]:
    """What the answer said, as the ledger keeps it. A body over the cap is not kept:
    ``body`` is None and ``body_error`` says why, with its stable code."""
    said = {"status": response.status_code, "body": response_body(response)}
    if was_cut(response):
        said["body_error"] = {"code": ANSWER_TOO_LARGE, "detail": too_large()}
    return said


def raise_for_status(response: httpx.Response, *, keyed: bool) -> None:
    """Classify a non-2xx answer: what it says about whether anything was made."""
    status, said = response.status_code, summary(response)
    if status < 400:
        # 2xx, and 3xx too: redirects are not followed for effects (the request acted; a
        # failure on a later hop would say nothing about whether it did).
        return
    if status in (401, 403):
        raise AuthFailed(f"the provider refused the credentials ({status})", said)
    if status == 429:
        after = retry_after_of(response)
        raise RateLimited(f"rate limited (429, Retry-After {after})", after, said)
    if status == 409 and keyed:
        raise KeyInUse("the provider is still working on a request with this key (409)", said)
    if status == 408 or status >= 500:
        raise Ambiguous(f"the provider failed ({status}): it may have acted", said)
    raise Refused(f"the provider refused the request ({status})", said)


def transport_error(exc: httpx.HTTPError) -> CallError:
    """A transport failure: never sent (nothing made) or cut off mid-way (unknown)."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return Unreachable(f"could not connect: {exc}")
    if isinstance(exc, httpx.LocalProtocolError | httpx.UnsupportedProtocol):
        # Refused on our side before anything was sent (a header h11 will not write, a URL
        # scheme httpx cannot speak): sending it again fails the same way.
        # Its message may quote a header value: name the kind only.
        return Invalid(f"the request could not be sent ({type(exc).__name__})")
    if isinstance(exc, httpx.TimeoutException):
        return Ambiguous(f"no answer in time ({type(exc).__name__}): it may have acted")
    return Ambiguous(f"{type(exc).__name__}: {exc}")


class EgressDenied(Refused):
    """The egress guard refused the address before a byte left: nothing was made. The message
    starts with the stable code ``egress_refused``, as an unsendable request's starts with
    ``invalid_request``, so the step's error names the kind and not only the history."""

    error_class = "egress_refused"

    def __init__(self, message: str, response: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{self.error_class}: {message}", response)


class Redirected(Refused):
    """An API that answers its calls itself answered with a redirect: not followed (its
    credentials stay with the host that was vetted for them), and no answer to the call.
    Nothing was made there; the connection's base URL needs fixing."""

    error_class = "redirect_refused"


def refuse_redirect(response: httpx.Response, what: str) -> None:
    """Raise Redirected when ``response`` is a 3xx."""
    if 300 <= response.status_code < 400:
        target = httpx.URL(response.headers.get("location", "")).host or "the same host"
        raise Redirected(
            f"redirect_refused: {what} answered {response.status_code}, a redirect to "
            f"{target}; redirects are never followed with the connection's credentials "
            "(set the connection's base URL to where the API answers)",
            {"status": response.status_code},
        )


def client(
    conn: ConnectionInfo | None, timeout: float, deadline: CallDeadline | None = None
) -> httpx.Client:
    allow = conn.allow if conn else Allowlist()
    return egress_client(allow=allow, timeout=timeout, deadline=deadline)


def send(conn: ConnectionInfo | None, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One request through the egress guard, with the connection's timeout, never following
    a redirect; a request that cannot be built is Invalid (nothing left), transport failures
    become the CallErrors that say whether it may have. The answer's body is read streamed
    and capped (``answers.read_capped``: ``was_cut`` says when it went on past the cap)."""
    timeout = conn.timeout_seconds if conn else 30.0
    deadline = CallDeadline(timeout)  # the timeout bounds the whole call, not each read
    try:
        with client(conn, timeout, deadline) as http:
            with before_sending(f"the {method} request"):
                request = http.build_request(method, url, **_json_as_bytes(kwargs))
            return read_capped(http.send(request, follow_redirects=False, stream=True))
    except EgressRefused as exc:
        raise EgressDenied(str(exc)) from exc
    except httpx.HTTPError as exc:
        # A connect that failed sent nothing, whenever it failed (a name that did not resolve
        # within the call's time included); past the connect, the deadline may have cut it.
        if deadline.passed and not isinstance(exc, httpx.ConnectError):
            raise Ambiguous(f"no answer in time (within {timeout:g} s): it may have acted") from exc
        raise transport_error(exc) from exc
    finally:
        deadline.close()


def _json_as_bytes(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A ``json`` body as the bytes every send of it makes: the value as the database keeps
    it (``as_stored``), its keys sorted, compact, UTF-8 (as httpx writes JSON otherwise).
    The same value may reach two sends of one effect in two forms: a step taken straight
    from its settle reads the run's values as the walk holds them (a code run's call as its
    code wrote it: its key order, a tuple, a float 1e16), a later attempt as the database
    gives them back (jsonb's order, a list, the integer 10000000000000000). A provider that
    fingerprints a key's request refuses a second send whose bytes differ. A Content-Type
    the step sets stays."""
    if "json" not in kwargs:
        return kwargs
    body = kwargs.pop("json")
    headers = httpx.Headers(kwargs.get("headers") or {})
    headers.setdefault("Content-Type", "application/json")
    text = json.dumps(as_stored(body), ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False, sort_keys=True)  # fmt: skip
    return {**kwargs, "headers": headers, "content": text.encode("utf-8")}


def auth_headers(conn: ConnectionInfo | None, url: str | None = None) -> dict[str, str]:
    """The connection's credentials, for its own origin only: a URL built from run data that
    points elsewhere gets none (``url`` None: a URL the provider built from base_url)."""
    if conn is None or not conn.secret:
        return {}
    if url is not None and not same_origin(url, conn.base_url):
        return {}
    name = str(conn.options.get("auth_header", "Authorization"))
    scheme = str(conn.options.get("auth_scheme", "Bearer"))
    return {name: f"{scheme} {conn.secret}".strip()}


def same_origin(url: str, base_url: str) -> bool:
    if not base_url:
        return False
    a, b = httpx.URL(url), httpx.URL(base_url)
    return (a.scheme, a.host, a.port) == (b.scheme, b.host, b.port)


class HttpProvider(Provider):
    name = "http"
    needs_connection = False

    def prepare(
        self, step: Mapping[str, Any], context: Mapping[str, Any], conn: ConnectionInfo | None
    ) -> Request:
        spec = step["request"]
        method = spec.get("method", "POST")
        url = str(render(spec["url"], dict(context)))
        rendered = render(spec.get("headers", {}), dict(context))
        headers = {str(k): str(v) for k, v in dict(rendered).items()}  # type: ignore[call-overload]
        check_url(url)
        check_headers(headers)
        body = render(spec["body"], dict(context)) if "body" in spec else None
        payload = {"method": method, "url": url, "headers": headers, "body": body}
        # The summary keeps what was asked, minus header values that may carry secrets.
        shown = {"method": method, "url": url, "headers": sorted(headers), "body": body}
        return Request(payload=payload, summary=shown)

    def call(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer:
        p = request.payload
        # The effect key, unless the step sends a key of its own (its provider's format).
        headers = {"Idempotency-Key": key, **p["headers"], **auth_headers(conn, p["url"])}
        body = p["body"]
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            kwargs["json"] = body
        response = send(conn, p["method"], p["url"], **kwargs)
        raise_for_status(response, keyed=self.supports_key(conn))
        said = summary(response)
        return Answer(result=said, response=said)

    def lookup(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer | None:
        template = str((conn.options if conn else {}).get("lookup_url", ""))
        url = template.replace("{key}", quote(key, safe=""))
        # Credentials only where base_url is: a lookup URL elsewhere is asked without them.
        response = send(conn, "GET", url, headers=auth_headers(conn, url))
        if response.status_code == 404:
            return None
        refuse_redirect(response, "the lookup URL")  # a 3xx is no record of the effect
        raise_for_status(response, keyed=False)
        if was_cut(response):  # what it lists cannot be read: never taken as "absent"
            raise Ambiguous(too_large("the lookup URL's answer"), {"status": response.status_code})
        try:
            body = answer_json(response)
        except ValueError:
            # Neither "found" (a page saying OK is no record of the effect) nor "absent" (an
            # empty body would have it made again): the effect stays unknown.
            raise Ambiguous(
                f"the lookup URL's answer is not JSON: {answer_text(response, 200)!r}",
                {"status": response.status_code},
            ) from None
        found = body.get("items", body) if isinstance(body, dict) else body
        if isinstance(found, list):
            found = found[0] if found else None
        if not found:
            return None
        return Answer(result={"status": 200, "body": found, "reconciled": True})

    def probe(self, conn: ConnectionInfo) -> None:
        url = str(conn.options.get("health_url") or conn.base_url)
        if not url:
            return
        raise_for_status(send(conn, "GET", url, headers=auth_headers(conn, url)), keyed=False)

    def supports_key(self, conn: ConnectionInfo | None) -> bool:
        return bool(conn and conn.options.get("idempotency_keys"))

    def supports_lookup(self, conn: ConnectionInfo | None) -> bool:
        return bool(conn and conn.options.get("lookup_url"))

    def retention(self, conn: ConnectionInfo | None) -> float | None:
        seconds = conn.options.get("key_retention_seconds") if conn else None
        return float(seconds) if seconds is not None else 86_400.0
