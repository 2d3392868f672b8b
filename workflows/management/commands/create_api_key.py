from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser

from workflows.engine.clock import database_now
from workflows.errors import WaymarkError
from workflows.management.base import MAX_DAYS, MigratedCommand
from workflows.models import ApiKey
from workflows.models.tenancy import API_KEY_SCOPES
from workflows.selectors import organisation_get
from workflows.services.audit import Actor
from workflows.services.naming import check_length
from workflows.services.tenancy import api_key_create


class Command(MigratedCommand):
    help = "Create an API key for an organisation and print it once; only its hash is stored."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("--name", default="cli")
        parser.add_argument("--read-only", action="store_true", help="it can read, not change")
        parser.add_argument(
            "--scope",
            action="append",
            default=[],
            dest="scopes",
            choices=sorted(API_KEY_SCOPES),
            help="what it may do beyond reading and writing (erasure: erase a person); repeatable",
        )
        parser.add_argument(
            "--expires-in-days", type=float, default=None, help="refused after this many days"
        )

    def handle(
        self,
        *args: Any,
        org: str,
        name: str,
        read_only: bool,
        expires_in_days: float | None,
        scopes: list[str],
        **options: Any,
    ) -> None:
        if expires_in_days is not None and not 0 < expires_in_days <= MAX_DAYS:  # nan too
            raise CommandError(
                f"invalid_input: --expires-in-days must be more than 0 and at most {MAX_DAYS}"
            )
        try:
            check_length(ApiKey, "name", name, label="--name")
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        expires_at = None
        if expires_in_days is not None:
            # From the database's clock, which decides when the key has expired.
            expires_at = database_now() + timedelta(days=expires_in_days)
        try:
            organisation = organisation_get(slug=org)
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        key, raw = api_key_create(
            org=organisation, name=name, read_only=read_only, expires_at=expires_at,
            actor=Actor.command(), scopes=scopes,
        )  # fmt: skip
        self.stderr.write(f"API key {key.prefix} for {organisation.slug}; it is not shown again:")
        self.stdout.write(raw)
