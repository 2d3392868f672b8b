"""The ``slack_message`` provider: one message posted with ``chat.postMessage``.

The effect key travels in the message's metadata (``event_type`` "waymark_effect",
``event_payload.effect_key``), so after an unknown outcome the message can be found again in
the channel's history (``conversations.history`` with ``include_all_metadata``): found, the
effect is settled with it; not there, it is posted again. Slack has no idempotency keys.

slack-sdk's WebClient is built with no retry handlers: its default one repeats a request
whose connection dropped, which after ``chat.postMessage`` could post the message twice.
Retries belong to the engine.

WebClient builds the calls and reads the answers, but its bytes travel through the
egress-guarded httpx client (``http.send``), not urllib (``GuardedWebClient``). urllib's
opener follows up to 10 redirects, with the Authorization header, to hosts nobody vetted,
connects to whatever a second DNS lookup answers, and takes proxies from the environment.
Through ``send`` every connection goes to the address the guard vetted, a redirect is never
followed (it fails the call with ``redirect_refused``: Slack's Web API answers its calls
itself, so a 3xx means the base URL is wrong), and no proxy is used: the bot token goes to
the vetted Slack host and nowhere else. A custom urllib opener without redirects would have
closed only the first of those three holes.

Connection: ``base_url`` (default ``https://slack.com/api/``); the secret is the bot token.
The lookup needs the ``channels:history`` (or ``groups:history``) scope, and a channel ID
(a ``#name`` cannot be read back).
"""

from __future__ import annotations

import inspect
import urllib.request
from collections.abc import Hashable, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpcore
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.web import SlackResponse

from workflows.plugins import StepFailure, render
from workflows.plugins.definitions import has_unstorable

from ..answers import retry_after_seconds, too_large, was_cut
from ..egress import EgressRefused, vet_host
from .base import (
    Ambiguous,
    Answer,
    AuthFailed,
    CallError,
    ConnectionInfo,
    Invalid,
    Provider,
    RateLimited,
    Refused,
    Request,
    Unreachable,
    url_origin,
)
from .http import EgressDenied, refuse_redirect, send

DEFAULT_BASE_URL = "https://slack.com/api/"
EVENT_TYPE = "waymark_effect"
HISTORY_PAGE = 200  # messages per conversations.history page
HISTORY_PAGES = 5  # pages read by a lookup before it gives up (it never guesses "absent")
TEXT_KEPT = 500  # characters of the text kept in the ledger's summary

AUTH_ERRORS = frozenset({
    "invalid_auth", "token_revoked", "account_inactive", "not_authed", "token_expired",
    "missing_scope", "not_allowed_token_type",
})  # fmt: skip
RATE_ERRORS = frozenset({"ratelimited", "rate_limited"})
REFUSED_ERRORS = frozenset({
    "channel_not_found", "not_in_channel", "is_archived", "msg_too_long", "no_text",
    "invalid_arguments", "invalid_blocks", "too_many_attachments", "restricted_action",
    "invalid_metadata_format", "invalid_metadata_schema", "metadata_too_large",
})  # fmt: skip


def slack_error(exc: SlackApiError) -> CallError:
    """What a Slack API error says about whether the message was posted."""
    response: SlackResponse = exc.response
    status = int(response.status_code)
    data = response.data if isinstance(response.data, dict) else {}
    error = str(data.get("error") or "")
    said = {"status": status, "error": error or None}
    if status == 429 or error in RATE_ERRORS:
        headers = {str(k).lower(): v for k, v in (response.headers or {}).items()}
        after = retry_after_seconds(
            _header(headers.get("retry-after")), _header(headers.get("date"))
        )
        return RateLimited(f"Slack rate limited the call ({status}, Retry-After {after})",
                           after, said)  # fmt: skip
    if error in AUTH_ERRORS:
        return AuthFailed(f"Slack refused the token ({error})", said)
    if error in REFUSED_ERRORS:
        return Refused(f"Slack refused the message ({error})", said)
    if status in (401, 403):
        return AuthFailed(f"Slack refused the credentials ({status} {error})", said)
    if 400 <= status < 500 and status != 408:
        return Refused(f"Slack refused the request ({status} {error})", said)
    # A 5xx, a 408, an error nobody listed, or an answer that is not JSON: it may have posted.
    return Ambiguous(f"Slack failed ({status} {error or 'no error code'}): it may have acted",
                     said)  # fmt: skip


def _header(value: Any) -> str | None:
    if isinstance(value, list | tuple):  # slack-sdk's retry layer keeps header lists
        value = value[0] if value else None
    return None if value is None else str(value)


def vet_base_url(conn: ConnectionInfo) -> str:
    """The connection's Slack API URL, once its host passes the egress guard."""
    base_url = conn.base_url or DEFAULT_BASE_URL
    parts = urlsplit(base_url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise Refused(f"the Slack base URL {base_url!r} is not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        vet_host(host, port, conn.allow, within=conn.timeout_seconds)
    except EgressRefused as exc:
        raise EgressDenied(str(exc)) from exc
    except httpcore.ConnectError as exc:
        raise Unreachable(str(exc)) from exc
    return base_url


# The one method of slack-sdk's urllib transport that touches the network; GuardedWebClient
# replaces it. Checked here so that a slack-sdk that renamed or reshaped it fails at import,
# loudly, instead of sending the token through urllib unguarded.
_TRANSPORT = "_perform_urllib_http_request_internal"
_hook = getattr(WebClient, _TRANSPORT, None)
if _hook is None or list(inspect.signature(_hook).parameters) != ["self", "url", "req"]:
    raise RuntimeError(f"this slack-sdk has no {_TRANSPORT}(url, req): cannot guard its egress")


class GuardedWebClient(WebClient):
    """slack-sdk's WebClient, its requests sent through the egress-guarded httpx client."""

    def __init__(self, conn: ConnectionInfo, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._conn = conn
        self.sending = False  # set once slack-sdk has built a request and hands it over

    def _perform_urllib_http_request_internal(
        self, url: str, req: urllib.request.Request
    ) -> dict[str, Any]:
        self.sending = True
        # httpx sets Content-Length from the body itself (slack-sdk may put an int there).
        headers = {k: v for k, v in req.header_items() if k.lower() != "content-length"}
        response = send(self._conn, req.get_method(), url, content=req.data, headers=headers)
        refuse_redirect(response, "Slack's API")
        if was_cut(response):  # half a JSON document: what it said cannot be known
            raise Ambiguous(f"{too_large('the answer from Slack')}: it may have acted",
                            {"status": response.status_code})  # fmt: skip
        # What urllib's branch returns; slack-sdk reads the JSON and raises SlackApiError.
        return {"status": response.status_code, "headers": response.headers,
                "body": response.text}  # fmt: skip


def _storable_id(value: Any) -> bool:
    """A channel or ts from Slack's answer that the effect can keep: a string, not empty,
    with nothing PostgreSQL refuses (a NUL character: kept, it failed every settle)."""
    return isinstance(value, str) and bool(value) and not has_unstorable(value)


def web_client(conn: ConnectionInfo) -> GuardedWebClient:
    return GuardedWebClient(
        # No timeout here: send() applies the connection's own.
        conn, token=conn.secret, base_url=vet_base_url(conn),
        retry_handlers=[],  # the engine owns retries: never repeat a post on a dropped line
    )  # fmt: skip


def slack_call(conn: ConnectionInfo | None, method: str, **kwargs: Any) -> SlackResponse:
    """One Web API call; every way it can fail becomes a CallError."""
    if conn is None:
        raise Refused("a slack_message step needs a connection")
    client = web_client(conn)
    try:
        response: SlackResponse = getattr(client, method)(**kwargs)
    except CallError:  # classified by the transport (http.send, refuse_redirect)
        raise
    except SlackApiError as exc:
        raise slack_error(exc) from exc
    except SlackRequestError as exc:  # refused by slack-sdk before anything was sent
        raise Invalid(f"slack-sdk refused the request: {exc}") from exc
    except Exception as exc:
        if not client.sending:  # raised while slack-sdk built the request: nothing left
            raise Invalid(f"slack-sdk could not build the {method} request "
                          f"({type(exc).__name__}: {str(exc)[:300]})") from exc  # fmt: skip
        # An answer slack-sdk could not read (a JSON list, ...): it may have posted.
        raise Ambiguous(f"unreadable answer from Slack ({type(exc).__name__}: {exc})") from exc
    if not isinstance(response.data, dict):
        raise Ambiguous("unreadable answer from Slack (not a JSON object)")
    return response


class SlackMessageProvider(Provider):
    name = "slack_message"
    can_lookup = True

    def secret_destination(self, base_url: str, options: Mapping[str, Any]) -> Hashable:
        return url_origin(base_url or DEFAULT_BASE_URL)  # the bot token goes there

    def prepare(
        self, step: Mapping[str, Any], context: Mapping[str, Any], conn: ConnectionInfo | None
    ) -> Request:
        channel = str(render(step["channel"], dict(context))).strip()
        if not channel:
            raise StepFailure("no Slack channel to post to (channel rendered empty)",
                              retryable=False)  # fmt: skip
        text = str(render(step["text"], dict(context)))
        if not text.strip():
            raise StepFailure("no text to post (text rendered empty)", retryable=False)
        return Request(
            payload={"channel": channel, "text": text},
            summary={"channel": channel, "text": text[:TEXT_KEPT]},
            recipient=channel.lower(),
        )

    def call(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer:
        metadata = {"event_type": EVENT_TYPE, "event_payload": {"effect_key": key}}
        response = slack_call(conn, "chat_postMessage", channel=request.payload["channel"],
                              text=request.payload["text"], metadata=metadata)  # fmt: skip
        channel, ts = response.get("channel"), response.get("ts")
        if not _storable_id(channel) or not _storable_id(ts):
            raise Ambiguous("malformed answer from Slack: no channel or ts", {"ok": True})
        result = {"channel": channel, "ts": ts}
        return Answer(result=result, response=result)

    def lookup(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer | None:
        channel = request.payload["channel"]
        cursor: str | None = None
        for _ in range(HISTORY_PAGES):
            page = slack_call(conn, "conversations_history", channel=channel, cursor=cursor,
                              include_all_metadata=True, limit=HISTORY_PAGE)  # fmt: skip
            messages = page.get("messages")
            if not isinstance(messages, list):
                raise Ambiguous("malformed answer from Slack: no messages in the history")
            for message in messages:
                if _effect_key(message) == key and _storable_id(message.get("ts")):
                    result = {"channel": channel, "ts": message["ts"], "reconciled": True}
                    return Answer(result=result, response=result)
            if not page.get("has_more"):
                return None  # the whole history was read: it is not there
            meta = page.get("response_metadata")
            cursor = meta.get("next_cursor") if isinstance(meta, dict) else None
            if not cursor:
                raise Ambiguous(f"Slack has more history of {channel} but gave no cursor: "
                                f"cannot tell whether effect {key} was posted")  # fmt: skip
        # Not in the newest pages, but older messages remain: cannot say it is absent.
        raise Ambiguous(
            f"the message of effect {key} is not among the newest "
            f"{HISTORY_PAGE * HISTORY_PAGES} messages of {channel}; cannot tell whether it "
            "was posted"
        )

    def probe(self, conn: ConnectionInfo) -> None:
        slack_call(conn, "auth_test")


def _effect_key(message: Any) -> str | None:
    """The effect key in a history message's metadata, if it carries one."""
    if not isinstance(message, dict):
        return None
    metadata = message.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("event_type") != EVENT_TYPE:
        return None
    payload = metadata.get("event_payload")
    found = payload.get("effect_key") if isinstance(payload, dict) else None
    return found if isinstance(found, str) else None
