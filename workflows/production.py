"""Whether this installation says it is production (``WAYMARK_PRODUCTION``): the demo and the
workflow test helper refuse to run there. Read from ``settings.WAYMARK``, which a host project
imports from waymark_config.defaults with the other settings objects, and from the top-level
``PRODUCTION`` Waymark's own project sets: a host that imported only the settings objects had
neither guard."""

from __future__ import annotations

from django.conf import settings


def in_production() -> bool:
    waymark = getattr(settings, "WAYMARK", {})
    return bool(waymark.get("PRODUCTION", False) or getattr(settings, "PRODUCTION", False))
