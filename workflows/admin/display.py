"""Small display helpers shared by the admin pages."""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import format_html


def pretty_json(value: Any) -> str:
    return format_html(
        '<pre style="white-space: pre-wrap">{}</pre>',
        json.dumps(value, indent=2, ensure_ascii=False),
    )
