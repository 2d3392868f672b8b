"""The API's JSON renderer: DRF's, which writes UTF-8 text as it is, except for a text UTF-8
cannot carry. A request may send a lone surrogate (``"\\ud800"``, valid JSON) in a key or a
value the error then repeats (an unknown field's name, a choice refused): DRF's renderer
raised UnicodeEncodeError on it, a 500 instead of the 400 that names it. Such an answer is
written with every non-ASCII character escaped instead, which any JSON reader takes back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import renderers


class JSONRenderer(renderers.JSONRenderer):
    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            return _ESCAPING.render(data, accepted_media_type, renderer_context)


class _AsciiJSONRenderer(renderers.JSONRenderer):
    ensure_ascii = True


_ESCAPING = _AsciiJSONRenderer()
