from typing import Any

from django.core.management.base import CommandError, CommandParser

from workflows.errors import WaymarkError
from workflows.management.base import MigratedCommand
from workflows.services.audit import Actor
from workflows.services.tenancy import api_key_revoke


class Command(MigratedCommand):
    help = "Revoke an API key by its public prefix (the part after wmk_)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix")

    def handle(self, *args: Any, prefix: str, **options: Any) -> None:
        try:
            key = api_key_revoke(prefix=prefix, actor=Actor.command())
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        self.stdout.write(f"revoked {key.prefix} at {key.revoked_at:%Y-%m-%d %H:%M:%S}Z")
