from typing import Any

from django.core.management.base import CommandError, CommandParser

from workflows.errors import InvalidInput, WaymarkError
from workflows.management.base import MigratedCommand
from workflows.models import RunMigration
from workflows.selectors import organisation_get
from workflows.services.audit import Actor
from workflows.services.run_migration import (
    REASONS,
    JobProgress,
    dry_run,
    migration_plan,
    migration_resume,
    migration_start,
)
from workflows.states import RUN_LIVE


class Command(MigratedCommand):
    help = (
        "Move runs of an automation from one version to another "
        "(docs/how-to/change-an-automation-in-flight.md). --dry-run says what would move "
        "where; without it the runs move one by one, and a stopped migration goes on with "
        "--resume ID."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("--automation", required=True, help="automation slug")
        parser.add_argument("--from", dest="from_version", type=int, help="the runs' version")
        parser.add_argument("--to", dest="to_version", type=int, help="the version to move to")
        parser.add_argument("--to-automation", help="(refused unless it is --automation)")
        parser.add_argument(
            "--map", action="append", default=[], metavar="OLD=NEW",
            help="old step id = new step id (repeat it); a step the new version has too, "
            "with the same type, maps to itself",
        )  # fmt: skip
        parser.add_argument(
            "--removed", metavar="stay|move_to:STEP",
            help="runs parked on a step with no new id: stay on the old version (reported), "
            "or move_to a step of the new version (the wait is cancelled, that step entered); "
            "stay when not given",
        )  # fmt: skip
        parser.add_argument(
            "--step", action="append", default=[], dest="steps",
            help="only runs at this step (repeat it)",
        )  # fmt: skip
        parser.add_argument(
            "--status", action="append", default=[], dest="statuses",
            choices=sorted(s.value for s in RUN_LIVE), help="only runs in this status",
        )  # fmt: skip
        parser.add_argument("--dry-run", action="store_true", help="say what would move, only")
        parser.add_argument(
            "--resume", type=int, metavar="ID",
            help="go on with migration ID, with its own plan (no other option but --org and "
            "--automation)",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        actor = Actor.command()
        try:
            org = organisation_get(slug=options["org"])
            if options["resume"] is not None:
                _refuse_a_plan_beside_resume(options)
                progress = migration_resume(
                    org=org, automation_slug=options["automation"],
                    migration_id=options["resume"], actor=actor,
                )  # fmt: skip
                self._report(progress)
                return
            if options["from_version"] is None or options["to_version"] is None:
                raise CommandError("give --from and --to (or --resume ID)")
            plan = migration_plan(
                org=org, automation_slug=options["automation"],
                from_version=options["from_version"], to_version=options["to_version"],
                to_automation=options["to_automation"], mapping=_mapping(options["map"]),
                removed=options["removed"] or "stay", steps=options["steps"],
                statuses=options["statuses"],
            )  # fmt: skip
            if options["dry_run"]:
                self._dry_run(dry_run(plan).as_json())
                return
            progress = migration_start(plan=plan, actor=actor, started=self._started)
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        self._report(progress)

    def _started(self, job: RunMigration) -> None:
        self.stdout.write(f"migration {job.pk} started: if it stops, go on with --resume {job.pk}")
        self.stdout.flush()

    def _dry_run(self, report: dict[str, Any]) -> None:
        self.stdout.write(
            f"dry run: {report['matched']} run(s) match; {report['would_move']} would move"
        )
        for line in report["steps"]:
            where = f"-> {line['to']} ({line['how']})" if line["to"] else "(no new step)"
            stays = f", not moved: {line['cannot']}" if line["cannot"] else ""
            self.stdout.write(
                f"  at {line['step_id']} {where}: {line['runs']} run(s){stays} "
                f"(e.g. {_ids(line['sample'])})"
            )
        self._cannot(report["cannot"])

    def _report(self, progress: JobProgress) -> None:
        job: RunMigration = progress.job
        self.stdout.write(
            f"migration {job.pk} ({job.status}): {job.moved} run(s) moved in all, "
            f"{progress.moved_now} now"
        )
        if job.report is not None:
            self._cannot(job.report["cannot"])

    def _cannot(self, cannot: dict[str, Any]) -> None:
        for reason, counted in sorted(cannot.items()):
            self.stdout.write(
                f"  not moved, {reason}: {counted['runs']} run(s), "
                f"{REASONS.get(reason, reason)} (e.g. {_ids(counted['sample'])})"
            )


# Each option of a plan, by the name its value has in ``options``: what --resume refuses.
PLAN_OPTIONS = {
    "from_version": "--from", "to_version": "--to", "to_automation": "--to-automation",
    "map": "--map", "removed": "--removed", "steps": "--step", "statuses": "--status",
    "dry_run": "--dry-run",
}  # fmt: skip


def _refuse_a_plan_beside_resume(options: dict[str, Any]) -> None:
    """A migration goes on with the plan it was made with (the runs it moved moved by that
    plan); a plan option given beside --resume would be silently ignored, so it is refused,
    as the API refuses it, before anything moves."""
    given = sorted(
        flag
        for name, flag in PLAN_OPTIONS.items()
        if options.get(name) is not None and options[name] is not False and options[name] != []
    )
    if given:
        raise InvalidInput(
            reason=f"resume goes on with the migration's own plan: leave out {', '.join(given)}"
        )


def _mapping(pairs: list[str]) -> dict[str, str]:
    mapping = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise CommandError(f"--map takes OLD=NEW, not {pair!r}")
        mapping[old.strip()] = new.strip()
    return mapping


def _ids(sample: list[int]) -> str:
    return ", ".join(str(run_id) for run_id in sample)
