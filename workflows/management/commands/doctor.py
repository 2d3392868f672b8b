import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from workflows.engine.health import (
    EXIT_BROKEN,
    EXIT_HEALTHY,
    EXIT_UNCHECKED,
    Finding,
    Limits,
    Report,
    Severity,
    run_checks,
)
from workflows.engine.lanes import engine_setting
from workflows.management.base import MAX_DAYS, MigratedCommand

MARKS = {
    Severity.OK: "ok",
    Severity.INFO: "info",
    Severity.WARNING: "WARNING",
    Severity.UNCHECKED: "UNCHECKED",
    Severity.BROKEN: "BROKEN",
}


class Command(MigratedCommand):
    help = (
        "Run the absence monitors (the engine's and the apps' health checks): runs with no "
        "durable way forward, late timers and wakes, lapsed leases, effects left in flight, "
        "unsent outbox rows, signals nobody takes, the oldest ready step per lane. Prints a "
        f"report (--json: JSON). Exits {EXIT_HEALTHY} when every invariant holds, "
        f"{EXIT_BROKEN} when one is broken, {EXIT_UNCHECKED} when none is known broken but a "
        "check could not run (or the database is unreachable, or the options are bad)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--late-seconds", type=float, default=None,
            help="how late is too late (default: WAYMARK_DOCTOR_LATE_SECONDS, 300)",
        )  # fmt: skip
        parser.add_argument(
            "--examples", type=int, default=None,
            help="examples listed per finding (default: WAYMARK_DOCTOR_EXAMPLES, 10)",
        )  # fmt: skip
        parser.add_argument(
            "--timeout", type=float, default=None,
            help="seconds each check's statements may take (default: "
            "WAYMARK_DOCTOR_TIMEOUT_SECONDS, 30)",
        )  # fmt: skip

    def check_migrations(self) -> None:
        """A database that is not migrated, or not reachable, gives no verdict: exit 2, never
        1 (which says an invariant is broken)."""
        try:
            super().check_migrations()
        except CommandError as error:
            raise CommandError(str(error), returncode=EXIT_UNCHECKED) from error
        except DatabaseError as error:
            raise _unreachable(error) from error

    def handle(self, *args: Any, **options: Any) -> None:
        limits, timeout = _limits(options)
        try:
            report = run_checks(limits, timeout_seconds=timeout)
        except DatabaseError as error:
            raise _unreachable(error) from error
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            self.stdout.write(render(report))
        if report.exit_code != EXIT_HEALTHY:
            raise SystemExit(report.exit_code)


def _limits(options: dict[str, Any]) -> tuple[Limits, float]:
    defaults = Limits.from_settings()
    late = _or(options["late_seconds"], defaults.late_seconds)
    examples = _or(options["examples"], defaults.examples)
    timeout = _or(options["timeout"], float(engine_setting("DOCTOR_TIMEOUT_SECONDS")))
    if not 0 < late <= MAX_DAYS * 86_400:  # nan too
        raise _refused(f"--late-seconds must be above 0, at most {MAX_DAYS} days")
    if not 1 <= examples <= 1000:
        raise _refused("--examples must be from 1 to 1000")
    if not 0 < timeout <= 3600:  # nan too
        raise _refused("--timeout must be above 0 and at most 3600 seconds")
    return Limits(late_seconds=late, examples=examples), timeout


def _unreachable(error: DatabaseError) -> CommandError:
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return CommandError(f"database_unreachable: {first_line}", returncode=EXIT_UNCHECKED)


def _refused(message: str) -> CommandError:
    return CommandError(f"invalid_input: {message}", returncode=EXIT_UNCHECKED)


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def render(report: Report) -> str:
    """The report for a person: the verdict, then each finding with its examples."""
    broken, unchecked = len(report.broken), len(report.unchecked)
    if broken:
        verdict = f"BROKEN: {broken} invariant(s) broken"
    elif unchecked:
        verdict = f"UNCHECKED: {unchecked} check(s) could not run"
    else:
        verdict = "healthy: every invariant holds"
    lines = [
        f"waymark doctor: {verdict} (late = {report.limits.late_seconds:g} s, "
        f"checked at {report.checked_at:%Y-%m-%d %H:%M:%S %Z})",
        "",
    ]
    for finding in report.findings:
        lines.extend(_finding_lines(finding))
    return "\n".join(lines)


def _finding_lines(finding: Finding) -> list[str]:
    lines = [f"{MARKS[finding.severity]:<10} {finding.label}: {finding.summary}"]
    if finding.severity in (Severity.BROKEN, Severity.WARNING):
        for example in finding.examples:
            where = " ".join(
                part
                for part in (
                    f"run {example.run_id}" if example.run_id is not None else "",
                    f"(org {example.org_id})" if example.org_id is not None else "",
                    example.step,
                )
                if part
            )
            lines.append(f"{'':<10}   {where + ': ' if where else ''}{example.why}")
    return lines
