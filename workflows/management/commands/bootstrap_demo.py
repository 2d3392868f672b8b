import os
from typing import Any

from django.core.management.base import CommandError, CommandParser

from workflows.demo.bootstrap import bootstrap_demo
from workflows.errors import WaymarkError
from workflows.management.base import MigratedCommand


class Command(MigratedCommand):
    help = "Create (or refresh) the demo organisation, admin user, API key and automation."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--admin-user", default="admin")

    def handle(self, *args: Any, admin_user: str, **options: Any) -> None:
        try:
            demo = bootstrap_demo(
                admin_user=admin_user, admin_password=os.environ.get("WAYMARK_ADMIN_PASSWORD")
            )
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        # Secrets are printed once, when they are made; afterwards, where they are kept.
        kept = f"(kept in {demo.credentials_file})"
        password = demo.admin_password or (
            f"unchanged {kept}" if demo.password_kept
            else "unchanged (the user existed already: its own password)"
        )  # fmt: skip
        api_key = demo.api_key or f"unchanged {kept}"
        host = os.environ.get("WAYMARK_HOST", "127.0.0.1")
        port = os.environ.get("WAYMARK_PORT", "8000")
        self.stdout.write(
            "\n".join(
                [
                    "Waymark demo data is set up",
                    f"  admin:      http://{host}:{port}/admin/",
                    f"  user:       {demo.admin_user}",
                    f"  password:   {password}",
                    f"  API:        http://{host}:{port}/api/v1/  (schema: /api/v1/schema/)",
                    f"  API key:    {api_key}",
                    f"  automation: {demo.version.automation.slug} v{demo.version.number}",
                    "",
                ]
            )
        )
