"""A code workflow killed at every crash point (workflows/engine/faults.py): an http effect, a
sleep until 09:00 in Berlin, a signal with a timeout (one run receives it, one times out), an
approval answered in Slack (tests/code_crash_workflow.py).

For each crash point, the engine's processes (relay, sweep, an io and a human worker) start
with WAYMARK_CRASH_AT set to it; the test plays the outside world (the zoned sleep's morning
comes, the signal, the Slack click, the late run's deadlines pass) until one of them dies at
that point; the others are stopped, fresh ones without the crash take over, and the runs are
driven to their end. Then: each effect reached its stub once, one Slack message per run
decided once (approved, or expired), every step of the code entered and ended once, each run
ended as its code says, and no process logged a traceback or an engine_error.

The whole matrix (ten points) takes one and a half to seven minutes on the shared 2-core
machine, by its load; the suite runs SUITE_POINTS, one point in each part of the workflow
(about 45 s to four minutes), and `benchmarks/code_workflow_crashes.py` runs every point
(WAYMARK_CRASH_MATRIX=all)."""

from __future__ import annotations

import json
import os
import signal as signals
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import time as clock
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, DecisionAttempt
from effects.models import Effect
from timers.models import Timer
from workflows.models import Organisation, Run, RunEvent, Signal, Step
from workflows.plugins.code import publish_code_workflow

from . import code_crash_workflow
from .effect_setup import connect
from .processes import ROOT, engine_env, exit_code, kill_tree
from .stubs import ProviderStub, SlackStub
from .test_approvals_setup import (
    click_decided,
    click_payload,
    last_click,
    pass_deadline,
    slack_connection,
    slack_post,
)

pytestmark = [
    pytest.mark.long_running,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("slack_signing_secret", "alice"),
]

CRASHED = 137
# Every crash point this workflow reaches, and the process that reaches it.
POINTS = {
    "run_start.after_commit": "the process starting a run",
    "worker.after_claim": "a worker",
    "settle.after_step_update": "a worker",
    "relay.after_publish": "the relay",
    "effect.before_call": "the io worker (the http effect)",
    "effect.after_answer": "the io worker (the http effect)",
    "timers.after_claim": "the sweep (the zoned sleep's timer)",
    "timers.before_batch_commit": "the sweep (the zoned sleep's timer)",
    "signal.after_consume": "the io worker (a signal sent before its wait)",
    "approval.after_decision": "the human worker (the Slack click)",
}
# Not reached by a run of this workflow: schedules.before_advance (a scheduled start;
# tests/test_schedules.py kills it).
# The suite's subset: one point in each part of the workflow (a settle, the effect, the zoned
# sleep's timer, the signal, the approval), each in the process that reaches it.
SUITE_POINTS = [
    "settle.after_step_update",  # the first: the first turn's, with the noop it ran
    "effect.after_answer",
    "timers.before_batch_commit",
    "signal.after_consume",
    "approval.after_decision",
]
MATRIX = list(POINTS) if os.environ.get("WAYMARK_CRASH_MATRIX") == "all" else SUITE_POINTS
ENV = {
    "WAYMARK_EXTRA_STEP_MODULES": "tests.probe_steps,tests.code_crash_workflow",
    "WAYMARK_SWEEP_SECONDS": "0.2",  # the sweeper's lease is three ticks: an heir leads soon
    "WAYMARK_HUMAN_LEASE_SECONDS": "2",
    "WAYMARK_EFFECTS_LEASE_MARGIN_SECONDS": "1",
    "WAYMARK_EFFECTS_DEFER_SECONDS": "0.2",
}
ROLES = (
    ("relay",),
    ("sweep",),
    ("worker", "--lane", "io", "--concurrency", "4", "--grace", "2"),
    ("worker", "--lane", "human", "--concurrency", "2", "--grace", "2"),
)
LOG_ALARMS = ("Traceback", "engine_error")
BOUND = 240.0  # a bound for a failure on a loaded machine, never a budget a pass spends


# --- the engine's processes ---------------------------------------------------------------


class Engine:
    """The engine's roles as separate processes, all writing to one log."""

    def __init__(self, log: Path, **env: str) -> None:
        with log.open("ab") as out:
            self.processes = [
                subprocess.Popen(
                    [sys.executable, "manage.py", *role],
                    cwd=ROOT,
                    env=engine_env(**ENV, **env),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
                for role in ROLES
            ]

    def crashed(self) -> bool:
        codes = [p.poll() for p in self.processes]
        assert set(codes) <= {None, CRASHED}, f"a process exited with {codes}"
        return CRASHED in codes

    def stop(self) -> None:
        """The survivors stop as they do on a deploy (SIGTERM, their grace)."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signals.SIGTERM)
        for process in self.processes:
            exit_code(process)

    def kill(self) -> None:
        for process in self.processes:
            kill_tree(process)


# --- the outside world, played by the test ------------------------------------------------


@dataclass
class World:
    """What the runs wait for, each done once: the morning comes, the signal is sent (before
    the receiving run waits: an engine process consumes it) and the approver approves in
    Slack; for the late run, the signal's hour passes and so does the approval's day."""

    org: Organisation
    api: APIClient
    provider: ProviderStub
    slack: SlackStub
    receiving: int = 0
    late: int = 0
    done: set[tuple[str, int]] = field(default_factory=set)

    def runs(self) -> list[int]:
        return [self.receiving, self.late]

    def act(self) -> None:
        for run_id in self.runs():
            self._morning(run_id)
        self._hour_passes(self.late)
        self._click(self.receiving)
        self._day_passes(self.late)

    def once(self, what: str, run_id: int) -> bool:
        if (what, run_id) in self.done:
            return False
        self.done.add((what, run_id))
        return True

    def send_signal(self) -> None:
        body = {"name": "paid", "correlation": "o-receiving", "id": "pay-1",
                "payload": {"amount": 12}}  # fmt: skip
        answer = self.api.post("/api/v1/signals", body, format="json")
        assert answer.status_code == 201, answer.json()

    def _morning(self, run_id: int) -> None:
        timer = Timer.objects.filter(run_id=run_id, step_id="morning", fired_at=None).first()
        if timer is None or not self.once("morning", run_id):
            return
        # The sleep was written as its intent and zone: it ends at 09:00 Berlin time.
        zone = ZoneInfo(code_crash_workflow.ZONE)
        assert (timer.kind, timer.zone) == ("wait_until", code_crash_workflow.ZONE)
        assert timer.due_at.astimezone(zone).time() == clock(9, 0), timer.due_at
        Timer.objects.filter(pk=timer.pk).update(due_at=Now())  # and the morning comes now

    def _hour_passes(self, run_id: int) -> None:
        """The late run's signal never comes: its hour passes (the database's clock)."""
        waiting = Step.objects.filter(run_id=run_id, step_id="paid", status="waiting").first()
        if waiting is None or not self.once("hour", run_id):
            return
        with connection.cursor() as cursor:
            cursor.execute("UPDATE workflows_step SET wake_at = now() - interval '1 second' "
                           "WHERE id = %s AND status = 'waiting'", [waiting.pk])  # fmt: skip

    def _click(self, run_id: int) -> None:
        """Once the approval's message is in Slack, and its request knows it, its approver
        presses a button: signed as Slack signs it, to the real interactions endpoint."""
        message = next((m for m in self.slack.messages if _effect_key(m).startswith(
            f"{run_id}/ask/1")), None)  # fmt: skip
        recorded = ApprovalRequest.objects.filter(run_id=run_id).exclude(slack_team_id="")
        if message is None or not recorded.exists() or not self.once("click", run_id):
            return
        after = last_click()
        answer = slack_post(Client(), click_payload(message))
        assert (answer.status_code, answer.json()["code"]) == (200, "received"), answer.json()
        assert click_decided(after)["code"] == "accepted", click_decided(after)

    def _day_passes(self, run_id: int) -> None:
        """The late run's approval is never answered: once its step waits on it (its message
        posted), its day passes (the database's clock). Not before it waits: the step would
        park with its deadline a day away."""
        parked = Step.objects.filter(run_id=run_id, step_id="ask", status="waiting").exists()
        pending = ApprovalRequest.objects.filter(run_id=run_id, status="pending").first()
        if not parked or pending is None or not self.once("day", run_id):
            return
        pass_deadline(pending)


def _effect_key(message: dict[str, Any]) -> str:
    key = ((message.get("metadata") or {}).get("event_payload") or {}).get("effect_key")
    return key if isinstance(key, str) else ""


@pytest.fixture
def world(org: Organisation, api: APIClient) -> Iterator[World]:
    with ExitStack() as stack:
        provider = stack.enter_context(ProviderStub(idempotent=True))
        slack = stack.enter_context(SlackStub())
        # A call's lease is its timeout and a margin: one left in flight by a dead worker is
        # reconciled once that lapses (30 s by default).
        connect(org, base_url=provider.url, options={"idempotency_keys": True},
                timeout_seconds=5)  # fmt: skip
        slack_connection(org, slack.url)
        publish_code_workflow(org=org, name=code_crash_workflow.NAME, version=1)
        yield World(org=org, api=api, provider=provider, slack=slack)
        assert not provider.errors and not slack.errors, (provider.errors, slack.errors)


def run_input(world: World, order: str) -> dict[str, Any]:
    return {"order": order, "url": world.provider.url}


def start(world: World, order: str) -> int:
    body = {"automation": code_crash_workflow.NAME, "input": run_input(world, order),
            "start_key": order}  # fmt: skip
    answer = world.api.post("/api/v1/runs", body, format="json")
    assert answer.status_code in (200, 201), answer.json()
    return int(answer.json()["id"])


def start_and_die(world: World, order: str, log: Path) -> None:
    """A process starts a run and dies as the start commits (run_start.after_commit)."""
    script = (
        "import json, sys; from workflows.models import Organisation; "
        "from workflows.services.runs import run_start; "
        f"run_start(org=Organisation.objects.get(pk={world.org.pk}), "
        f"automation_slug={code_crash_workflow.NAME!r}, start_key={order!r}, "
        f"run_input=json.loads({json.dumps(json.dumps(run_input(world, order)))}))"
    )
    with log.open("ab") as out:
        starter = subprocess.Popen([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT,
                                   env=engine_env(**ENV, WAYMARK_CRASH_AT="run_start.after_commit"),
                                   stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    assert exit_code(starter) == CRASHED


def ended(run_ids: list[int]) -> bool:
    return not Run.objects.filter(pk__in=run_ids, status="running").exists()


def drive(world: World, engine: Engine, *, until_crash: bool) -> None:
    """Play the outside world until a process of ``engine`` died (``until_crash``), or until
    the runs ended."""
    deadline = time.monotonic() + BOUND
    while True:
        if until_crash and engine.crashed():
            return
        if not until_crash:
            assert not engine.crashed(), "a process without a crash point died"
            if ended(world.runs()):
                return
        world.act()
        if until_crash and ended(world.runs()):
            raise AssertionError("the runs ended and no process reached the crash point")
        assert time.monotonic() < deadline, f"still going after {BOUND}s: {stuck(world.runs())}"
        time.sleep(0.1)


def stuck(run_ids: list[int]) -> str:
    rows = Step.objects.filter(run_id__in=run_ids).exclude(status="done").order_by("id")
    steps = [(s.run_id, s.step_id, s.status, s.wait_kind, s.error[:200]) for s in rows]
    effects = Effect.objects.filter(run_id__in=run_ids).values_list("run_id", "step_id", "state")
    return f"steps not done {steps}, effects {list(effects)}\n" + "\n".join(
        events_of(run_id) for run_id in run_ids
    )


# --- the matrix -----------------------------------------------------------------------------


@pytest.mark.parametrize("point", MATRIX)
def test_a_code_workflow_killed_at_a_crash_point_ends_as_its_code_says(
    world: World, point: str, tmp_path: Path
) -> None:
    log = tmp_path / "engine.log"
    if point == "run_start.after_commit":
        start_and_die(world, "o-receiving", log)
        assert Run.objects.filter(org=world.org, start_key="o-receiving").count() == 1
    world.receiving = start(world, "o-receiving")  # again, for that point: the same run
    world.late = start(world, "o-late")
    world.send_signal()
    assert Run.objects.filter(org=world.org).count() == 2

    if point != "run_start.after_commit":
        doomed = Engine(log, WAYMARK_CRASH_AT=point)
        try:
            drive(world, doomed, until_crash=True)
        finally:
            doomed.stop()  # the dead one's work stays as it died; the others hand theirs back
            doomed.kill()
    heirs = Engine(log)
    try:
        drive(world, heirs, until_crash=False)
    finally:
        heirs.stop()
        heirs.kill()

    assert_ended_as_the_code_says(world)
    assert_each_effect_once(world)
    text = log.read_text(errors="replace")
    alarms = [line for line in text.splitlines() if any(a in line for a in LOG_ALARMS)]
    assert not alarms, text[-6000:]


def assert_ended_as_the_code_says(world: World) -> None:
    receiving = Run.objects.get(pk=world.receiving)
    assert (receiving.status, receiving.error) == ("succeeded", ""), stuck(world.runs())
    (item,) = [i for i in world.provider.created if i["key"].startswith(f"{world.receiving}/")]
    assert receiving.output == {"charge": item["id"], "paid": {"amount": 12},
                                "approved_by": "alice",
                                "pair": ["left", ["right", "deep"]]}  # fmt: skip
    late = Run.objects.get(pk=world.late)
    assert late.status == "compensated"  # its code failed it: the charge was refunded
    assert late.error.endswith("workflow_failed: not approved (timed_out), payment timed out"), (
        late.error
    )


# What a step's events say on its way, not at its end.
ON_THE_WAY = ("step.ready", "step.claimed", "step.released", "step.deferred", "step.waiting",
              "step.retry_scheduled", "step.retry_later", "step.retry_due")  # fmt: skip


def ended_once(run_id: int, step_id: str) -> bool:
    """Whether the step's events say it moved on once: each of its other events
    (step.succeeded, step.timer_fired, step.approval, step.deadline_passed, ...) at most
    once, and at least one of them."""
    rows = RunEvent.objects.filter(run_id=run_id, step_id=step_id, kind__startswith="step.")
    kinds = Counter(rows.exclude(kind__in=ON_THE_WAY).values_list("kind", flat=True))
    return bool(kinds) and set(kinds.values()) == {1}


def events_of(run_id: int) -> str:
    rows = RunEvent.objects.filter(run_id=run_id).order_by("id")
    return "\n".join(f"{step_id} {kind}" for step_id, kind in rows.values_list("step_id", "kind"))


def assert_each_effect_once(world: World) -> None:
    for run_id in world.runs():
        # The charge made once, whatever attempts reached the stub under its key.
        made = [i for i in world.provider.created if i["key"].startswith(f"{run_id}/charge/1")]
        assert len(made) == 1, world.provider.created
        # One Slack message and one request, decided once: approved in Slack, or expired.
        posted = [m for m in world.slack.messages if _effect_key(m).startswith(f"{run_id}/ask/1")]
        assert len(posted) == 1, [_effect_key(m) for m in world.slack.messages]
        (request,) = ApprovalRequest.objects.filter(run_id=run_id)
        accepted = DecisionAttempt.objects.filter(approval=request, accepted=True)
        approved = run_id == world.receiving
        assert (request.status, accepted.count()) == (
            ("approved", 1) if approved else ("expired", 0)
        )
        # Each step the code called entered once, and ended once.
        # (The deciders' turns aside: the run's and each ctx.parallel branch's.)
        steps = Step.objects.filter(run_id=run_id).exclude(type="code")
        entered = [s.step_id for s in steps]
        called = {"accepted", "ask", "charge", "morning", "paid", "pair", "left", "deeper",
                  "right", "deep"}  # fmt: skip
        assert called <= set(entered), entered
        assert len(entered) == len(set(entered)), entered  # none entered twice
        assert {s.status for s in steps} == {"done"}, stuck([run_id])
        for step_id in ("accepted", "charge", "morning", "paid", "ask"):
            assert ended_once(run_id, step_id), events_of(run_id)
        settled = RunEvent.objects.filter(run_id=run_id, kind="effect.settled")
        refunded = [] if approved else ["refund"]
        assert sorted(settled.values_list("step_id", flat=True)) == ["ask", "charge", *refunded]
        assert Timer.objects.filter(run_id=run_id, fired_at__isnull=False).count() == 1
    # The late run failed: its charge undone, once.
    refunds = [i["body"] for i in world.provider.created if "refund" in (i["body"] or {})]
    (late_charge,) = [i["id"] for i in world.provider.created
                      if i["key"].startswith(f"{world.late}/charge/1")]  # fmt: skip
    assert refunds == [{"refund": late_charge}], refunds
    assert Signal.objects.get(org=world.org, identity="pay-1").consumed_by == (
        f"{world.receiving}/paid/1"
    )
