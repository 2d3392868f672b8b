"""An OpenAI-compatible chat completions endpoint with configurable reply and token usage."""

from __future__ import annotations

from typing import Any

from .base import HttpStub, Request, Response


def _text(content: Any) -> str:
    """A message's text: a plain string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


class ModelStub(HttpStub):
    """`reply` None answers a deterministic echo of the last message; `prompt_tokens` None
    counts the words of all prompt messages. All three are attributes a test may change."""

    def __init__(
        self,
        *,
        token: str | None = None,
        reply: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int = 7,
    ) -> None:
        super().__init__(token=token)
        self.reply = reply
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self._next_id = 0

    def route(self, request: Request) -> Response:
        if (request.method, request.path) != ("POST", "/v1/chat/completions"):
            return Response(404, {"error": {"message": "not found", "type": "invalid_request"}})
        body = request.body
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            return Response(
                400, {"error": {"message": "messages is required", "type": "invalid_request"}}
            )
        texts = [_text(m.get("content")) if isinstance(m, dict) else "" for m in messages]
        self.gate()
        with self._lock:
            self._next_id += 1
            n = self._next_id
            reply = self.reply if self.reply is not None else f"echo: {texts[-1]}"
            prompt = self.prompt_tokens
            if prompt is None:
                prompt = sum(len(text.split()) for text in texts)
            completion = self.completion_tokens
        return Response(
            200,
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            },
        )
