"""A webhook receiver: it accepts every POST (200), records it, and, like a careful real
receiver, verifies its signature and dedupes by ``Waymark-Delivery-Id``: ``processed`` holds
each delivery once, however often it arrived. Faults (``fail_next``, ``fail_for``), ``hold``
and ``slow`` are the base stub's. ``tls`` (tests.stubs.tls) makes it an HTTPS endpoint."""

from __future__ import annotations

import json
from typing import Any

from webhooks.signing import verify

from .base import HttpStub, Request, Response


class ReceiverStub(HttpStub):
    def __init__(self, *, secret: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.secret = secret  # set it to the subscription's, to check signatures
        self.processed: dict[str, dict[str, Any]] = {}  # delivery id -> the body, once
        self.bad_signatures = 0

    def route(self, request: Request) -> Response:
        if request.method != "POST":
            return Response(405, {"error": "method_not_allowed"})
        self.gate()  # held here: arrived, not yet processed
        delivery = request.headers.get("waymark-delivery-id", "")
        with self._lock:
            if self.secret and not verify(
                self.secret, request.headers.get("waymark-signature", ""), request.raw.encode()
            ):
                self.bad_signatures += 1
                return Response(400, {"error": "bad_signature"})
            self.processed.setdefault(delivery, json.loads(request.raw))
        return Response(200, {"ok": True})

    def arrivals(self) -> list[dict[str, Any]]:
        """Every POST that reached it, in order (redeliveries too)."""
        with self._lock:
            return [r for r in self.requests if r["method"] == "POST"]
