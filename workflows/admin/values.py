"""JSON values as the run page shows them: pretty, small ones open, large ones folded in a
``<details>``, and none longer than ``MAX_CHARS`` (a step's output can be 64 KiB, a window
shows 200 steps: the page reads at most that much of each, in the database). Their markup
is made here, not by an included template: a window shows 400 of them, and an include
each was a good part of the page's time."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

MAX_CHARS = 10_000  # read and shown of one value at most
FOLD_CHARS = 600  # longer than this (or than FOLD_LINES lines) is folded
FOLD_LINES = 16
SUMMARY_CHARS = 70


@dataclass(frozen=True)
class Shown:
    text: str  # pretty JSON, or the raw text's first MAX_CHARS characters when cut
    summary: str  # its first characters, on one line: what a folded value shows
    folded: bool
    size: int  # characters of the whole value (as JSON text)
    cut: bool  # only the first MAX_CHARS characters are here
    key: str = ""  # what keeps it open when the page is refreshed live (data-key)

    @property
    def html(self) -> SafeString:
        if not self.folded:
            return format_html('<pre class="value">{}</pre>', self.text)
        shown = f", the first {len(self.text)} shown" if self.cut else ""
        return format_html(
            '<details class="value" data-key="{}"><summary>{} <span class="size">({} '
            "characters{})</span></summary><pre>{}{}</pre></details>",
            self.key, self.summary, self.size, shown, self.text, "\n…" if self.cut else "",
        )  # fmt: skip


def shown(value: Any, key: str = "") -> Shown | None:
    """``value`` (a JSON value in Python) as shown; None for null."""
    if value is None:
        return None
    return _shown(json.dumps(value, indent=2, ensure_ascii=False), None, key)


def shown_text(text: str | None, size: int | None, key: str = "") -> Shown | None:
    """A value read as JSON text cut to at most ``MAX_CHARS + 1`` characters by the query
    (``size``: its whole length), as shown; None for null."""
    if text is None:
        return None
    whole = size if size is not None else len(text)
    if whole > MAX_CHARS:
        return _shown(text[:MAX_CHARS], whole, key)
    try:
        pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        pretty = text
    return _shown(pretty, None, key)


def _shown(text: str, cut_from: int | None, key: str) -> Shown:
    one_line = " ".join(text.split())
    summary = one_line if len(one_line) <= SUMMARY_CHARS else one_line[: SUMMARY_CHARS - 1] + "…"
    folded = cut_from is not None or len(text) > FOLD_CHARS or text.count("\n") >= FOLD_LINES
    return Shown(text=text, summary=summary, folded=folded, size=cut_from or len(text),
                 cut=cut_from is not None, key=key)  # fmt: skip
