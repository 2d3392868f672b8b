"""An outside provider's JSON API: creates items (optionally honouring Idempotency-Key, like
Stripe), looks them up by key, upserts contacts by external id, and echoes anything under
/echo for the generic http step."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from .base import HttpStub, Request, Response


class ProviderStub(HttpStub):
    def __init__(
        self, *, idempotent: bool = False, lookup: bool = False, token: str | None = None
    ) -> None:
        super().__init__(token=token)
        self.idempotent = idempotent
        self.lookup = lookup
        self.created: list[dict[str, Any]] = []  # every item ever created, in order
        self.contacts: dict[str, dict[str, Any]] = {}  # external id -> current contact
        self._completed: dict[str, dict[str, Any]] = {}  # idempotency key -> its item
        self._in_progress: set[str] = set()
        self._next_id = 0

    def clear(self) -> None:
        with self._lock:
            super().clear()
            self.created.clear()
            self.contacts.clear()
            self._completed.clear()

    def route(self, request: Request) -> Response:
        method, path = request.method, request.path
        if path in ("/items", "/charges") and method == "POST":  # (/charges: the docs' example)
            return self._create(request)
        if path == "/items" and method == "GET":
            return self._find(request)
        if path == "/orders" and method == "POST":
            # Creates, then sends the client on to a place it cannot reach (303 See Other).
            self._create(request)
            return Response(303, {"see": "elsewhere"},
                            headers={"Location": "http://127.0.0.2:9/order-status"})  # fmt: skip
        if path.startswith("/contacts/") and method == "PUT":
            # A real server decodes the path: the external id "a@b" arrives as "a%40b".
            return self._upsert(unquote(path.removeprefix("/contacts/")), request.body)
        if path == "/echo" or path.startswith("/echo/"):
            return Response(
                200,
                {
                    "method": method,
                    "path": path,
                    "query": request.query,
                    "headers": request.headers,
                    "body": request.body,
                },
            )
        return Response(404, {"error": "not_found"})

    def _create(self, request: Request) -> Response:
        key = request.headers.get("idempotency-key")
        honoured = key if self.idempotent else None
        if honoured is not None:
            with self._lock:
                if honoured in self._completed:
                    return Response(200, self._completed[honoured])
                if honoured in self._in_progress:
                    return Response(409, {"error": "key_in_use"})
                self._in_progress.add(honoured)
        try:
            # Held here: arrived, not yet created. A released request creates its item even
            # when its client has gone, as a real provider would.
            self.gate()
            with self._lock:
                self._next_id += 1
                item = {"id": f"item_{self._next_id}", "key": key, "body": request.body}
                self.created.append(item)
                if honoured is not None:
                    self._completed[honoured] = item
        finally:
            if honoured is not None:
                with self._lock:
                    self._in_progress.discard(honoured)
        return Response(201, item)

    def _find(self, request: Request) -> Response:
        if not self.lookup:
            return Response(404, {"error": "no_lookup"})
        key = request.query.get("key")
        with self._lock:
            items = [item for item in self.created if key is None or item["key"] == key]
        return Response(200, {"items": items})

    def _upsert(self, external_id: str, body: Any) -> Response:
        self.gate()
        with self._lock:
            created = external_id not in self.contacts
            self.contacts[external_id] = body
        return Response(
            201 if created else 200, {"id": external_id, "created": created, "body": body}
        )
