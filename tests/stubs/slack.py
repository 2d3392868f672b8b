"""A Slack Web API stub for slack-sdk's `WebClient(token=..., base_url=stub.url + "/api/")`.

Like Slack, auth and argument errors answer HTTP 200 with `{"ok": false, "error": ...}`; only
the faults (429 ratelimited, 500) use other statuses. Every method accepts GET or POST, with
arguments in the query, a form body or a JSON body (slack-sdk sends chat.postMessage as JSON
and conversations.history as a GET query).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from typing import Any

from .base import Fault, HttpStub, Request, Response

TEAM = {"team": "Stub", "team_id": "T0STUB", "user": "stub-bot", "user_id": "U0STUB"}


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true")


class SlackStub(HttpStub):
    def __init__(self, *, valid_tokens: Iterable[str] = ("xoxb-stub",)) -> None:
        super().__init__()
        self.valid_tokens = set(valid_tokens)
        self.messages: list[dict[str, Any]] = []  # every posted message, oldest first
        self.updates: list[dict[str, Any]] = []  # every chat.update, oldest first
        self.responses: list[dict[str, Any]] = []  # what was posted to a response_url
        self._next_ts = 0

    def clear(self) -> None:
        with self._lock:
            super().clear()
            self.messages.clear()
            self.updates.clear()
            self.responses.clear()

    def fail_next(self, n: int = 1, status: int = 500, path_prefix: str = "") -> None:
        super().fail_next(n, status, path_prefix)

    def fault_response(self, fault: Fault) -> Response:
        if fault.kind == "rate_limit":
            return Response(
                429,
                {"ok": False, "error": "ratelimited"},
                # Whole seconds, as Slack sends: slack-sdk's retry handler int()s the header.
                {"Retry-After": str(math.ceil(fault.retry_after))},
            )
        return Response(fault.status, {"ok": False, "error": "internal_error"})

    def response_url(self, name: str = "r1") -> str:
        """A `response_url` as Slack puts in an interaction's payload; posts to it (no token,
        as with Slack's hooks) are kept in `responses`."""
        return f"{self.url}/hooks/{name}"

    def auth_error(self, request: Request) -> Response | None:
        if request.path.startswith("/hooks/"):
            return None  # a response_url: the URL itself is the credential
        args = self._args(request)
        token = request.bearer() or args.get("token")
        with self._lock:
            if not token:
                error = "not_authed"
            elif token in self.revoked_tokens:
                error = "token_revoked"
            elif token not in self.valid_tokens:
                error = "invalid_auth"
            else:
                return None
        return Response(200, {"ok": False, "error": error})

    def route(self, request: Request) -> Response:
        method = request.path.removeprefix("/api/")
        args = self._args(request)
        if method == "auth.test":
            return Response(200, {"ok": True, "url": self.url + "/", **TEAM, "bot_id": "B0STUB"})
        if method == "chat.postMessage":
            return self._post(args)
        if method == "conversations.history":
            return self._history(args)
        if method == "chat.update":
            return self._update(args)
        if request.path.startswith("/hooks/"):
            with self._lock:
                self.responses.append({"path": request.path, "body": request.body})
            return Response(200, raw=b"ok")
        return Response(404, {"ok": False, "error": "unknown_method"})

    def _args(self, request: Request) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.query)
        if isinstance(request.body, dict):
            args.update(request.body)
        return args

    def _post(self, args: dict[str, Any]) -> Response:
        channel = args.get("channel")
        if not channel:
            return Response(200, {"ok": False, "error": "channel_not_found"})
        if not (args.get("text") or args.get("blocks") or args.get("attachments")):
            return Response(200, {"ok": False, "error": "no_text"})
        metadata = args.get("metadata")
        if isinstance(metadata, str):  # a form body carries it as a JSON string
            metadata = json.loads(metadata)
        self.gate()  # held here: arrived, not yet posted
        with self._lock:
            self._next_ts += 1
            message: dict[str, Any] = {
                "type": "message",
                "channel": channel,
                "text": args.get("text", ""),
                "ts": f"{int(time.time())}.{self._next_ts:06d}",
                "bot_id": "B0STUB",
                "user": TEAM["user_id"],
            }
            for name in ("blocks", "attachments", "thread_ts"):
                if name in args:
                    message[name] = args[name]
            if metadata is not None:
                message["metadata"] = metadata
            self.messages.append(message)
        return Response(
            200,
            {
                "ok": True,
                "channel": channel,
                "ts": message["ts"],
                "message": {k: v for k, v in message.items() if k != "channel"},
            },
        )

    def _update(self, args: dict[str, Any]) -> Response:
        """chat.update: replaces the text and blocks of the message at (channel, ts)."""
        channel, ts = args.get("channel"), args.get("ts")
        if not (args.get("text") or args.get("blocks")):
            return Response(200, {"ok": False, "error": "no_text"})
        with self._lock:
            found = next(
                (m for m in self.messages if m["channel"] == channel and m["ts"] == ts), None
            )
            if found is None:
                return Response(200, {"ok": False, "error": "message_not_found"})
            found["text"] = args.get("text", "")
            if "blocks" in args:
                found["blocks"] = args["blocks"]
            self.updates.append({"channel": channel, "ts": ts, "text": found["text"],
                                 "blocks": args.get("blocks")})  # fmt: skip
        return Response(200, {"ok": True, "channel": channel, "ts": ts, "text": found["text"]})

    def _history(self, args: dict[str, Any]) -> Response:
        channel = args.get("channel")
        with_metadata = _truthy(args.get("include_all_metadata"))
        limit = int(args.get("limit") or 100)
        # Newest first, a page at a time; the cursor (opaque to the client, as Slack's) is
        # where the next page starts.
        start = int(args.get("cursor") or 0)
        with self._lock:
            found = [m for m in reversed(self.messages) if m["channel"] == channel]
        shown = [
            {k: v for k, v in m.items() if k != "channel" and (with_metadata or k != "metadata")}
            for m in found[start : start + limit]
        ]
        more = len(found) > start + limit
        return Response(
            200,
            {
                "ok": True,
                "messages": shown,
                "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""},
            },
        )
