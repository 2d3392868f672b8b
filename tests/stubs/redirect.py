"""Two stubs for redirect tests: an API that answers every call with a redirect, and the
place it sends the client to, which records whatever reaches it (the credentials a client
carried along, above all)."""

from __future__ import annotations

from typing import Any

from .base import HttpStub, Request, Response


class _Recorded(HttpStub):
    def saw(self, secret: str) -> bool:
        """Whether ``secret`` reached this server anywhere in a request."""
        with self._lock:
            return any(secret in repr(seen) for seen in self.requests)


class RedirectingStub(_Recorded):
    """Answers every request with ``status`` and ``Location: {location}{path}`` (the same
    path at the other place, as a moved API would)."""

    def __init__(self, location: str, *, status: int = 302) -> None:
        super().__init__()
        self.location = location.rstrip("/")
        self.status = status

    def route(self, request: Request) -> Response:
        target = f"{self.location}{request.path}"
        return Response(self.status, {"moved_to": target}, headers={"Location": target})


class RecordingStub(_Recorded):
    """Answers every request 200 with ``answer`` (set it to what the real API would have
    said, so a client that followed the redirect would believe it succeeded)."""

    def __init__(self, answer: Any = None, *, host: str = "127.0.0.1") -> None:
        super().__init__(host=host)
        self.answer = answer

    def route(self, request: Request) -> Response:
        return Response(200, self.answer)
