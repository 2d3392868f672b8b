from typing import Any

from django.core.management.base import CommandError, CommandParser

from workflows.errors import WaymarkError
from workflows.management.base import MigratedCommand
from workflows.services.tenancy import organisation_ensure


class Command(MigratedCommand):
    help = "Create an organisation (or show the existing one with that slug)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, slug: str, name: str, **options: Any) -> None:
        try:
            org = organisation_ensure(slug=slug, name=name)
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        self.stdout.write(f"organisation {org.slug} (id {org.pk})")
