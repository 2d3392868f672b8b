"""What Waymark needs of the project it runs in, said at start-up with a code rather than
as an AttributeError deep in an app's ``ready()`` or a half-migrated database
(docs/how-to/embed-in-django.md).

- ``waymark_settings_missing``: the settings objects Waymark reads, which a host imports from
  ``waymark_config.defaults``. Checked first thing in ``WorkflowsConfig.ready()``: every
  process reads them while its apps load, before any system check could run.
- ``waymark.E001`` (a system check, so ``check`` and ``migrate`` stop before the first
  migration): every database is PostgreSQL (its functions, locks and ``jsonb`` are the
  engine's); Django's SQLite default fails half-way through the migrations otherwise.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

# The settings objects waymark_config.defaults holds (and reads from WAYMARK_* variables).
DEFAULTS_IMPORT = (
    "from waymark_config.defaults import CACHES, EFFECTS, REST_FRAMEWORK, "
    "SPECTACULAR_SETTINGS, WAYMARK, WAYMARK_WEB, WEBHOOKS"
)
READ_AT_START = ("WAYMARK", "EFFECTS", "WEBHOOKS", "WAYMARK_WEB")


def require_waymark_settings() -> None:
    """ImproperlyConfigured (``waymark_settings_missing``) naming what the settings lack."""
    missing = [name for name in READ_AT_START if not hasattr(settings, name)]
    if missing:
        raise ImproperlyConfigured(
            f"waymark_settings_missing: the settings have no {', '.join(missing)}; add "
            f"`{DEFAULTS_IMPORT}` to the project's settings (docs/how-to/embed-in-django.md)"
        )


@checks.register()
def postgresql_only(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every configured database is PostgreSQL (no connection is opened: the backend's
    vendor is read from its class)."""
    return [
        checks.Error(
            f"Waymark runs on PostgreSQL only: DATABASES[{alias!r}] is "
            f"{connections[alias].vendor} ({connections[alias].settings_dict['ENGINE']})",
            hint="Set its ENGINE to django.db.backends.postgresql (PostgreSQL 14 or later), or "
            "waymark_config.embedded_db for a local one (docs/how-to/embed-in-django.md).",
            id="waymark.E001",
        )
        for alias in connections
        if connections[alias].vendor != "postgresql"
    ]
