import os
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from workflows.demo.bootstrap import bootstrap_demo


class Command(BaseCommand):
    help = "Create (or refresh) the demo organisation, admin user, API key and automation."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--admin-user", default="admin")

    def handle(self, *args: Any, admin_user: str, **options: Any) -> None:
        demo = bootstrap_demo(
            admin_user=admin_user, admin_password=os.environ.get("WAYMARK_ADMIN_PASSWORD")
        )
        host = os.environ.get("WAYMARK_HOST", "127.0.0.1")
        port = os.environ.get("WAYMARK_PORT", "8000")
        self.stdout.write(
            "\n".join(
                [
                    "Waymark demo is ready",
                    f"  admin:      http://{host}:{port}/admin/",
                    f"  user:       {demo.admin_user}",
                    f"  password:   {demo.admin_password}",
                    f"  API:        http://{host}:{port}/api/v1/  (schema: /api/v1/schema/)",
                    f"  API key:    {demo.api_key}",
                    f"  automation: {demo.version.automation.slug} v{demo.version.number}",
                    "",
                ]
            )
        )
