from typing import Any

from django.core.management.base import CommandError, CommandParser

from workflows.errors import WaymarkError
from workflows.management.base import MigratedCommand
from workflows.selectors import organisation_get
from workflows.services.audit import Actor
from workflows.services.erasure import erase_person, subject_of


class Command(MigratedCommand):
    help = (
        "Erase a person (by --email, --phone or --identifier) from one organisation: their "
        "live runs cancelled, their values removed from every stored row, a tombstone kept. "
        "Without --yes it only says what would change."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organisation slug")
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--email")
        who.add_argument("--phone")
        who.add_argument("--identifier", help="a value of an identifier the definitions declare")
        parser.add_argument("--yes", action="store_true", help="erase (else: a dry run)")

    def handle(self, *args: Any, org: str, yes: bool, **options: Any) -> None:
        try:
            subject = subject_of(email=options["email"], phone=options["phone"],
                                 identifier=options["identifier"])  # fmt: skip
            outcome = erase_person(org=organisation_get(slug=org), subject=subject,
                                   actor=Actor.command(), dry_run=not yes)  # fmt: skip
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        done = outcome.as_json()
        verb = "would be" if outcome.dry_run else "were"
        self.stdout.write(
            f"{len(outcome.runs_cancelled)} run(s) {verb} cancelled, "
            f"{len(outcome.runs_finishing)} left to finish without the data, "
            f"{len(outcome.runs_scrubbed)} scrubbed; {done['rows_changed']} row(s) changed"
        )
        for column, n in done["counts"].items():
            self.stdout.write(f"  {column}: {n}")
        if outcome.dry_run:
            self.stdout.write("dry run: nothing was changed; add --yes to erase")
        else:
            self.stdout.write(f"erasure {done['id']} recorded (the tombstone keeps no value)")
