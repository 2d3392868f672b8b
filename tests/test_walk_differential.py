"""Every path that walks a run writes what the ordinary walk writes, for every step type.

The fast paths (a settle's hop, a group of hops, the one-statement start) walk ahead of
their transaction and send the walk's writes in one statement. For each registered step
type, here as the step *after* a worker step (``a``, a noop, then ``b`` of the type) and as
a run's first step, each fast path and the ordinary walk settle runs of the same
definition with the same input, and the rows they write (the run, its steps, events,
timers, effects, approval requests, signals and outbox rows) must be the same once ids and
the run's own numbers are set aside. A type the fast paths may not run ahead
(``StepType.runs_ahead``) must be handed to the ordinary walk, never half-walked; one that
may must really take the fast path, so that the comparison compares something.

Every registered step type must have an entry in ``FOLLOWERS``: a new step type joins this
test in the same change.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from effects.models import Connection
from workflows import plugins
from workflows.code.registry import host_publishing
from workflows.definitions.registry import registry
from workflows.engine import hops
from workflows.engine.executors import StepResult
from workflows.engine.lanes import lane_policy
from workflows.engine.steps import (
    ClaimedStep,
    claim,
    release,
    settle_and_take_next,
    settled_by_hop,
)
from workflows.engine.walk import TakeNext
from workflows.models import Organisation, Run
from workflows.plugins.code import workflow as code_workflow
from workflows.services import runs as run_service
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

# In autocommit, as workers and the API settle and start (a test's own transaction would
# hide a step type that needs the walk's: the fast paths run outside any).
pytestmark = pytest.mark.django_db(transaction=True)

DONE = {"id": "done", "type": "end", "output": {"n": "{{ steps.a.output.n }}"}}
ANY_OUTCOME = {"next": "done"}


def _mapped(*outcomes: str) -> dict[str, Any]:
    return {"next": {outcome: "done" for outcome in outcomes}}


# --- plugin step types of this test: a host project's, declaring nothing or declaring pure


def _stamp(step: Any, context: Any, ctx: plugins.StepContext) -> plugins.StepResult:
    """An inline type that reads the database (as a plugin may, inside the walk's
    transaction) and says nothing of fast paths: they must hand it to the ordinary walk."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now() AS at")
        (at,) = cursor.fetchone()
    return plugins.StepResult(output={"at": at.isoformat(), "input": context["input"]})


def _echo(step: Any, context: Any, ctx: plugins.StepContext) -> plugins.StepResult:
    return plugins.StepResult(output={"echo": plugins.render(step.get("say", ""), context)})


def _no_fields(step: Any, report: plugins.StepReport) -> None:
    plugins.check_fields(step, report, ("say",))


STAMP = plugins.StepType(name="test_stamp", lane="inline", validate=_no_fields, execute=_stamp,
                         built=True, app="tests")  # fmt: skip
ECHO = plugins.StepType(name="test_echo", lane="inline", validate=_no_fields, execute=_echo,
                        built=True, app="tests", pure=True)  # fmt: skip
PLUGIN_TYPES = (STAMP, ECHO)

# Each step type as the step "b": its fields (and steps it needs beside it).
FOLLOWERS: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    "set": ({"values": {"seen": "{{ steps.a.output.n }}"}, **ANY_OUTCOME}, []),
    "branch": (
        {"when": [{"outcome": "big", "if": "steps.a.output.n > 3"}], **_mapped("big", "default")},
        [],
    ),
    "end": ({"output": {"n": "{{ steps.a.output.n }}"}}, []),
    "noop": ({"output": "{{ steps.a.output.n }}", **ANY_OUTCOME}, []),
    "probe": (ANY_OUTCOME, []),
    "wait_signal": (
        {
            "signal": "go",
            "correlation": "{{ input.k }}",
            "timeout": "1h",
            **_mapped("received", "timed_out"),
        },
        [],
    ),
    "parallel": (
        {"branches": ["p1", "p2"], "next": "j"},
        [
            {"id": "p1", "type": "noop", "next": "j"},
            {"id": "p2", "type": "set", "values": {"p2": True}, "next": "j"},
            {"id": "j", "type": "join", "wait_for": ["p1", "p2"], "next": "done"},
        ],
    ),
    "join": ({"wait_for": ["a"], **ANY_OUTCOME}, []),
    "wait": ({"duration": "1h", **ANY_OUTCOME}, []),
    "wait_until": (
        {
            "rule": {"weekdays": ["mon"], "time": "09:30"},
            "timezone": "Europe/Berlin",
            **ANY_OUTCOME,
        },
        [],
    ),
    "http": (
        {
            "request": {
                "method": "POST",
                "url": "https://crm.example/items",
                "body": {"n": "{{ steps.a.output.n }}"},
            },
            **ANY_OUTCOME,
        },
        [],
    ),
    "email": (
        {
            "to": "ada@example.com",
            "subject": "Hi",
            "body": "n={{ steps.a.output.n }}",
            "connection": "mail",
            **ANY_OUTCOME,
        },
        [],
    ),
    "slack_message": (
        {
            "channel": "C0123",
            "text": "n={{ steps.a.output.n }}",
            "connection": "slack",
            **ANY_OUTCOME,
        },
        [],
    ),
    "model": ({"prompt": "n={{ steps.a.output.n }}", "connection": "llm", **ANY_OUTCOME}, []),
    "crm_upsert": (
        {"object": "contacts", "external_id": "{{ input.k }}", "connection": "crm", **ANY_OUTCOME},
        [],
    ),
    "approval": (
        {
            "approvers": ["*"],
            "message": "n={{ steps.a.output.n }}?",
            "deadline": "1h",
            **_mapped("approved", "rejected", "timed_out"),
        },
        [],
    ),
    "task": (
        {
            "assignees": ["*"],
            "message": "Fill in",
            "deadline": "1h",
            "form": {"fields": [{"name": "x", "type": "text"}]},
            **_mapped("submitted", "timed_out"),
        },
        [],
    ),
    # A code workflow's types: its decider beside other steps fails the run both ways
    # (code_step_alone); the record of a ctx.run result is a pure inline step.
    "code": ({"workflow": "differential-code", "version": 1, **ANY_OUTCOME}, []),
    "code_result": ({"output": {"n": 5}, **ANY_OUTCOME}, []),
    "test_stamp": (ANY_OUTCOME, []),
    "test_echo": ({"say": "{{ steps.a.output.n }}", **ANY_OUTCOME}, []),
}


@code_workflow("differential-code", version=1)
def _differential_code(ctx: Any, run_input: Any) -> Any:
    return run_input


CONNECTIONS = {"mail": "email", "slack": "slack_message", "llm": "model", "crm": "crm_upsert"}


@pytest.fixture(autouse=True)
def as_host() -> Iterator[None]:
    """The definitions here are published as the host would (a `code` step among them)."""
    with host_publishing():
        yield


@pytest.fixture(autouse=True)
def plugin_types() -> Iterator[None]:
    for step_type in PLUGIN_TYPES:
        plugins.register_step_type(step_type)
    yield
    for step_type in PLUGIN_TYPES:
        registry._types.pop(step_type.name, None)  # registered for these tests only


def _steps_from_b(type_name: str) -> list[dict[str, Any]]:
    fields, beside = FOLLOWERS[type_name]
    return [
        {"id": "b", "type": type_name, **fields},
        *beside,
        *([DONE] if "next" in fields else []),
    ]


def after_a_worker_step(type_name: str) -> dict[str, Any]:
    return {"start": "a", "steps": [
        {"id": "a", "type": "noop", "output": {"n": 5}, "next": "b"}, *_steps_from_b(type_name),
    ]}  # fmt: skip


def as_first_step(type_name: str) -> dict[str, Any]:
    """The type as a run's first step: what read ``a``'s output reads the input instead."""
    text = json.dumps({"start": "b", "steps": _steps_from_b(type_name)}).replace(
        "steps.a.output.n", "input.n"
    )
    definition: dict[str, Any] = json.loads(
        text.replace('"wait_for": ["a"]', '"wait_for": ["done"]')
    )
    return definition


def test_every_registered_step_type_is_compared() -> None:
    others = {t.name for t in registry if t.app == "tests"} - set(FOLLOWERS)
    assert set(registry.names()) - others == set(FOLLOWERS)


# --- the rows a run wrote, without what differs between two runs of the same input --------

ID_KEYS = frozenset({"timer", "approval", "task", "effect", "run", "run_id", "step", "id",
                     "step_row", "fork_join", "join_row"})  # fmt: skip
ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d")
ROW_ID = re.compile(r"^(timer|approval|task|effect|run|step):\d+$")


def _plain(value: Any, run_id: int) -> Any:
    """A JSON value with row ids replaced (they differ between runs, not their meaning)."""
    if isinstance(value, dict):
        return {k: "<id>" if k in ID_KEYS and isinstance(v, int | str) and str(v).isdigit()
                else _plain(v, run_id) for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_plain(v, run_id) for v in value]
    if isinstance(value, str) and value[:1] in "{[":
        with contextlib.suppress(ValueError):
            return _plain(json.loads(value), run_id)  # a json column, read as text
    if isinstance(value, str) and ISO_TIME.match(value):
        return datetime.fromisoformat(value)
    if isinstance(value, str):
        value = ROW_ID.sub(r"\1:<id>", value)
        return re.sub(rf"^{run_id}/", "<run>/", value)
    return value


# Columns that hold ids, or times that are not the transaction's (now() is one instant in a
# test's transaction, so wake-ups, leases and due times compare exactly).
SKIP = frozenset({"id", "run_id", "org_id", "step_row_id", "fork_join_id", "connection_id",
                  "at", "created_at", "updated_at", "received_at", "token", "key", "digest",
                  "content"})  # fmt: skip
TABLES = ("workflows_step", "workflows_runevent", "timers_timer", "effects_effect",
          "approvals_approvalrequest", "workflows_signal")  # fmt: skip


def _rows(cursor: Any, table: str, where: str, params: list[Any], run_id: int) -> list[Any]:
    cursor.execute(f"SELECT * FROM {table} WHERE {where} ORDER BY id", params)  # noqa: S608
    names = [c.name for c in cursor.description]
    return [
        {n: _plain(v, run_id) for n, v in zip(names, row, strict=True) if n not in SKIP}
        for row in cursor.fetchall()
    ]


def written(run_id: int, outbox_after: int) -> dict[str, Any]:
    with connection.cursor() as cursor:
        found = {t: _rows(cursor, t, "run_id = %s", [run_id], run_id) for t in TABLES}
        found["workflows_run"] = _rows(cursor, "workflows_run", "id = %s", [run_id], run_id)
        for row in found["workflows_run"]:
            for name in ("automation_id", "version_id", "start_key", "input_digest"):
                row.pop(name, None)
        found["workflows_outbox"] = [
            row for row in _rows(cursor, "workflows_outbox", "id > %s", [outbox_after], run_id)
            if f"{run_id}" in str(row.get("payload"))
        ]  # fmt: skip
    return found


# Two runs settle a few milliseconds apart: a time compares equal within this (a wait's due
# time, a lease's end), while a different duration or a missing time does not.
SAME_TIME = timedelta(seconds=5)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, datetime) and isinstance(b, datetime):
        return abs(a - b) <= SAME_TIME
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def differences(rows: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """What differs, row by row and field by field (empty: the same rows)."""
    found = []
    for table in sorted(reference):
        mine, theirs = rows.get(table, []), reference[table]
        if len(mine) != len(theirs):
            found.append(f"{table}: {len(mine)} rows, the ordinary walk wrote {len(theirs)}")
        for n, (row, ref) in enumerate(zip(mine, theirs, strict=False)):
            changed = {k: (row.get(k), ref.get(k)) for k in ref if not same(row.get(k), ref.get(k))}
            if changed:
                found.append(f"{table} row {n}: (this path, the ordinary walk): {changed}")
    return found


def outbox_mark() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(max(id), 0) FROM workflows_outbox")
        return int(cursor.fetchone()[0])


class PlanSpy:
    """Which settles the fast paths planned as hops (hops.plan_hop answered a plan): the
    hop statement then writes them, or hands them back if the run changed meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.planned: list[int] = []
        real = hops.plan_hop

        def spied(step: ClaimedStep, *args: Any, **kwargs: Any) -> Any:
            plan = real(step, *args, **kwargs)
            if plan is not None:
                self.planned.append(step.run_id)
            return plan

        monkeypatch.setattr(hops, "plan_hop", spied)


# --- driving a run to the settle of its first worker step, by each path ---------------------

IO = lane_policy("io")


def setup_org(org: Organisation) -> None:
    for name, provider in CONNECTIONS.items():
        Connection.objects.create(org=org, name=name, provider=provider,
                                  base_url="https://provider.example/")  # fmt: skip


INPUT = {"k": "customer-1", "n": 5}  # the same for every run compared


def started(org: Organisation, slug: str, key: str) -> Run:
    return Run.objects.get(pk=run_start(org=org, automation_slug=slug,
                                        run_input=INPUT, start_key=key).run_id)  # fmt: skip


def claimed_a(run: Run) -> ClaimedStep:
    """The run's step ``a``, claimed (any other run's io step claimed meanwhile handed back)."""
    steps = claim(policy=IO, worker="w", limit=50)
    mine = [s for s in steps if s.run_id == run.pk and s.step_id == "a"]
    release(held=[(s.id, s.attempt) for s in steps if s not in mine], worker="other")
    assert len(mine) == 1, f"run {run.pk}: step a is not ready"
    return mine[0]


def ordinary(step: ClaimedStep, other: ClaimedStep, take: TakeNext | None) -> object:
    # Without the run row's version the settle cannot hop: it walks the ordinary way.
    return settle_and_take_next(replace(step, run_seen=None), RESULT, worker="w", take=take)


def alone(step: ClaimedStep, other: ClaimedStep, take: TakeNext | None) -> object:
    return settle_and_take_next(step, RESULT, worker="w", take=take)


def in_a_group(step: ClaimedStep, other: ClaimedStep, take: TakeNext | None) -> object:
    """With another run's hop in one statement (hops_together), as a busy worker settles;
    what the group hands back is settled alone, as group_settle.py does."""
    planned = hops.plan_hop(step, RESULT, worker="w", take=take)
    other_planned = hops.plan_hop(other, RESULT, worker="w", take=take)
    assert other_planned is not None
    if planned is None:
        return alone(step, other, take)
    answer = hops.hops_together([planned, other_planned], take)[0]
    return settled_by_hop(step, answer) if answer is not None else alone(step, other, take)


Settle = Callable[[ClaimedStep, ClaimedStep, TakeNext | None], object]
PATHS: dict[str, Settle] = {"hop": alone, "group": in_a_group}
TAKES = {"no take": None, "take io": TakeNext(worker="w", lane="io", lease_seconds=30)}
RESULT = StepResult(output={"n": 5}, vars={"from_a": True})


def settle_by(path: Settle, run: Run, filler: Run, take: TakeNext | None) -> dict[str, Any]:
    step, other = claimed_a(run), claimed_a(filler)
    mark = outbox_mark()
    path(step, other, take)
    return written(run.pk, mark)


@pytest.mark.parametrize("take_name", TAKES)
@pytest.mark.parametrize("type_name", sorted(FOLLOWERS))
def test_the_fast_paths_write_what_the_ordinary_walk_writes_after_a_worker_step(
    org: Organisation, type_name: str, take_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_org(org)
    take = TAKES[take_name]
    automation_publish_definition(org=org, slug="pair", definition=after_a_worker_step(type_name))
    automation_publish_definition(org=org, slug="filler", definition={
        "start": "a", "steps": [{"id": "a", "type": "noop", "next": "done"}, DONE]})  # fmt: skip
    reference = settle_by(
        ordinary, started(org, "pair", "ordinary"), started(org, "filler", "filler"), take
    )
    spy = PlanSpy(monkeypatch)
    for name, path in PATHS.items():
        run, filler = started(org, "pair", name), started(org, "filler", f"filler-{name}")
        rows = settle_by(path, run, filler, take)
        assert not differences(rows, reference), (
            f"{type_name} after a worker step, by {name} ({take_name}): "
            + "; ".join(differences(rows, reference))
        )
        took_fast_path = run.pk in spy.planned
        assert took_fast_path == takes_fast_path(type_name, take), (
            f"{type_name}: the {name} path {'took' if took_fast_path else 'did not take'} "
            f"the fast path ({take_name})"
        )


def takes_fast_path(type_name: str, take: TakeNext | None) -> bool:
    """Whether a hop settles ``a`` here: never when the type may not run ahead; when it may,
    unless the walk must wake a lane (a worker step not taken by the settling worker),
    which only the ordinary walk's flush does."""
    step_type = registry.get(type_name)
    assert step_type is not None
    if not step_type.runs_ahead():
        return False
    return step_type.lane == "inline" or (take is not None and take.lane == step_type.lane)


def _start_ordinary(org: Organisation, slug: str, key: str) -> Run:
    run_service._LAST_SEEN.seen.clear()  # nothing seen: the start looks the version up
    return started(org, slug, key)


def _start_in_one_trip(org: Organisation, slug: str, key: str) -> Run:
    started(org, slug, f"{key}-primer")  # this process now knows the automation's version
    return started(org, slug, key)


@pytest.mark.parametrize("type_name", sorted(FOLLOWERS))
def test_the_one_statement_start_writes_what_the_ordinary_start_writes(
    org: Organisation, type_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_org(org)
    in_one_trip: list[bool] = []
    real = run_service.start_in_one_trip

    def spied(*args: Any, **kwargs: Any) -> Any:
        rows = real(*args, **kwargs)
        in_one_trip.append(rows is not None)
        return rows

    monkeypatch.setattr(run_service, "start_in_one_trip", spied)
    definition = as_first_step(type_name)
    automation_publish_definition(org=org, slug="first", definition=definition)
    mark = outbox_mark()
    reference_run = _start_ordinary(org, "first", "ordinary")
    reference = written(reference_run.pk, mark)
    mark = outbox_mark()
    fast_run = _start_in_one_trip(org, "first", "fast")
    rows = written(fast_run.pk, mark)
    assert not differences(rows, reference), f"{type_name} first: " + "; ".join(
        differences(rows, reference)
    )
    # A worker step first goes in one statement; an inline one reads the run's context (or
    # may not run ahead) and goes the ordinary way.
    step_type = registry.get(type_name)
    assert step_type is not None
    assert in_one_trip[-1] == (step_type.lane != "inline"), in_one_trip
