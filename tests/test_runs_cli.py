"""`manage.py runs list|show|tail`: an organisation's runs on a terminal, filtered as the API
filters them, paged by id; one run's steps and timeline; one run followed while it moves (a
real `manage.py` process, woken by a signal sent through the API); never another
organisation's run."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from workflows.api import filters
from workflows.engine.signals import deliver
from workflows.models import Organisation, Run, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act
from workflows.services.runs import run_start

from .factories import SIGNAL_WAIT_DEFINITION
from .processes import ROOT, engine_env, exit_code, wait_for

pytestmark = pytest.mark.django_db

QUICK: dict[str, Any] = {
    "start": "greet",
    "steps": [
        {"id": "greet", "type": "set", "values": {"g": "hi"}, "next": "done"},
        {"id": "done", "type": "end"},
    ],
}
# Three steps, the last of which fails (its template names what the input lacks), after a
# wait for signal "order.paid" correlated by the input's "order".
FAILS_AFTER_THE_SIGNAL: dict[str, Any] = {
    "start": "prepare",
    "steps": [
        {"id": "prepare", "type": "set", "values": {"order": "{{ input.order }}"},
         "next": "wait"},
        {"id": "wait", "type": "wait_signal", "signal": "order.paid",
         "correlation": "{{ input.order }}", "timeout": "1d", "next": "charge"},
        {"id": "charge", "type": "set", "values": {"total": "{{ input.missing.amount }}"},
         "next": "done"},
        {"id": "done", "type": "end"},
    ],
}  # fmt: skip


def runs(*args: str) -> str:
    out = io.StringIO()
    call_command("runs", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def runs_json(*args: str) -> Any:
    return json.loads(runs(*args, "--json"))


def refused(*args: str) -> CommandError:
    with pytest.raises(CommandError) as caught:
        runs(*args)
    return caught.value


def start(org: Organisation, slug: str, key: str, run_input: dict[str, Any] | None = None) -> int:
    return run_start(org=org, automation_slug=slug, run_input=run_input or {},
                     start_key=key).run_id  # fmt: skip


@pytest.fixture
def mix(org: Organisation) -> dict[str, list[int]]:
    """Three quick runs (succeeded), two waiting for a signal (running), one cancelled."""
    automation_publish_definition(org=org, slug="quick", definition=QUICK)
    automation_publish_definition(org=org, slug="waiter", definition=SIGNAL_WAIT_DEFINITION)
    ids: dict[str, list[int]] = {"quick": [], "waiter": []}
    for n in range(3):
        ids["quick"].append(start(org, "quick", f"quick-{n}"))
    for n in range(3):
        ids["waiter"].append(start(org, "waiter", f"order-{n}", {"order": f"o-{n}"}))
    run_act(org=org, run_id=ids["waiter"][0], action="cancel", actor="test:ops")
    return ids


def every_run(mix: dict[str, list[int]]) -> list[int]:
    return sorted([*mix["quick"], *mix["waiter"]], reverse=True)


def listed(*args: str) -> list[int]:
    return [run["id"] for run in runs_json("list", *args)["results"]]


# --- list -------------------------------------------------------------------------------------


def test_list_is_newest_first_as_a_table(org, mix) -> None:
    lines = runs("list", "--org", org.slug).splitlines()
    assert lines[0].split() == ["ID", "AUTOMATION", "STATUS", "STARTED", "(UTC)", "UPDATED",
                                "(UTC)", "STEP"]  # fmt: skip
    rows = [line.split() for line in lines[1:]]
    every = every_run(mix)
    assert [int(row[0]) for row in rows] == every
    newest = rows[0]  # waiting for its signal: started and moved to the second
    assert newest[1:3] == ["waiter@1", "running"] and newest[-1] == "wait"
    assert len(newest[3]) == len("2026-01-01") and len(newest[4]) == len("12:00:00")
    assert rows[-1][1:3] == ["quick@1", "succeeded"] and rows[-1][-1] == "done"
    assert runs("list", "--org", org.slug, "--status", "paused") == "no runs match\n"


def test_list_filters_as_the_api_does(org, mix, api: APIClient) -> None:
    waiting = sorted(mix["waiter"][1:], reverse=True)
    assert listed("--org", org.slug, "--status", "running") == waiting
    assert listed("--org", org.slug, "--automation", "quick") == sorted(mix["quick"], reverse=True)
    assert listed("--org", org.slug, "--automation", "waiter", "--status", "cancelled") == [
        mix["waiter"][0]
    ]
    assert listed("--org", org.slug, "--start-key", "order-1") == [mix["waiter"][1]]
    assert listed("--org", org.slug, "--start-key", "order-") == []  # exact
    assert listed("--org", org.slug, "--start-key-prefix", "order-") == sorted(
        mix["waiter"], reverse=True
    )
    # Inside the input (or the start key), as the API's search: "o-1" is order-1's input.
    assert listed("--org", org.slug, "--search", "o-1") == [mix["waiter"][1]]
    assert listed("--org", org.slug, "--since", "1h") == every_run(mix)
    assert listed("--org", org.slug, "--until", "1h") == []
    tomorrow = (timezone.now() + timedelta(days=1)).date().isoformat()
    assert listed("--org", org.slug, "--since", tomorrow) == []
    # The same filters, the same runs, through the API (one FilterSet serves both).
    since, until = (timezone.now() - timedelta(hours=1)).isoformat(), tomorrow
    for query, option in [({"start_key_prefix": "quick-"}, ("--start-key-prefix", "quick-")),
                          ({"search": "o-2"}, ("--search", "o-2")),
                          ({"status": "running", "automation": "waiter"},
                           ("--status", "running", "--automation", "waiter")),
                          ({"created_after": since, "created_before": until},
                           ("--since", since, "--until", until))]:  # fmt: skip
        answer = api.get("/api/v1/runs", query)
        assert answer.status_code == 200, answer.json()
        assert [r["id"] for r in answer.json()["results"]] == listed("--org", org.slug, *option)


def test_since_finds_the_runs_created_since_whether_or_not_its_bound_is_in_the_window(
    org, mix, monkeypatch
) -> None:
    """``--since`` (the API's created_after) reads only ids above the newest run created
    before it, looked for among the newest SINCE_WINDOW runs; beyond them it needs none."""
    older = mix["quick"] + mix["waiter"][:1]
    Run.objects.filter(pk__in=older).update(created_at=timezone.now() - timedelta(hours=3))
    newer = sorted(mix["waiter"][1:], reverse=True)
    for window in (filters.SINCE_WINDOW, 1, 2):
        monkeypatch.setattr(filters, "SINCE_WINDOW", window)
        assert listed("--org", org.slug, "--since", "2h") == newer, window
        assert listed("--org", org.slug, "--since", "4h") == sorted(older + newer, reverse=True)
        assert listed("--org", org.slug, "--until", "2h") == sorted(older, reverse=True)


def test_list_pages_by_id_and_says_where_the_next_page_starts(org, mix) -> None:
    every = every_run(mix)
    seen: list[int] = []
    after: list[str] = []
    while True:
        page = runs_json("list", "--org", org.slug, "--limit", "4", *after)
        seen += [run["id"] for run in page["results"]]
        if page["next_after"] is None:
            break
        after = ["--after", str(page["next_after"])]
    assert seen == every
    text = runs("list", "--org", org.slug, "--limit", "4").splitlines()
    assert text[-1] == f"more: the next page is --after {every[3]}"
    last_page = runs("list", "--org", org.slug, "--after", str(every[3])).splitlines()
    assert [int(line.split()[0]) for line in last_page[1:]] == every[4:]


def test_list_json_has_the_apis_fields(org, mix, api: APIClient) -> None:
    mine = runs_json("list", "--org", org.slug)["results"]
    theirs = api.get("/api/v1/runs").json()["results"]
    assert [{k: run[k] for k in theirs[0]} for run in mine] == theirs
    assert mine[0]["current_step"] == "wait" and mine[0]["updated_at"] is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--status", "done"), "invalid_input: --status: must be one of running, paused"),
        (("--automation", "Not A Slug"), "invalid_input: --automation:"),
        (("--automation", "nope"), 'unknown_automation: No automation "nope"'),
        (("--since", "yesterday"), "invalid_input: --since takes a span ago"),
        (("--until", "2026-13-01"), "invalid_input: --until takes a span ago"),
        (("--limit", "0"), "invalid_input: --limit must be from 1 to 1000"),
    ],
)
def test_list_refuses_what_it_cannot_use(org, args: tuple[str, ...], message: str) -> None:
    error = refused("list", "--org", org.slug, *args)
    assert str(error).startswith(message) and error.returncode == 1


def test_an_unknown_organisation_is_refused(org) -> None:
    error = refused("list", "--org", "nope")
    assert str(error) == 'unknown_organisation: No organisation "nope".'


# --- show -------------------------------------------------------------------------------------


@pytest.fixture
def failed_run(org: Organisation) -> int:
    """Paused and resumed by an operator, woken by its signal, then failed at `charge`."""
    automation_publish_definition(org=org, slug="orders", definition=FAILS_AFTER_THE_SIGNAL)
    run_id = start(org, "orders", "order-7", {"order": "o-7"})
    run_act(org=org, run_id=run_id, action="pause", actor="command:ada")
    run_act(org=org, run_id=run_id, action="resume", actor="command:ada")
    deliver(org_id=org.pk, name="order.paid", correlation="o-7", payload={"amount": 42})
    assert Run.objects.get(pk=run_id).status == "failed"
    return run_id


def test_show_prints_the_header_the_steps_and_the_timeline(org, failed_run) -> None:
    text = runs("show", "--org", org.slug, str(failed_run))
    header, steps, timeline = text.split("\n\n")
    assert header.splitlines()[0] == f"run {failed_run}  orders@1  failed"
    assert "start key  order-7" in header and "error      step 'charge' failed" in header
    rows = [line.split(None, 9) for line in steps.splitlines()[2:]]
    assert [row[:4] for row in rows] == [
        ["prepare", "1", "set", "done"],
        ["wait", "1", "wait_signal", "done"],
        ["charge", "1", "set", "failed"],
    ]
    assert rows[2][4:6] == ["1/1", "inline"] and "template error" in rows[2][-1]
    events = timeline.splitlines()[2:]
    kinds = [line.split()[2] for line in events]
    assert kinds == ["run.started", "step.succeeded", "step.waiting", "run.paused",
                     "run.resumed", "step.signal", "step.failed", "run.failed"]  # fmt: skip
    assert 'waits for signal "order.paid" with correlation "o-7", at most 1d' in events[2]
    assert events[3].endswith("steps_parked: 0 (by command:ada)")
    assert "outcome: received (by signal:" in events[5]
    assert "error: template error" in events[6]


def test_show_says_what_a_waiting_step_waits_for(org, mix) -> None:
    text = runs("show", "--org", org.slug, str(mix["waiter"][1]))
    wait = next(line for line in text.splitlines() if line.lstrip().startswith("wait "))
    assert "waiting" in wait
    assert 'waits for signal "order.paid" with correlation "o-1", until 20' in wait
    assert wait.endswith("(then timed_out)")


def test_show_json_is_the_apis_detail_with_every_step_and_event(org, failed_run, api) -> None:
    mine = runs_json("show", "--org", org.slug, str(failed_run))
    theirs = api.get(f"/api/v1/runs/{failed_run}").json()
    for field in set(theirs) - {"steps", "history", "links"}:
        assert mine[field] == theirs[field], field
    for name in ("steps", "history"):
        assert [{k: row[k] for k in theirs[name][0]} for row in mine[name]] == theirs[name]
    assert mine["steps"][2]["status"] == "failed" and mine["steps"][2]["waiting_for"] is None
    assert mine["history"][3]["worker"] == "command:ada"
    assert mine["current_step"] == "charge"


# --- tail -------------------------------------------------------------------------------------


def test_tail_of_an_ended_run_prints_its_timeline_and_exits_with_its_outcome(
    org, failed_run, mix
) -> None:
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("runs", "tail", "--org", org.slug, str(failed_run), stdout=out)
    assert caught.value.returncode == 3
    assert str(caught.value) == f"run_failed: run {failed_run} failed"
    lines = out.getvalue().splitlines()
    assert lines[-2].split()[2] == "run.failed"
    assert lines[-1].startswith(f"run {failed_run} failed: step 'charge' failed")
    cancelled = mix["waiter"][0]
    with pytest.raises(CommandError) as caught:
        runs("tail", "--org", org.slug, str(cancelled))
    assert caught.value.returncode == 4 and str(caught.value).startswith("run_cancelled:")
    assert runs("tail", "--org", org.slug, str(mix["quick"][0])).endswith("succeeded\n")


def test_tail_json_is_one_event_a_line_then_the_run(org, failed_run) -> None:
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("runs", "tail", "--org", org.slug, str(failed_run), "--json", stdout=out)
    *events, end = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["kind"] for e in events][-2:] == ["step.failed", "run.failed"]
    assert set(events[0]) == {"id", "kind", "step_id", "iteration", "attempt", "by", "detail",
                              "at", "worker"}  # fmt: skip
    assert end["run"]["id"] == failed_run and end["run"]["status"] == "failed"


def test_tail_stops_after_its_timeout_while_the_run_waits(org, mix) -> None:
    error = refused("tail", "--org", org.slug, str(mix["waiter"][1]), "--timeout", "0.01")
    assert error.returncode == 5
    assert str(error) == f"tail_timeout: run {mix['waiter'][1]} is still running after 0.01s"
    assert refused("tail", "--org", org.slug, "1", "--timeout", "0").returncode == 1


def _tail(org: Organisation, run_id: int, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`runs tail` in its own process, its output into ``out`` and its errors into
    ``out.err`` (files the child keeps: no pipe to fill, none left open to the test)."""
    with out.open("wb") as sink, _err(out).open("wb") as errors:
        return subprocess.Popen(
            [sys.executable, "manage.py", "runs", "tail", "--org", org.slug, str(run_id), *extra],
            cwd=ROOT, env=engine_env(), stdout=sink, stderr=errors,
        )  # fmt: skip


def _err(out: Path) -> Path:
    return out.with_suffix(".err")


@pytest.mark.django_db(transaction=True)
def test_tail_follows_a_run_that_moves_and_exits_0_when_it_succeeds(
    org, api: APIClient, procs, tmp_path: Path
) -> None:
    automation_publish_definition(org=org, slug="waiter", definition=SIGNAL_WAIT_DEFINITION)
    run_id = start(org, "waiter", "order-9", {"order": "o-9"})
    out = tmp_path / "tail.out"
    tail = _tail(org, run_id, out)
    procs.append(tail)
    wait_for(lambda: "step.waiting" in out.read_text(), timeout=60, what="the timeline so far")
    assert tail.poll() is None  # following: the run waits for its signal

    sent = api.post("/api/v1/signals", {"name": "order.paid", "correlation": "o-9",
                                        "id": "pay-9", "payload": {"amount": 9}},
                    format="json")  # fmt: skip
    assert sent.status_code == 201 and sent.json()["status"] == "consumed", sent.json()

    assert exit_code(tail) == 0, _err(out).read_text()
    lines = out.read_text().splitlines()
    assert lines[0] == f"run {run_id}  waiter@1"
    kinds = [line.split()[2] for line in lines[2:-1]]
    assert kinds == ["run.started", "step.waiting", "step.signal", "step.succeeded",
                     "run.succeeded"]  # fmt: skip
    assert lines[-1] == f"run {run_id} succeeded"


@pytest.mark.django_db(transaction=True)
def test_ctrl_c_stops_tail_cleanly_and_leaves_the_run_going(org, procs, tmp_path: Path) -> None:
    automation_publish_definition(org=org, slug="waiter", definition=SIGNAL_WAIT_DEFINITION)
    run_id = start(org, "waiter", "order-3", {"order": "o-3"})
    out = tmp_path / "tail.out"
    tail = _tail(org, run_id, out, "--json")
    procs.append(tail)
    wait_for(lambda: "step.waiting" in out.read_text(), timeout=60, what="the timeline so far")
    tail.send_signal(signal.SIGINT)
    assert exit_code(tail) == 130
    assert _err(out).read_text().strip() == (
        f"CommandError: interrupted: stopped following run {run_id}; the run goes on"
    )
    assert [json.loads(line)["kind"] for line in out.read_text().splitlines()] == [
        "run.started",
        "step.waiting",
    ]
    assert Run.objects.get(pk=run_id).status == "running"


# --- another organisation ---------------------------------------------------------------------


def test_another_organisations_run_is_unknown(org, other_org, mix) -> None:
    theirs = mix["waiter"][1]
    for command in ("show", "tail"):
        error = refused(command, "--org", other_org.slug, str(theirs))
        assert str(error) == f"unknown_run: No run {theirs} in this organisation."
        assert error.returncode == 1
    assert listed("--org", other_org.slug) == []
    assert listed("--org", other_org.slug, "--start-key", "order-1") == []


@pytest.mark.django_db(transaction=True)
def test_an_unknown_run_exits_1_with_its_code(org, other_org) -> None:
    automation_publish_definition(org=org, slug="quick", definition=QUICK)
    run_id = start(org, "quick", "q")
    shown = subprocess.run(
        [sys.executable, "manage.py", "runs", "show", "--org", other_org.slug, str(run_id)],
        cwd=ROOT, env=engine_env(), capture_output=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 1 and shown.stdout == b""
    assert shown.stderr.decode().strip() == (
        f"CommandError: unknown_run: No run {run_id} in this organisation."
    )


def test_a_steps_tries_count_only_the_claims_that_count(org, admin_client) -> None:
    """A claim handed back (a shutdown, a deferral, a database outage) or made before an
    operator's retry began a new series does not count against the step's attempts: `runs
    show` and the admin's run page give the claims that did, of those allowed, and the ones
    handed back (the fencing token, 4 here, is not a count)."""
    definition = {"start": "a", "steps": [{"id": "a", "type": "noop", "next": "done"},
                                          {"id": "done", "type": "end"}]}  # fmt: skip
    automation_publish_definition(org=org, slug="one-io", definition=definition)
    run_id = start(org, "one-io", "tries")
    Step.objects.filter(run_id=run_id, step_id="a").update(
        attempt=4, release_count=1, series_offset=2, max_attempts=5
    )
    text = runs("show", "--org", org.slug, str(run_id))
    row = next(line for line in text.splitlines() if line.lstrip().startswith("a "))
    assert "1/5 (+1 handed back)" in row and "4/5" not in row
    page = admin_client.get(reverse("admin:workflows_run_change", args=[run_id]))
    shown = page.content.decode()
    assert page.status_code == 200
    assert "1/5" in shown and "(+1 handed back)" in shown and "4/5" not in shown
