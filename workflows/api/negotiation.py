"""The API's content negotiation: DRF's, with two answers of its own made plain.

- An ``Accept`` header that names no media range at all (sent empty, or only commas) is
  read as no header, which means any media type (RFC 9110, 12.5.1): JSON. DRF read it as
  accepting nothing, a 406.
- A ``?format=`` no renderer of the endpoint has (``?format=xml``) is 406
  ``not_acceptable``, naming the formats it has, like an ``Accept`` it cannot satisfy (DRF
  answered 404, as if the endpoint did not exist)."""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request


class Negotiation(DefaultContentNegotiation):
    def get_accept_list(self, request: Request) -> list[str]:
        tokens: list[str] = super().get_accept_list(request)
        if not tokens and not request.headers.get("accept", "").replace(",", "").strip():
            return ["*/*"]
        return tokens

    def filter_renderers(
        self, renderers: Iterable[BaseRenderer], format: str
    ) -> list[BaseRenderer]:
        renderers = list(renderers)
        chosen = [renderer for renderer in renderers if renderer.format == format]
        if not chosen:
            formats = ", ".join(sorted({str(renderer.format) for renderer in renderers}))
            raise NotAcceptable(
                detail=f'Format "{format}" is not one this endpoint answers in ({formats}).',
                available_renderers=renderers,
            )
        return chosen
