"""Every built step type as a fragment of a definition, to compose them (`A → B → end`, a loop
through one) and know in advance what a run of the composition must do: the steps it enters
(its path), the effects that reach the stubs (once per pass), the output it ends with.

A fragment's steps take the ids ``<sid>`` and ``<sid>_<part>``; a path it must never take
goes to the end ``off`` (status failed), so a wrong turn fails the run instead of passing
unnoticed. Runs take `run_input()`: ``go`` (1: a branch's condition holds), ``at`` (a
moment a second from now, for wait_until) and ``api`` (the provider stub's URL).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workflows.models import Run

from .engine_harness import Harness, Script, Waiting

DONE, OFF = "done", "off"
SIGNAL = "matrix.go"

# The built step types (probe, test-only, aside), and wait_signal a second time: its
# timeout firing, with no signal sent.
KINDS = (
    "set", "branch", "end", "noop", "wait_signal", "wait_signal_timeout", "parallel", "join",
    "http", "email", "slack_message", "model", "crm_upsert", "wait", "wait_until", "approval",
    "task",
)  # fmt: skip
# Two more ways into and out of a step, used beside the matrix: a signal sent before the run
# waits for it (kept, taken when the step is entered), and an http call whose answer was
# lost (needs_review), resolved through the API, which wakes its step.
# And a call refused for good (a 404) that goes on along its declared failure path: its
# `failed` outcome, or `on_failure`.
VARIANTS = ("wait_signal_early", "http_review", "http_failed", "http_on_failure")
REVIEW_PATH = "/echo/review"  # the provider stub drops the answer (see run_plans)
Step = dict[str, Any]


@dataclass
class Fragment:
    steps: list[Step]
    path: list[str]  # the step ids a pass enters
    keyed: list[str] = field(default_factory=list)  # effects counted by key at the stubs
    prompts: list[str] = field(default_factory=list)  # model steps, counted by prompt marker
    silent: list[str] = field(default_factory=list)  # wait_signal steps left to time out
    early: list[str] = field(default_factory=list)  # wait_signal steps signalled at the start
    reviewed: list[str] = field(default_factory=list)  # effects resolved after a lost answer
    failed: list[str] = field(default_factory=list)  # steps that fail, and the run goes on
    ends: bool = False  # an end step: the run stops here

    @property
    def entry(self) -> str:
        return str(self.steps[0]["id"])


def fragment(kind: str, sid: str, nxt: str) -> Fragment:
    """The step type ``kind`` as step(s) starting at ``sid`` that go on to ``nxt``."""
    return BUILDERS[kind](sid, nxt)


def _set(sid: str, nxt: str) -> Fragment:
    return Fragment([{"id": sid, "type": "set", "values": {sid: "{{ input.go }}"}, "next": nxt}],
                    [sid])  # fmt: skip


def _branch(sid: str, nxt: str) -> Fragment:
    step = {"id": sid, "type": "branch", "when": [{"outcome": "go", "if": "input.go == 1"}],
            "next": {"go": nxt, "default": OFF}}  # fmt: skip
    return Fragment([step], [sid])


def _end(sid: str, nxt: str) -> Fragment:
    return Fragment([{"id": sid, "type": "end", "output": {"ended": sid}}], [sid], ends=True)


def _noop(sid: str, nxt: str) -> Fragment:
    return Fragment([{"id": sid, "type": "noop", "next": nxt}], [sid])


def _wait_signal(sid: str, nxt: str) -> Fragment:
    step = {"id": sid, "type": "wait_signal", "signal": SIGNAL,
            "correlation": "{{ run.id }}-" + sid, "timeout": "10m",
            "next": {"received": nxt, "timed_out": OFF}}  # fmt: skip
    return Fragment([step], [sid])


def _wait_signal_timeout(sid: str, nxt: str) -> Fragment:
    step = {"id": sid, "type": "wait_signal", "signal": SIGNAL,
            "correlation": "{{ run.id }}-" + sid, "timeout": "1s",
            "next": {"received": OFF, "timed_out": nxt}}  # fmt: skip
    return Fragment([step], [sid], silent=[sid])


def _wait_signal_early(sid: str, nxt: str) -> Fragment:
    # A short timeout, to the failing end: a signal kept but not taken shows in seconds.
    step = {"id": sid, "type": "wait_signal", "signal": SIGNAL,
            "correlation": "{{ run.id }}-" + sid, "timeout": "5s",
            "next": {"received": nxt, "timed_out": OFF}}  # fmt: skip
    return Fragment([step], [sid], early=[sid])


def _parallel(sid: str, nxt: str) -> Fragment:
    left, right, join = f"{sid}_l", f"{sid}_r", f"{sid}_join"
    steps: list[Step] = [
        {"id": sid, "type": "parallel", "branches": [left, right], "next": join},
        {"id": left, "type": "set", "values": {left: "1"}, "next": join},
        {"id": right, "type": "noop", "next": join},
        {"id": join, "type": "join", "wait_for": [left, right], "next": nxt},
    ]
    return Fragment(steps, [sid, left, right, join])


def _join(sid: str, nxt: str) -> Fragment:
    # Outside a fork a join passes through; it must wait for some step: its own id will do.
    return Fragment([{"id": sid, "type": "join", "wait_for": [sid], "next": nxt}], [sid])


def _http(sid: str, nxt: str) -> Fragment:
    request = {"method": "POST", "url": "{{ input.api }}/items", "body": {"step": sid}}
    step = {"id": sid, "type": "http", "connection": "api", "request": request, "next": nxt}
    return Fragment([step], [sid], keyed=[sid])


def _http_review(sid: str, nxt: str) -> Fragment:
    request = {"method": "POST", "url": "{{ input.api }}" + REVIEW_PATH, "body": {"step": sid}}
    step = {"id": sid, "type": "http", "connection": "plain", "request": request, "next": nxt}
    return Fragment([step], [sid], keyed=[sid], reviewed=[sid])


def _http_failed(sid: str, nxt: str) -> Fragment:
    request = {"method": "POST", "url": "{{ input.api }}/missing", "body": {"step": sid}}
    step = {"id": sid, "type": "http", "connection": "api", "request": request,
            "next": {"ok": OFF, "failed": nxt}}  # fmt: skip
    return Fragment([step], [], keyed=[sid], failed=[sid])


def _http_on_failure(sid: str, nxt: str) -> Fragment:
    made = _http_failed(sid, nxt)
    made.steps[0] |= {"next": OFF, "on_failure": nxt}
    return made


def _email(sid: str, nxt: str) -> Fragment:
    step = {"id": sid, "type": "email", "connection": "mail", "to": "ada@example.com",
            "subject": "Run {{ run.id }}", "body": "From " + sid, "next": nxt}  # fmt: skip
    return Fragment([step], [sid], keyed=[sid])


def _slack(sid: str, nxt: str) -> Fragment:
    step = {"id": sid, "type": "slack_message", "connection": "slack", "channel": "C0MATRIX",
            "text": "Run {{ run.id }} at " + sid, "next": nxt}  # fmt: skip
    return Fragment([step], [sid], keyed=[sid])


def _model(sid: str, nxt: str) -> Fragment:
    step = {"id": sid, "type": "model", "connection": "model",
            "prompt": model_marker("{{ run.id }}", sid), "next": nxt}  # fmt: skip
    return Fragment([step], [sid], prompts=[sid])


def _crm(sid: str, nxt: str) -> Fragment:
    step = {"id": sid, "type": "crm_upsert", "connection": "crm", "object": "contacts",
            "external_id": "{{ run.id }}-" + sid, "fields": {"step": sid}, "next": nxt}  # fmt: skip
    return Fragment([step], [sid], keyed=[sid])


def _wait(sid: str, nxt: str) -> Fragment:
    return Fragment([{"id": sid, "type": "wait", "duration": "1s", "next": nxt}], [sid])


def _wait_until(sid: str, nxt: str) -> Fragment:
    return Fragment([{"id": sid, "type": "wait_until", "at": "{{ input.at }}", "next": nxt}],
                    [sid])  # fmt: skip


def _approval(sid: str, nxt: str) -> Fragment:
    outcomes = {"approved": nxt, "rejected": OFF, "timed_out": OFF}
    step = {"id": sid, "type": "approval", "approvers": ["*"], "message": "May " + sid + "?",
            "deadline": "1h", "next": outcomes}  # fmt: skip
    return Fragment([step], [sid])


def _task(sid: str, nxt: str) -> Fragment:
    form = {"fields": [{"name": "note", "type": "text", "required": True}]}
    outcomes = {"submitted": nxt, "timed_out": OFF}
    step = {"id": sid, "type": "task", "assignees": ["*"], "message": "Fill " + sid,
            "form": form, "deadline": "1h", "next": outcomes}  # fmt: skip
    return Fragment([step], [sid])


BUILDERS: dict[str, Callable[[str, str], Fragment]] = {
    "set": _set, "branch": _branch, "end": _end, "noop": _noop, "wait_signal": _wait_signal,
    "wait_signal_timeout": _wait_signal_timeout, "parallel": _parallel, "join": _join,
    "http": _http, "email": _email, "slack_message": _slack, "model": _model,
    "crm_upsert": _crm, "wait": _wait, "wait_until": _wait_until, "approval": _approval,
    "task": _task, "wait_signal_early": _wait_signal_early, "http_review": _http_review,
    "http_failed": _http_failed, "http_on_failure": _http_on_failure,
}  # fmt: skip
assert set(BUILDERS) == {*KINDS, *VARIANTS}


def model_marker(run_id: int | str, sid: str) -> str:
    return f"[{run_id}/{sid}]"


# --- compositions -----------------------------------------------------------------------------


@dataclass
class Plan:
    """A definition and what every run of it must do."""

    name: str
    definition: dict[str, Any]
    path: Counter[tuple[str, int]]  # (step id, iteration) of each step row, all done
    keyed: set[tuple[str, int]]  # each effect reaches its stub once, key run/step/iteration
    prompts: Counter[str]  # model steps: completions asked, one per pass
    silent: set[str]  # wait_signal steps the test does not answer
    output: Any
    cancelled: set[str] = field(default_factory=set)  # rows an end cancels (a fork's join)
    failed: set[str] = field(default_factory=set)  # rows that fail while the run goes on
    early: set[str] = field(default_factory=set)  # wait_signal steps signalled at the start
    reviewed: set[tuple[str, int]] = field(default_factory=set)  # effects resolved by the test


def _plan(name: str, start: str, passes: list[list[Fragment]], extra: list[Step],
          output: Any, limits: dict[str, Any] | None = None) -> Plan:  # fmt: skip
    """``passes``: the fragments each pass of the run goes through (one pass, or one per
    loop turn, the same fragments again); the definition holds each fragment once."""
    unique = {id(f): f for fragments in passes for f in fragments}  # loops repeat them
    steps = [s for f in unique.values() for s in f.steps] + extra
    ends = []  # only the ends some step goes to: an unreachable step is refused
    if any(_targets(s, DONE) for s in steps):
        ends.append({"id": DONE, "type": "end", "output": {"ended": DONE}})
    if any(_targets(s, OFF) for s in steps):
        ends.append({"id": OFF, "type": "end", "status": "failed", "output": {"ended": OFF}})
    definition: dict[str, Any] = {"start": start, "steps": steps + ends}
    if limits:
        definition["limits"] = limits
    path: Counter[tuple[str, int]] = Counter()
    keyed: set[tuple[str, int]] = set()
    prompts: Counter[str] = Counter()
    reviewed: set[tuple[str, int]] = set()
    turns: Counter[str] = Counter()
    for fragments in passes:
        for f in fragments:
            for sid in [*f.path, *f.failed]:
                turns[sid] += 1
                if sid in f.path:  # a failed step's row is not among the done ones
                    path[(sid, turns[sid])] += 1
            keyed |= {(sid, turns[sid]) for sid in f.keyed}
            reviewed |= {(sid, turns[sid]) for sid in f.reviewed}
            prompts.update(f.prompts)
    if not any(f.ends for f in passes[-1]):
        path[(DONE, 1)] += 1
    silent = {sid for f in unique.values() for sid in f.silent}
    early = {sid for f in unique.values() for sid in f.early}
    failed = {sid for f in unique.values() for sid in f.failed}
    return Plan(name, definition, path, keyed, prompts, silent, output, early=early,
                reviewed=reviewed, failed=failed)  # fmt: skip


def _targets(step: Step, target: str) -> bool:
    nxt = step.get("next")
    return nxt == target or (isinstance(nxt, dict) and target in nxt.values())


def pair(a: str, b: str) -> Plan:
    """``a → b → end``. After a parallel, ``b`` is one of its branches (the other is a set),
    or its join when ``b`` is one."""
    name = f"{a}->{b}"
    if a == "parallel":
        return _parallel_then(b, name)
    second = fragment(b, "b", DONE)
    first = fragment(a, "a", second.entry)
    output = {"ended": "b" if second.ends else DONE}
    return _plan(name, "a", [[first, second]], [], output)


def _parallel_then(b: str, name: str) -> Plan:
    if b == "join":
        first = fragment("parallel", "a", DONE)
        return _plan(name, "a", [[first]], [], {"ended": DONE})
    second = fragment(b, "b", "a_join")
    fork = Fragment(
        [
            {"id": "a", "type": "parallel", "branches": ["a_l", second.entry], "next": "a_join"},
            {"id": "a_l", "type": "set", "values": {"a_l": "1"}, "next": "a_join"},
            {"id": "a_join", "type": "join", "wait_for": ["a_l", second.entry], "next": DONE},
        ],
        ["a", "a_l"],
    )
    if second.ends:  # the end ends the run: its join, waiting for the branches, is cancelled
        plan = _plan(name, "a", [[fork, second]], [], {"ended": "b"})
        plan.cancelled = {"a_join"}
        return plan
    joined = Fragment([], ["a_join"])
    return _plan(name, "a", [[fork, second, joined]], [], {"ended": DONE})


def loop(*kinds: str, turns: int = 2) -> Plan:
    """The chain ``kinds`` (ids s1, s2, …) entered ``turns`` times: ``s1 → … → count →
    again → back to s1``, then the end."""
    body = _chain_fragments(kinds, "count")
    count = {"id": "count", "type": "set", "values": {"turns": "{{ vars.turns | default('') }}x"},
             "next": "again"}  # fmt: skip
    again = {"id": "again", "type": "branch",
             "when": [{"outcome": "back", "if": f"vars.turns | length < {turns}"}],
             "next": {"back": body[0].entry, "default": DONE}}  # fmt: skip
    counting = Fragment([], ["count", "again"])
    name = f"loop({' -> '.join(kinds)})"
    return _plan(name, body[0].entry, [[*body, counting]] * turns, [count, again],
                 {"ended": DONE}, limits={"max_steps": 100})  # fmt: skip


def chain(*kinds: str) -> Plan:
    """``k1 → k2 → … → end``, ids s1, s2, …"""
    fragments = _chain_fragments(kinds, DONE)
    output = {"ended": fragments[-1].entry if fragments[-1].ends else DONE}
    return _plan(" -> ".join(kinds), fragments[0].entry, [fragments], [], output)


def fork(branches: tuple[str, ...], then: tuple[str, ...] = ()) -> Plan:
    """``parallel(b1, b2, …) → join → t1 → … → end``: one step per branch (ids p1, p2, …),
    the chain ``then`` after the join (ids s1, s2, …)."""
    after = _chain_fragments(then, DONE) if then else []
    arms = [fragment(kind, f"p{index}", "join") for index, kind in enumerate(branches, 1)]
    assert not any(arm.ends for arm in arms), "an end in a branch ends the run: use pair()"
    heads = [arm.entry for arm in arms]
    head = Fragment(
        [
            {"id": "fork", "type": "parallel", "branches": heads, "next": "join"},
            {"id": "join", "type": "join", "wait_for": heads,
             "next": after[0].entry if after else DONE},
        ],
        ["fork"],
    )  # fmt: skip
    name = f"parallel({', '.join(branches)}) -> join" + "".join(f" -> {k}" for k in then)
    return _plan(name, "fork", [[head, *arms, Fragment([], ["join"]), *after]], [],
                 {"ended": after[-1].entry if after and after[-1].ends else DONE})  # fmt: skip


def _chain_fragments(kinds: tuple[str, ...], last: str) -> list[Fragment]:
    fragments: list[Fragment] = []
    nxt = last
    for index in range(len(kinds), 0, -1):
        made = fragment(kinds[index - 1], f"s{index}", nxt)
        fragments.insert(0, made)
        nxt = made.entry
    return fragments


# --- running and checking -----------------------------------------------------------------------


def run_input(harness: Harness) -> dict[str, Any]:
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    return {"go": 1, "at": soon.isoformat(), "api": harness.stubs.provider.url}


def script_for(plans: dict[int, Plan]) -> Script:
    """Answer every signal but those a plan leaves to time out (or sent at the start);
    approve, fill every form; resolve the effects a plan has lose their answer as done."""

    def signal(waiting: Waiting) -> dict[str, Any] | None:
        plan = plans[waiting.run_id]
        if waiting.step_id in plan.silent | plan.early:
            return None
        return {"from": "test"}

    def review(waiting: Waiting) -> dict[str, Any] | None:
        if (waiting.step_id, waiting.iteration) not in plans[waiting.run_id].reviewed:
            return None
        return {"action": "done", "result": {"status": 201, "body": {"resolved": True}}}

    return Script(signal=signal, review=review)


def problems(harness: Harness, run: Run, plan: Plan) -> list[str]:
    """How the run differs from its plan (nothing: it did what its definition says)."""
    found = []
    if (run.status, run.error, run.output) != ("succeeded", "", plan.output):
        found.append(f"run {run.status} {run.error!r} output {run.output!r}")
    # The engine's own rows (a walk continued after a pause: "~continue") are not steps.
    rows = [row for row in harness.path(run.pk) if not row[0].startswith("~")]
    # A done step keeps the message of an attempt deferred on the way (a connection at its
    # concurrency cap): only the engine's own failure is one here.
    errors = [(s, e) for s, e in _step_errors(run) if "engine_error" in e]
    if errors:
        found.append(f"engine errors {errors}")
    taken = Counter((sid, it) for sid, it, status in rows if status == "done")
    others = [(sid, status) for sid, _, status in rows if status != "done"]
    allowed = {(sid, "cancelled") for sid in plan.cancelled} | {(s, "failed") for s in plan.failed}
    unexpected = [row for row in others if row not in allowed]
    if taken != plan.path or unexpected:
        found.append(f"path {rows}, expected {sorted(plan.path.elements())}")
    keys = harness.effect_keys(run.pk)
    expected = Counter({f"{run.pk}/{sid}/{it}": 1 for sid, it in plan.keyed})
    if keys != expected:
        found.append(f"effects at the stubs {dict(keys)}, expected {dict(expected)}")
    for sid, times in plan.prompts.items():
        asked = harness.model_hits(model_marker(run.pk, sid))
        if asked != times:
            found.append(f"model step {sid} asked {asked} times, expected {times}")
    return found


def _step_errors(run: Run) -> list[tuple[str, str]]:
    return list(run.steps.values_list("step_id", "error"))


def run_plans(harness: Harness, plans: list[Plan], *, timeout: float = 240.0
              ) -> dict[str, list[str]]:  # fmt: skip
    """Publish every plan, start one run of each, answer them, wait for them all: the
    problems of each plan that has any."""
    return finish_plans(harness, start_plans(harness, plans), timeout=timeout)


def start_plans(harness: Harness, plans: list[Plan]) -> dict[int, Plan]:
    """Publish every plan and start one run of each (sending the signals meant to arrive
    first): the plan of each run."""
    slugs = [harness.publish(plan.definition) for plan in plans]
    lost = sum(len(plan.reviewed) for plan in plans)
    if lost:
        harness.stubs.provider.drop_next(lost, path_prefix=REVIEW_PATH)
    started = {}
    for slug, plan in zip(slugs, plans, strict=True):
        run_id = harness.start(slug, run_input(harness))
        started[run_id] = plan
        for sid in plan.early:  # at once: before a run that waits first gets to its step
            harness.send_signal(SIGNAL, f"{run_id}-{sid}", f"early/{run_id}/{sid}", {"at": "start"})
    return started


def finish_plans(harness: Harness, started: dict[int, Plan], *, timeout: float = 240.0
                 ) -> dict[str, list[str]]:  # fmt: skip
    """Answer the runs until they all finish: the problems of each plan that has any."""
    finished = harness.wait_finished(started, script=script_for(started), timeout=timeout)
    found = {}
    for run_id, plan in started.items():
        wrong = problems(harness, finished[run_id], plan)
        if wrong:
            found[f"{plan.name} (run {run_id})"] = wrong
    return found
