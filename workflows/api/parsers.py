"""JSON parsing that turns every malformed body into a 400, never a 500."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class SafeJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            # json raises RecursionError, not ValueError, for very deep nesting.
            raise ParseError("JSON parse error - the document nests too deeply") from exc
