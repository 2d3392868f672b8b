"""The API's content negotiation: DRF's, with one answer of its own made plain.

- A ``?format=`` no renderer of the endpoint has (``?format=xml``) is 406
  ``not_acceptable``, naming the formats it has, like an ``Accept`` it cannot satisfy (DRF
  answered 404, as if the endpoint did not exist)."""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer


class Negotiation(DefaultContentNegotiation):
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
