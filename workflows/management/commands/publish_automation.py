from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from workflows.errors import InvalidDefinitionError, WaymarkError
from workflows.management.base import MigratedCommand, read_json_file
from workflows.selectors import organisation_get
from workflows.services.audit import Actor
from workflows.services.automations import automation_publish_definition


class Command(MigratedCommand):
    help = "Publish a definition file as the next version of an automation (created if needed)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("--slug", required=True, help="automation slug")
        parser.add_argument("--file", required=True, type=Path, help="definition JSON file")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, org: str, slug: str, file: Path, name: str, **opts: Any) -> None:
        content = read_json_file(file, "unreadable_definition")
        definition = _definition_in(content, file)
        try:
            version = automation_publish_definition(
                org=organisation_get(slug=org), slug=slug, definition=definition, name=name,
                actor=Actor.command(),
            )  # fmt: skip
        except InvalidDefinitionError as exc:
            lines = [f"  {i['code']}: {i['message']}" for i in exc.issues]
            raise CommandError("invalid_definition:\n" + "\n".join(lines)) from exc
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        self.stdout.write(f"{slug} v{version.number} published ({version.digest[:12]})")


def _definition_in(content: Any, file: Path) -> dict[str, Any]:
    """The definition a file holds: bare (``{"start": …, "steps": […]}``), or wrapped as the
    API's request body (``{"definition": {…}}``), so one file serves both."""
    if isinstance(content, dict) and "definition" in content:
        if set(content) == {"definition"} and isinstance(content["definition"], dict):
            return content["definition"]
    elif isinstance(content, dict):
        return content
    raise CommandError(
        f"not_a_definition: {file} must hold a definition object "
        '({"start": ..., "steps": [...]}) or the API\'s body {"definition": {...}}, nothing else'
    )
