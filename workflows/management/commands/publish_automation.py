import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows.errors import InvalidDefinitionError, WaymarkError
from workflows.selectors import organisation_get
from workflows.services.automations import automation_publish_definition


class Command(BaseCommand):
    help = "Publish a definition file as the next version of an automation (created if needed)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("--slug", required=True, help="automation slug")
        parser.add_argument("--file", required=True, type=Path, help="definition JSON file")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, org: str, slug: str, file: Path, name: str, **opts: Any) -> None:
        try:
            definition = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"unreadable_definition: {file}: {exc}") from exc
        try:
            version = automation_publish_definition(
                org=organisation_get(slug=org), slug=slug, definition=definition, name=name
            )
        except InvalidDefinitionError as exc:
            lines = [f"  {i['code']}: {i['message']}" for i in exc.issues]
            raise CommandError("invalid_definition:\n" + "\n".join(lines)) from exc
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        self.stdout.write(f"{slug} v{version.number} published ({version.digest[:12]})")
