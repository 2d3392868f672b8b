from typing import Any

from django.core.management.base import CommandError, CommandParser

from workflows.errors import WaymarkError
from workflows.management.base import MigratedCommand
from workflows.selectors import organisation_get
from workflows.services.audit import Actor
from workflows.services.control import ACTIONS, run_act, runs_act_bulk
from workflows.states import RunStatus


class Command(MigratedCommand):
    help = (
        "Cancel, pause, resume or retry runs: one (--run ID) or every run a filter matches "
        "(--status / --automation), counted first unless --yes is given."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS)
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("--run", type=int, help="one run id")
        parser.add_argument("--status", choices=RunStatus.values, help="filter: run status")
        parser.add_argument("--automation", help="filter: automation slug")
        parser.add_argument("--yes", action="store_true", help="act on the filter's runs")

    def handle(self, *args: Any, action: str, org: str, **options: Any) -> None:
        actor = Actor.command()
        try:
            organisation = organisation_get(slug=org)
            if options["run"] is not None:
                outcome = run_act(
                    org=organisation, run_id=options["run"], action=action, actor=actor
                )
                self.stdout.write(
                    f"run {outcome.run_id}: {outcome.status} ({outcome.steps} step(s) changed)"
                )
                return
            if not (options["status"] or options["automation"]):
                raise CommandError("give --run ID, or a filter: --status and/or --automation")
            bulk = runs_act_bulk(
                org=organisation, action=action, actor=actor, status=options["status"],
                automation=options["automation"], dry_run=not options["yes"],
            )  # fmt: skip
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        more = " (more match: run again)" if bulk.more else ""
        if bulk.dry_run:
            self.stdout.write(f"{bulk.matched} run(s) would {action}{more}; add --yes to act")
        else:
            self.stdout.write(
                f"{action}: {bulk.changed} run(s) changed, {bulk.skipped} skipped "
                f"(changed meanwhile){more}"
            )
