"""What Waymark needs of the project it runs in, said at start-up with a code rather than
as an AttributeError deep in an app's ``ready()`` or a half-migrated database
(docs/how-to/embed-in-django.md).

- ``waymark_settings_missing``: the settings objects Waymark reads, which a host imports from
  ``waymark_config.defaults``. Checked first thing in ``WorkflowsConfig.ready()``: every
  process reads them while its apps load, before any system check could run.
- ``waymark.E001`` (a system check, so ``check`` and ``migrate`` stop before the first
  migration): the default database, Waymark's, is PostgreSQL (its functions, locks and
  ``jsonb`` are the engine's); Django's SQLite default fails half-way through the
  migrations otherwise. A host's other databases are its own.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections

# The settings objects waymark_config.defaults holds (and reads from WAYMARK_* variables).
DEFAULTS_IMPORT = (
    "from waymark_config.defaults import CACHES, EFFECTS, REST_FRAMEWORK, "
    "SPECTACULAR_SETTINGS, WAYMARK, WAYMARK_WEB, WEBHOOKS"
)
READ_AT_START = ("WAYMARK", "EFFECTS", "WEBHOOKS")  # (WAYMARK_WEB: by runengine's web only)


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
    """The default database, Waymark's, is PostgreSQL (no connection is opened: the
    backend's vendor is read from its class). A host's other databases are its own."""
    if DEFAULT_DB_ALIAS not in connections or connections[DEFAULT_DB_ALIAS].vendor == "postgresql":
        return []
    engine = connections[DEFAULT_DB_ALIAS].settings_dict["ENGINE"]
    return [
        checks.Error(
            f"Waymark runs on PostgreSQL only: DATABASES['default'] is "
            f"{connections[DEFAULT_DB_ALIAS].vendor} ({engine})",
            hint="Set its ENGINE to django.db.backends.postgresql (PostgreSQL 14 or later), or "
            "waymark_config.embedded_db for a local one (docs/how-to/embed-in-django.md).",
            id="waymark.E001",
        )
    ]
