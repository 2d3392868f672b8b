"""End-to-end runs on the real engine: `manage.py runengine --no-web` as processes, the local
stub servers as the outside world, and the test as the user, through the API.

A test makes a `Harness` (see the `harness` fixture in tests that use it), publishes
definitions and starts runs through the API (a DRF APIClient on the test database: the
engine itself runs as separate processes, so every row it sees was committed), answers what
the runs wait for (signals, approvals, tasks) through the API as they come, waits for every
run to finish, and checks what happened: the runs' paths, the effects counted at the stubs,
and the engine's own log (no traceback, no `engine_error`).

Every wait is bounded and polls for the event; nothing sleeps for a time tuned to a machine.
Kept generic on purpose: the pairwise matrix, the documented examples and generated
automations all drive runs through it.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from effects.models import Effect, EgressAllow
from workflows.models import Organisation, Run, Step
from workflows.services.tenancy import api_key_create

from .processes import ROOT, engine_env, kill_tree
from .stubs import ModelStub, ProviderStub, SlackStub, SmtpStub

TERMINAL = ("succeeded", "failed", "cancelled")
SLACK_TOKEN = "xoxb-stub"  # what SlackStub accepts by default
LOG_ALARMS = ("Traceback", "engine_error")
# Room for every run of a batch to call at once: a step deferred at a connection's cap (4 by
# default) looks again only when the oldest call's lease would lapse, up to 30 s later.
SPACIOUS = {"max_concurrency": 64}


# --- the engine as processes ------------------------------------------------------------------


class Engine:
    """`manage.py runengine --no-web` (relay, sweep, a worker and a suspects-only worker per
    lane, supervised), on the test database with fast polling. Every child inherits the
    supervisor's stdout and stderr, so one log file holds what all of them said."""

    def __init__(self, log_path: Path, **env: str) -> None:
        self.log_path = log_path
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Engine:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "runengine", "--no-web", "--grace", "2"],
                cwd=ROOT, env=engine_env(**self.env), stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self

    def stop(self) -> None:
        """SIGTERM (children stop within the grace), then kill what is left."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=20)
        kill_tree(process)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self, start: int = 0) -> str:
        """What the engine wrote, from byte ``start`` on."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(start)
            return log.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def assert_clean_log(self, start: int = 0) -> None:
        text = self.log(start)
        alarms = [line for line in text.splitlines() if any(a in line for a in LOG_ALARMS)]
        assert not alarms, f"the engine's log ({self.log_path}) has:\n" + _tail_around(text)


def _tail_around(text: str, limit: int = 6000) -> str:
    """The log from its first alarm on (a traceback says most at its start), cut to a size a
    failure message can carry."""
    first = min((text.find(a) for a in LOG_ALARMS if a in text), default=0)
    return text[max(0, first - 500) : first + limit]


# --- the outside world ------------------------------------------------------------------------


@dataclass
class Stubs:
    provider: ProviderStub  # http steps and crm_upsert (PUT /contacts/...)
    smtp: SmtpStub
    slack: SlackStub
    model: ModelStub

    def errors(self) -> list[str]:
        return [*self.provider.errors, *self.slack.errors, *self.model.errors]


@contextmanager
def stub_servers() -> Iterator[Stubs]:
    with ExitStack() as stack:
        stubs = Stubs(
            provider=stack.enter_context(ProviderStub(idempotent=True)),
            smtp=stack.enter_context(SmtpStub()),
            slack=stack.enter_context(SlackStub()),
            model=stack.enter_context(ModelStub()),
        )
        yield stubs
        assert not stubs.errors(), stubs.errors()


def connections_for(stubs: Stubs) -> list[dict[str, Any]]:
    """One connection per provider, named as the matrix's definitions name them, plus the
    names the documented examples use (payments, mailer)."""
    smtp = {"host": stubs.smtp.host, "port": stubs.smtp.port, "from_address": "wm@example.com"}
    http: dict[str, Any] = {
        "provider": "http", "base_url": stubs.provider.url, "options": {"idempotency_keys": True}
    }  # fmt: skip
    mail: dict[str, Any] = {"provider": "email", "options": smtp}
    slack: dict[str, Any] = {
        "provider": "slack_message", "secret": SLACK_TOKEN, "base_url": stubs.slack.url + "/api/"
    }  # fmt: skip
    model: dict[str, Any] = {
        "provider": "model", "base_url": stubs.model.url + "/v1", "options": {"model": "stub-1"}
    }  # fmt: skip
    crm: dict[str, Any] = {"provider": "crm_upsert", "base_url": stubs.provider.url}
    # No idempotency keys, no lookup: a call whose answer was lost waits for a person.
    plain: dict[str, Any] = {"provider": "http", "base_url": stubs.provider.url}
    named = [("api", http), ("payments", http), ("mail", mail), ("mailer", mail),
             ("slack", slack), ("model", model), ("crm", crm), ("plain", plain)]  # fmt: skip
    return [{"name": name, **settings} for name, settings in named]


# --- what the runs wait for -------------------------------------------------------------------


@dataclass(frozen=True)
class Waiting:
    """A step of a run that waits for the test: a signal, an approval or a task."""

    run_id: int
    step_id: str
    iteration: int


def send_every_signal(waiting: Waiting) -> dict[str, Any] | None:
    return {"from": "test"}


def approve_all(waiting: Waiting) -> str | None:
    return "approve"


def leave_for_review(waiting: Waiting) -> dict[str, Any] | None:
    return None


def fill_form(waiting: Waiting, form: Mapping[str, Any]) -> dict[str, Any] | None:
    """An answer that passes the form: a plausible value for every field."""
    return {f["name"]: _plausible(f) for f in form.get("fields", [])}


def _plausible(form_field: Mapping[str, Any]) -> Any:
    kind = form_field.get("type")
    if kind == "number":
        return form_field.get("min", 1)
    if kind == "date":
        return "2030-01-02"
    if kind == "choice":
        return form_field["choices"][0]
    if kind == "file_name":
        return "scan.pdf"
    return "ok"


@dataclass
class Script:
    """How the test answers what runs wait for, decided per waiting step. None leaves it
    unanswered (a signal's or a request's timeout then decides)."""

    signal: Callable[[Waiting], dict[str, Any] | None] = send_every_signal
    decision: Callable[[Waiting], str | None] = approve_all  # "approve" | "reject"
    answer: Callable[[Waiting, Mapping[str, Any]], dict[str, Any] | None] = fill_form
    # An effect in needs_review: the body of POST /effects/{id}/resolve, or None to leave it.
    review: Callable[[Waiting], dict[str, Any] | None] = leave_for_review


# --- the user -------------------------------------------------------------------------------


@dataclass
class Harness:
    org: Organisation
    api: APIClient
    stubs: Stubs
    engine: Engine
    log_from: int = 0  # where this harness's part of the engine's log starts
    answered: set[tuple[str, Waiting]] = field(default_factory=set)
    _slugs: Iterator[int] = field(default_factory=itertools.count)

    # --- set-up -------------------------------------------------------------------------

    def connect(self, connections: Iterable[Mapping[str, Any]]) -> None:
        """Create connections through the API; the stubs listen on loopback, which an
        organisation must allowlist (admin only, so written directly)."""
        EgressAllow.objects.get_or_create(org=self.org, entry="127.0.0.1/32")
        for body in connections:
            self.call("POST", "/api/v1/connections", {**SPACIOUS, **body}, expect=201)

    def publish(self, definition: Mapping[str, Any], slug: str | None = None) -> str:
        """Create an automation, add the definition as a draft and publish it: the slug."""
        slug = slug or f"auto-{next(self._slugs)}"
        self.call("POST", "/api/v1/automations", {"slug": slug}, expect=201)
        version = self.call("POST", f"/api/v1/automations/{slug}/versions",
                            {"definition": definition}, expect=201)  # fmt: skip
        self.call("POST", f"/api/v1/automations/{slug}/versions/{version['number']}/publish",
                  expect=200)  # fmt: skip
        return slug

    def publish_version(self, slug: str, definition: Mapping[str, Any]) -> int:
        """Add the definition to an automation as its next version and publish it: its number."""
        version = self.call("POST", f"/api/v1/automations/{slug}/versions",
                            {"definition": definition}, expect=201)  # fmt: skip
        self.call("POST", f"/api/v1/automations/{slug}/versions/{version['number']}/publish",
                  expect=200)  # fmt: skip
        return int(version["number"])

    def start(self, slug: str, run_input: Mapping[str, Any] | None = None,
              start_key: str | None = None) -> int:  # fmt: skip
        body: dict[str, Any] = {"automation": slug, "input": dict(run_input or {})}
        if start_key is not None:
            body["start_key"] = start_key
        return int(self.call("POST", "/api/v1/runs", body, expect=201)["id"])

    def call(self, method: str, path: str, body: Any = None, *, expect: int | tuple[int, ...]
             ) -> Any:  # fmt: skip
        """The API's answer, after checking its status is (one of) ``expect``."""
        response = self.api.generic(method, path, _json(body), content_type="application/json")
        data = response.json() if response.content else None
        allowed = expect if isinstance(expect, tuple) else (expect,)
        assert response.status_code in allowed, f"{method} {path}: {response.status_code} {data}"
        return data

    # --- driving runs -------------------------------------------------------------------

    def wait_finished(self, run_ids: Iterable[int], *, script: Script | None = None,
                      timeout: float = 180.0) -> dict[int, Run]:  # fmt: skip
        """Answer what the runs wait for, as they come, until every run is finished (or
        fail, naming the runs still going and their live steps)."""
        script = script or Script()
        ids = set(run_ids)
        left = set(ids)
        deadline = time.monotonic() + timeout
        while left:
            assert self.engine.alive(), "the engine stopped:\n" + self.engine.log()[-3000:]
            self.drive_people_and_signals(left, script)
            left -= set(Run.objects.filter(pk__in=left, status__in=TERMINAL)
                        .values_list("pk", flat=True))  # fmt: skip
            if left and time.monotonic() > deadline:
                raise AssertionError(f"runs still going after {timeout}s: {_stuck(left)}")
            if left:
                time.sleep(0.1)
        return {run.pk: run for run in Run.objects.filter(pk__in=ids)}

    def wait_quiet(self, run_ids: Iterable[int], *, timeout: float = 60.0) -> None:
        """Until no step of the runs is ready or running: each has finished, or waits (on
        time, a signal, people, or its paused run)."""
        ids = list(run_ids)
        deadline = time.monotonic() + timeout
        while Step.objects.filter(run_id__in=ids, status__in=("ready", "running")).exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"runs still busy after {timeout}s: {_stuck(ids)}")
            time.sleep(0.1)

    def drive_people_and_signals(self, run_ids: Iterable[int], script: Script) -> None:
        """One pass: send the signals waited for, decide the approvals, answer the tasks,
        each through the API and each at most once."""
        ids = list(run_ids)
        for step in Step.objects.filter(run_id__in=ids, type="wait_signal", status="waiting"):
            self._signal(step, script)
        for request in ApprovalRequest.objects.filter(run_id__in=ids, status="pending"):
            self._decide(request, script)
        for effect in Effect.objects.filter(run_id__in=ids, state="needs_review"):
            self._review(effect, script)

    def send_signal(self, name: str, correlation: str, signal_id: str,
                    payload: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
        """POST /api/v1/signals: the answer (201 whether a step took it or it is kept)."""
        body = {"name": name, "correlation": correlation, "id": signal_id,
                "payload": dict(payload)}  # fmt: skip
        answer: dict[str, Any] = self.call("POST", "/api/v1/signals", body, expect=201)
        return answer

    def _signal(self, step: Step, script: Script) -> None:
        waiting = Waiting(step.run_id, step.step_id, step.iteration)
        detail = step.wait_detail or {}
        if ("signal", waiting) in self.answered or "signal" not in detail:
            return
        self.answered.add(("signal", waiting))
        payload = script.signal(waiting)
        if payload is None:
            return
        signal_id = f"{waiting.run_id}/{waiting.step_id}/{waiting.iteration}"
        self.send_signal(detail["signal"], detail["correlation"], signal_id, payload)

    def _review(self, effect: Effect, script: Script) -> None:
        waiting = Waiting(effect.run_id, effect.step_id, effect.iteration)
        if ("review", waiting) in self.answered:
            return
        self.answered.add(("review", waiting))
        resolution = script.review(waiting)
        if resolution is not None:
            self.call("POST", f"/api/v1/effects/{effect.pk}/resolve", resolution, expect=200)

    def _decide(self, request: ApprovalRequest, script: Script) -> None:
        waiting = Waiting(request.run_id, request.step_id, request.iteration)
        if (request.kind, waiting) in self.answered:
            return
        self.answered.add((request.kind, waiting))
        if request.kind == "task":
            answer = script.answer(waiting, request.content.get("form", {}))
            if answer is not None:
                self.call("POST", f"/api/v1/tasks/{request.pk}/submit", {"answer": answer},
                          expect=200)  # fmt: skip
            return
        decision = script.decision(waiting)
        if decision is not None:
            self.call("POST", f"/api/v1/approvals/{request.pk}/decide",
                      {"decision": decision}, expect=200)  # fmt: skip

    # --- what happened ------------------------------------------------------------------

    def path(self, run_id: int) -> list[tuple[str, int, str]]:
        """The run's step rows as (step id, iteration, status), in the order entered."""
        rows = Step.objects.filter(run_id=run_id).order_by("id")
        return [(s.step_id, s.iteration, s.status) for s in rows]

    def stub_hits(self, key: str) -> int:
        """How often an effect key reached the stubs: as an Idempotency-Key (http,
        crm_upsert), an X-Waymark-Effect-Key header (email) or a message's metadata
        (slack_message). The model API receives no key: see `model_hits`."""
        return self._keys_at_stubs().count(key)

    def effect_keys(self, run_id: int) -> Counter[str]:
        """Every effect key of the run that reached a stub, with how often (keys are
        ``run/step/iteration``)."""
        prefix = f"{run_id}/"
        return Counter(k for k in self._keys_at_stubs() if k.startswith(prefix))

    def keys_at_stubs(self) -> Counter[str]:
        """Every effect key that reached a stub, with how often: one read of every stub, for
        a caller checking many runs (``effect_keys`` reads them all for each run)."""
        return Counter(self._keys_at_stubs())

    def _keys_at_stubs(self) -> list[str]:
        seen = [r["headers"].get("idempotency-key") for r in self.stubs.provider.requests]
        seen += [m.headers.get("x-waymark-effect-key") for m in self.stubs.smtp.messages]
        seen += [_slack_key(m) for m in self.stubs.slack.messages]
        # What a provider gets is the key with a random suffix (effects/ledger.py's
        # external_key, the same on every call of one effect): the key is what precedes it.
        return [key.rpartition(":")[0] or key for key in seen if key]

    def model_hits(self, marker: str) -> int:
        """Chat completions whose prompt holds ``marker`` (a model step's prompt carries one,
        such as its run and step, since the model API gets no effect key)."""
        return sum(1 for r in self.stubs.model.requests if marker in r["raw"])

    def assert_clean_logs(self) -> None:
        self.engine.assert_clean_log(self.log_from)


def _slack_key(message: Mapping[str, Any]) -> str | None:
    payload = (message.get("metadata") or {}).get("event_payload") or {}
    key = payload.get("effect_key")
    return key if isinstance(key, str) else None


def _json(body: Any) -> str:
    return "" if body is None else json.dumps(body)


def _stuck(run_ids: Iterable[int]) -> str:
    lines = []
    for run in Run.objects.filter(pk__in=run_ids).order_by("pk")[:20]:
        live = Step.objects.filter(run=run).exclude(status__in=("done", "failed", "cancelled"))
        shown = [(s.step_id, s.iteration, s.status, s.wait_kind, s.wait_detail, s.error[:200])
                 for s in live]  # fmt: skip
        effects = list(Effect.objects.filter(run=run).values_list("step_id", "state", "error"))
        lines.append(f"\n  run {run.pk} {run.status} {run.error!r} live steps {shown}, "
                     f"effects {effects}")  # fmt: skip
    return "".join(lines)


@dataclass
class Shared:
    """What the tests of a module share: the stubs and the running engine (starting the
    engine's processes costs seconds on a small machine; each test has its own
    organisation, so its runs, keys and effects are its own)."""

    stubs: Stubs
    engine: Engine


@pytest.fixture(scope="module")
def e2e_engine(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with stub_servers() as stubs:
        # Tests lose answers on purpose (an effect for review per composition): on one
        # connection, five in a row would open its circuit and hold every call on it for the
        # cooldown (30 s). The breaker has its own tests.
        engine = Engine(log, WAYMARK_EFFECTS_CIRCUIT_FAILURES="1000").start()
        try:
            yield Shared(stubs, engine)
        finally:
            engine.stop()


@pytest.fixture
def harness(e2e_engine: Shared, org: Organisation) -> Iterator[Harness]:
    """A user of the shared engine: ``org`` with an API key and a connection to each stub.
    The test fails when the engine logged a traceback or an ``engine_error`` meanwhile."""
    made = make_harness(org, e2e_engine.stubs, e2e_engine.engine)
    yield made
    made.assert_clean_logs()


def make_harness(org: Organisation, stubs: Stubs, engine: Engine) -> Harness:
    # The matrix publishes an automation per composition: more than the default quota of
    # 200, which an operator lifts for an organisation the same way (0: no limit).
    Organisation.objects.filter(pk=org.pk).update(quota_automations=0)
    org.refresh_from_db()
    _, raw = api_key_create(org=org, name="e2e")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    made = Harness(org=org, api=api, stubs=stubs, engine=engine, log_from=engine.log_size())
    made.connect(connections_for(stubs))
    return made
