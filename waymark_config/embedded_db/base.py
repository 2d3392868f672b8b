"""Django's PostgreSQL backend, pointed at the embedded server (see ``server.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db.backends.postgresql import base

from .server import SUPERUSER, ensure_database, ensure_server


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        data_dir = Path(self.settings_dict["EMBEDDED_DATA_DIR"])
        address = ensure_server(data_dir)
        dbname = params.get("dbname") or "postgres"
        # The test runner creates its own database through the "postgres" database; the
        # application database is created here so a fresh checkout needs no manual step.
        if dbname != "postgres" and not dbname.startswith("test_"):
            ensure_database(data_dir, dbname)
        params.update(host=address.socket_dir, port=address.port, user=SUPERUSER)
        return params
