"""Structured logs: WAYMARK_LOG_FORMAT=json gives one JSON object a line, with the run, step
and organisation a line is about where they apply (workflows/engine/logcontext.py).

In this process, logging configured as the setting configures it (settings.logging_settings)
into a buffer: lines logged while a worker runs a step, and while the web serves an API
key's request. Then a real worker process started with the variable, and a bad value."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from django.conf import settings

from waymark_config.settings import logging_settings
from workflows.engine import logcontext, worker
from workflows.engine.executors import StepContext, StepResult
from workflows.models import Run
from workflows.services.automations import automation_publish_definition

from .effect_setup import drive, start
from .processes import ROOT, engine_env, wait_for
from .tracing_setup import hex_span, hex_trace, named

pytestmark = pytest.mark.django_db(transaction=True)

step_log = logging.getLogger("tests.step")
ONE_STEP = {"start": "send", "steps": [
    {"id": "send", "type": "noop", "next": "done"}, {"id": "done", "type": "end"}]}  # fmt: skip


@pytest.fixture
def json_lines(monkeypatch) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Logging as WAYMARK_LOG_FORMAT=json sets it, into a buffer; what was logged, a line
    each, parsed. Afterwards, the test settings' logging again (text, binding off)."""
    monkeypatch.setattr(logcontext, "_wanted", False)  # restored after; installing turns it on
    buffer = io.StringIO()
    config = logging_settings("json", "INFO")
    config["handlers"]["console"]["stream"] = buffer
    logging.config.dictConfig(config)
    assert logcontext.on()

    def lines() -> list[dict[str, Any]]:
        return [json.loads(line) for line in buffer.getvalue().splitlines()]

    yield lines
    logging.config.dictConfig(settings.LOGGING)


def logging_step(monkeypatch) -> None:
    """Every io step's executor logs one line and succeeds."""

    def execute(step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext):
        step_log.warning("calling out for %s", ctx.step_id)
        return StepResult(output={})

    monkeypatch.setattr(worker, "executor_for", lambda type_name: execute)


def test_a_line_logged_while_a_step_runs_names_its_run_step_and_organisation(
    org, json_lines, monkeypatch
):
    logging_step(monkeypatch)
    run_id = start(org, ONE_STEP)
    step_log.warning("before any step")
    assert drive() == 1
    assert Run.objects.get(pk=run_id).status == "succeeded"

    before, during = (line for line in json_lines() if line["logger"] == "tests.step")
    assert before.keys() == {"time", "level", "logger", "message"}
    assert during == {
        "time": during["time"], "level": "WARNING", "logger": "tests.step",
        "message": "calling out for send", "run_id": run_id, "step": "send", "iteration": 1,
        "attempt": 1, "org_id": org.pk,
    }  # fmt: skip
    assert during["time"].endswith("+00:00")  # ISO 8601, UTC


def test_with_tracing_on_a_line_carries_its_spans_ids(org, json_lines, exported, monkeypatch):
    logging_step(monkeypatch)
    start(org, ONE_STEP)
    drive()
    [during] = (line for line in json_lines() if line["logger"] == "tests.step")
    [step] = named(exported, "waymark.step")
    assert (during["trace_id"], during["span_id"]) == (hex_trace(step), hex_span(step))


def test_a_requests_lines_name_the_organisation_of_its_key_and_no_other_request(
    org, other_org, json_lines, api, client
):
    automation_publish_definition(org=org, slug="a", definition={
        "start": "done", "steps": [{"id": "done", "type": "end"}]})  # fmt: skip
    assert api.get("/api/v1/runs/999999").status_code == 404
    assert client.get("/no-such-page").status_code == 404  # no key: no organisation
    not_found = [line for line in json_lines() if line["logger"] == "django.request"]
    assert [(line["message"], line.get("org_id")) for line in not_found] == [
        ("Not Found: /api/v1/runs/999999", org.pk),
        ("Not Found: /no-such-page", None),
    ]


def test_text_logs_bind_nothing(org, monkeypatch, caplog):
    """The default format: no filter installed, and the worker binds no fields."""
    assert not logcontext.on()
    logging_step(monkeypatch)
    start(org, ONE_STEP)
    with caplog.at_level(logging.WARNING, logger="tests.step"):
        drive()
    [record] = [r for r in caplog.records if r.name == "tests.step"]
    assert not hasattr(record, "run_id")


def test_a_worker_process_logs_json_lines(procs, tmp_path):
    err = tmp_path / "worker.err"
    with err.open("wb") as sink:
        worker_process = subprocess.Popen(
            [sys.executable, "manage.py", "worker", "--lane", "io", "--concurrency", "1"],
            cwd=ROOT, stderr=sink,
            env=engine_env(WAYMARK_LOG_FORMAT="json", WAYMARK_LOG_LEVEL="INFO"),
        )  # fmt: skip
    procs.append(worker_process)
    wait_for(lambda: b"slots" in err.read_bytes(), what="the worker's first line")
    worker_process.terminate()
    assert worker_process.wait(timeout=30) == 0
    lines = [json.loads(line) for line in err.read_text().splitlines()]
    first = next(line for line in lines if "slots" in line["message"])
    assert (first["level"], first["logger"]) == ("INFO", "workflows.engine.worker")
    assert {"time", "level", "logger", "message"} <= set(first)


def test_a_format_it_does_not_know_stops_start_up():
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
        env=engine_env(WAYMARK_LOG_FORMAT="yaml"), timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 78
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("invalid_setting: WAYMARK_LOG_FORMAT must be text or json")
    )
