from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows.errors import WaymarkError
from workflows.selectors import organisation_get
from workflows.services.tenancy import api_key_create


class Command(BaseCommand):
    help = "Create an API key for an organisation and print it once; only its hash is stored."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("--name", default="cli")

    def handle(self, *args: Any, org: str, name: str, **options: Any) -> None:
        try:
            organisation = organisation_get(slug=org)
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        key, raw = api_key_create(org=organisation, name=name)
        self.stderr.write(f"API key {key.prefix} for {organisation.slug}; it is not shown again:")
        self.stdout.write(raw)
