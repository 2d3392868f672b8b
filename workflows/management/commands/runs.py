"""Runs on a terminal: list an organisation's runs, show one, follow one until it ends.

    manage.py runs list --org SLUG [--status S] [--automation A] [--start-key K]
                        [--start-key-prefix P] [--search TEXT] [--since WHEN]
                        [--until WHEN] [--limit N] [--after ID] [--json]
    manage.py runs show --org SLUG RUN_ID [--json]
    manage.py runs tail --org SLUG RUN_ID [--timeout SECONDS] [--json]
    manage.py runs rerun --org SLUG RUN_ID --from STEP [--iteration N] [--input-file F]
                         [--vars-file F] [--repeat-effects] [--yes] [--json]

Every read is scoped to the organisation (workflows/selectors.py): another organisation's run
id is ``unknown_run``, as in the API. The list filters through the API's own FilterSet
(api/filters.py) and pages by id (``--after``), never counting, so it costs the same at a
million runs as at ten. ``tail`` polls the run's events by id (its index) every half second.
``rerun`` prints what a re-run from the step would do (services/rerun.py: the input and vars
that change, each settled effect reused or made again) and acts only with ``--yes``.

Exit codes (docs/how-to/runs-on-the-command-line.md): 0 done (``tail``: the run
succeeded); 1 an error with its code (``unknown_organisation``, ``unknown_run``,
``unknown_automation``, ``invalid_input``, and for ``rerun`` the codes of
docs/how-to/call-the-api.md's re-run); 2 a usage error; ``tail`` only: 3 ``run_failed``, 4
``run_cancelled``, 5 ``tail_timeout`` (still going after ``--timeout``), 130 ``interrupted``
(Ctrl-C: the run goes on); 141 the output's reader went away.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from waymark_config.exit_codes import EXIT_INTERRUPTED
from workflows import selectors
from workflows.api.filters import RunFilter
from workflows.definitions.fields import parse_duration
from workflows.errors import UnknownRun, WaymarkError
from workflows.management import run_report as report
from workflows.management.base import MigratedCommand, read_json_file
from workflows.models import Organisation, Run
from workflows.services.audit import Actor
from workflows.services.rerun import rerun
from workflows.states import RUN_FINISHED, RunStatus

POLL_SECONDS = 0.5
MAX_LIMIT = 1000
MAX_ID = 2**63 - 1  # ids are bigints: a larger number names no run
EXIT_FAILED, EXIT_CANCELLED, EXIT_TIMEOUT = 3, 4, 5
EXIT_COMPENSATED = 6  # a saga undone: not a success, though nothing waits for a person
EXIT_BROKEN_PIPE = 141  # as a shell reports a process SIGPIPE ended (128 + 13)

# Each RunFilter parameter the list takes, by the option that sets it.
FILTER_OPTIONS = {
    "status": "--status", "automation": "--automation", "start_key": "--start-key",
    "start_key_prefix": "--start-key-prefix", "search": "--search",
    "created_after": "--since", "created_before": "--until",
}  # fmt: skip


def run_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= MAX_ID:
        raise argparse.ArgumentTypeError(f"not a run id: {text!r}")
    return int(text)


class Command(MigratedCommand):
    help = "List an organisation's runs, show one (its steps and timeline), or follow one."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(
            dest="command", required=True, metavar="list|show|tail|rerun"
        )
        listing = commands.add_parser("list", help="runs, newest first, a page at a time")
        self._common(listing)
        listing.add_argument("--status", help=f"one of {', '.join(RunStatus.values)}")
        listing.add_argument("--automation", help="automation slug")
        listing.add_argument("--start-key", help="the run this start key started (exact)")
        listing.add_argument("--start-key-prefix", metavar="PREFIX",
                             help="start keys beginning so")  # fmt: skip
        listing.add_argument("--search", metavar="TEXT", help="runs whose input or start "
                             "key holds this text (a name, an order id; 3+ chars)")  # fmt: skip
        listing.add_argument("--since", metavar="WHEN", help="started since: 30s, 15m, 12h, 30d "
                             "ago, or an ISO 8601 date-time (UTC unless it says)")  # fmt: skip
        listing.add_argument("--until", metavar="WHEN", help="started before (as --since)")
        listing.add_argument("--limit", type=int, default=50, help=f"at most 1 to {MAX_LIMIT}")
        listing.add_argument("--after", type=run_id, metavar="ID", help="the page after this id")
        show = commands.add_parser("show", help="one run: its header, steps and timeline")
        self._common(show)
        show.add_argument("run", type=run_id, metavar="RUN_ID")
        tail = commands.add_parser("tail", help="one run's timeline, followed until it ends")
        self._common(tail)
        tail.add_argument("run", type=run_id, metavar="RUN_ID")
        tail.add_argument("--timeout", type=float, metavar="SECONDS", help="stop after this")
        again = commands.add_parser("rerun", help="re-run a finished run from a step: shows "
                                    "what would happen; --yes does it")  # fmt: skip
        self._common(again)
        again.add_argument("run", type=run_id, metavar="RUN_ID")
        again.add_argument("--from", dest="from_step", required=True, metavar="STEP")
        again.add_argument("--iteration", type=int, metavar="N",
                           help="a code run's step: which entry (default: its first)")  # fmt: skip
        again.add_argument("--input-file", metavar="F", help="the new input (a JSON object)")
        again.add_argument("--vars-file", metavar="F", help="the new vars (a JSON object)")
        again.add_argument("--repeat-effects", action="store_true",
                           help="make settled effects again, under new keys")  # fmt: skip
        again.add_argument("--yes", action="store_true", help="re-run (else only show)")

    def _common(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("--json", action="store_true", help="JSON (tail: one per line)")

    def handle(self, *args: Any, command: str, org: str, **options: Any) -> None:
        try:
            self.run_command(command, org, options)
        except BrokenPipeError:
            # Whoever read the output went away (`runs show ... | head`): stop quietly, as a
            # pipeline expects, and keep the interpreter's last flush from failing again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(EXIT_BROKEN_PIPE) from None

    def run_command(self, command: str, org: str, options: dict[str, Any]) -> None:
        try:
            organisation = selectors.organisation_get(slug=org)
            if command == "list":
                self.list_runs(organisation, options)
            elif command == "show":
                self.show_run(organisation, options["run"], as_json=options["json"])
            elif command == "rerun":
                self.rerun(organisation, options)
            else:
                self.tail_run(organisation, options["run"], as_json=options["json"],
                              timeout=_timeout(options["timeout"]))  # fmt: skip
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc

    # --- rerun --------------------------------------------------------------------------------

    def rerun(self, org: Organisation, options: dict[str, Any]) -> None:
        outcome = rerun(
            org=org, run_id=options["run"], from_step=options["from_step"],
            actor=Actor.command(), run_input=_json_file(options["input_file"], "--input-file"),
            variables=_json_file(options["vars_file"], "--vars-file"),
            repeat_effects=options["repeat_effects"], dry_run=not options["yes"],
            iteration=options["iteration"],
        )  # fmt: skip
        if options["json"]:
            self.stdout.write(json.dumps(asdict(outcome), default=str))
            return
        for line in report.rerun_lines(outcome):
            self.stdout.write(line)

    # --- list ---------------------------------------------------------------------------------

    def list_runs(self, org: Organisation, options: dict[str, Any]) -> None:
        limit = options["limit"]
        if not 1 <= limit <= MAX_LIMIT:
            raise CommandError(f"invalid_input: --limit must be from 1 to {MAX_LIMIT}")
        runs = _filtered(org, options)
        if options["after"] is not None:
            runs = runs.filter(id__lt=options["after"])
        page = list(selectors.run_list_moves(runs)[: limit + 1])
        next_after = page[limit - 1].pk if len(page) > limit else None
        page = page[:limit]
        if options["json"]:
            document = {"results": [report.run_json(r) for r in page], "next_after": next_after}
            self.stdout.write(report.to_json(document))
            return
        if not page:
            self.stdout.write("no runs match")
            return
        self.stdout.write("\n".join(report.run_list_lines(page)))
        if next_after is not None:
            self.stdout.write(f"more: the next page is --after {next_after}")

    # --- show ---------------------------------------------------------------------------------

    def show_run(self, org: Organisation, run_id: int, *, as_json: bool) -> None:
        run = _run_with_moves(org, run_id)
        steps = selectors.run_steps(org=org, run_id=run.pk).order_by("id")
        events = selectors.run_events_after(run=run, after_id=0).iterator(chunk_size=1000)
        if as_json:
            document = {
                **report.run_json(run), "vars": run.vars,
                "steps": [report.step_json(s) for s in steps.iterator(chunk_size=1000)],
                "history": [report.event_json(e) for e in events],
            }  # fmt: skip
            self.stdout.write(report.to_json(document))
            return
        step_rows = list(steps.defer("output"))
        self.stdout.write("\n".join(report.run_header_lines(run)))
        self.stdout.write(f"\nsteps ({len(step_rows)})")
        self.stdout.write("\n".join("  " + line for line in report.step_lines(step_rows)))
        self.stdout.write("\ntimeline")
        self.stdout.write("  " + report.event_header())
        for event in events:
            self.stdout.write("  " + report.event_line(event))

    # --- tail ---------------------------------------------------------------------------------

    def tail_run(
        self, org: Organisation, run_id: int, *, as_json: bool, timeout: float | None
    ) -> None:
        """The timeline so far, then each event as it is written, until the run ends. The
        run's status is read before its new events: a status that says it ended was
        committed with the events that ended it, so the events read after it hold them."""
        run = selectors.run_get(org=org, run_id=run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not as_json:
            self.stdout.write(f"run {run.pk}  {run.automation.slug}@{run.version.number}")
            self.stdout.write(report.event_header())
        seen = 0
        # Ctrl-C stops following, whatever this process inherited: a shell starts a
        # background command with SIGINT ignored, and Python then never raises
        # KeyboardInterrupt, so `runs tail … &` would ignore the SIGINT sent to stop it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            while True:
                seen = self._write_events(run, seen, as_json=as_json)
                if run.status in RUN_FINISHED:
                    return self._ended(org, run, as_json=as_json)
                if deadline is not None and time.monotonic() >= deadline:
                    raise CommandError(
                        f"tail_timeout: run {run.pk} is still {run.status} after {timeout:g}s",
                        returncode=EXIT_TIMEOUT,
                    )
                time.sleep(POLL_SECONDS)
                run = selectors.run_get(org=org, run_id=run.pk)
        except KeyboardInterrupt:
            raise CommandError(
                f"interrupted: stopped following run {run.pk}; the run goes on",
                returncode=EXIT_INTERRUPTED,
            ) from None

    def _write_events(self, run: Run, seen: int, *, as_json: bool) -> int:
        for event in selectors.run_events_after(run=run, after_id=seen).iterator(chunk_size=500):
            self.stdout.write(
                report.to_json(report.event_json(event)) if as_json else report.event_line(event)
            )
            seen = event.pk
        self.stdout.flush()  # a pipe is block-buffered: whoever reads it sees each event now
        return seen

    def _ended(self, org: Organisation, run: Run, *, as_json: bool) -> None:
        ended = _run_with_moves(org, run.pk)
        if as_json:
            self.stdout.write(report.to_json({"run": report.run_json(ended)}))
        else:
            error = f": {report.one_line(ended.error)}" if ended.error else ""
            self.stdout.write(f"run {ended.pk} {ended.status}{error}")
        self.stdout.flush()
        if ended.status == RunStatus.FAILED:
            raise CommandError(f"run_failed: run {ended.pk} failed", returncode=EXIT_FAILED)
        if ended.status == RunStatus.CANCELLED:
            raise CommandError(
                f"run_cancelled: run {ended.pk} was cancelled", returncode=EXIT_CANCELLED
            )
        if ended.status == RunStatus.COMPENSATED:
            raise CommandError(
                f"run_compensated: run {ended.pk} was compensated", returncode=EXIT_COMPENSATED
            )


def _run_with_moves(org: Organisation, run_id: int) -> Run:
    run = selectors.run_list_moves(selectors.run_list(org=org)).filter(pk=run_id).first()
    if run is None:
        raise UnknownRun(run_id=run_id)
    return run


def _json_file(path: str | None, option: str) -> Any:
    """The JSON a file holds (None: no file given)."""
    if path is None:
        return None
    return read_json_file(path, f"invalid_input: {option}")


def _filtered(org: Organisation, options: dict[str, Any]) -> Any:
    """The organisation's runs through the API's RunFilter, given the options' values."""
    data = {name: options[option[2:].replace("-", "_")] for name, option in FILTER_OPTIONS.items()}
    for name in ("created_after", "created_before"):
        if data[name] is not None:
            data[name] = _instant(data[name], FILTER_OPTIONS[name])
    runs = RunFilter(
        {name: value for name, value in data.items() if value is not None},
        queryset=selectors.run_list(org=org), org=org,
    )  # fmt: skip
    if not runs.is_valid():
        name, messages = next(iter(runs.errors.items()))
        raise CommandError(f"invalid_input: {FILTER_OPTIONS.get(name, name)}: {messages[0]}")
    if data["automation"] is not None:  # a misspelt slug is said so, not an empty list
        selectors.automation_get(org=org, slug=data["automation"])
    return runs.qs


def _instant(value: str, option: str) -> str:
    """A span ago (``15m``) or a date-time, as the ISO 8601 the filter takes."""
    span = parse_duration(value)
    if span is not None:
        return (timezone.now() - span).isoformat()
    try:
        moment = parse_datetime(value)
        day = None if moment else parse_date(value)
    except ValueError:
        moment = day = None
    if day is not None:
        moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
    if moment is None:
        raise CommandError(
            f"invalid_input: {option} takes a span ago (30s, 15m, 12h, 30d) or an ISO 8601 "
            f"date-time, not {value!r}"
        )
    return (moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)).isoformat()


def _timeout(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise CommandError("invalid_input: --timeout must be a number of seconds above 0")
    return value
