"""What a tenant must not learn: the engine's hosts and process ids, heap addresses, Python's
internals in error messages; and what operators must not drown in (DisallowedHost tracebacks).
"""

from __future__ import annotations

import logging
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from workflows.definitions.expressions import ExpressionError, render_template
from workflows.models import Organisation, RunEvent, Step
from workflows.services.automations import automation_publish_definition

from .processes import ROOT, spawn_worker, wait_for

ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def _publish(org: Organisation, slug: str, template: str) -> None:
    definition = {
        "start": "a",
        "steps": [
            {"id": "a", "type": "set", "values": {"x": template}, "next": "b"},
            {"id": "b", "type": "end"},
        ],
    }
    automation_publish_definition(org=org, slug=slug, definition=definition)


def _failed_run(api: APIClient, slug: str, run_input: dict[str, Any]) -> dict[str, Any]:
    answer = api.post("/api/v1/runs", {"automation": slug, "input": run_input}, format="json")
    assert answer.status_code == 201, answer.content
    run: dict[str, Any] = api.get(answer.json()["links"]["self"]).json()
    assert run["status"] == "failed"
    return run


# --- the engine's host and process ids -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_steps_and_history_do_not_name_the_worker_process(org, api, procs) -> None:
    definition = {
        "start": "work",
        "steps": [
            {"id": "work", "type": "probe", "sleep_seconds": 1.5, "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }
    automation_publish_definition(org=org, slug="slow", definition=definition)
    run_id = api.post("/api/v1/runs", {"automation": "slow"}, format="json").json()["id"]
    worker = spawn_worker()
    procs.append(worker)
    owner = f"{socket.gethostname()}:{worker.pid}:"

    def claimed() -> bool:
        step = Step.objects.get(run_id=run_id, step_id="work")
        return step.status == "running" and owner in (step.owner or "")

    wait_for(claimed, what="the worker to claim the step")
    answers = [api.get(f"/api/v1/runs/{run_id}{tail}") for tail in ("", "/steps", "/history")]
    wait_for(lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "succeeded")
    answers += [api.get(f"/api/v1/runs/{run_id}{tail}") for tail in ("", "/history")]

    # The engine recorded it (the admin shows it); the tenant API shows neither it nor a field.
    assert RunEvent.objects.filter(run_id=run_id, worker__startswith=owner).exists()
    for answer in answers:
        assert answer.status_code == 200
        assert owner not in answer.content.decode()
        assert f":{worker.pid}:" not in answer.content.decode()
    detail = answers[0].json()
    assert "owner" not in detail["steps"][0]
    assert all("worker" not in event for event in answers[-1].json()["results"])


# --- template errors -------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("template", "code"),
    [
        ("{{ input.s.translate }}", "not_renderable"),
        ("{{ [input.s.upper] }}", "not_renderable"),
        ("{{ input.s.upper ~ '' }}", "not_renderable"),
        ("{{ 10 ** 5000 }}", "number_too_large"),
        ("{{ input.n ** 3000 }}", "number_too_large"),
    ],
)
def test_a_failing_template_names_a_code_and_no_python_internals(
    org, api, template: str, code: str
) -> None:
    _publish(org, "t", template)
    run = _failed_run(api, "t", {"s": "text", "n": 99})
    assert f"template error: {code}: " in run["error"]
    for text in (run["error"], run["steps"][0]["error"], str(run["history"])):
        assert not ADDRESS.search(text), text
        assert "sys." not in text and "set_int_max_str_digits" not in text
        assert "built-in method" not in text


@pytest.mark.parametrize(
    "template",
    [
        "{{ input.s.translate }}",
        "{{ input.s['upper'] }}",
        "{{ input.s | attr('upper') }}",
        "{{ input.s.upper | string }}",
        "{{ input.s.upper | pprint }}",
        "{{ '%s' % input.s.upper }}",
        "{{ '{}'.format(input.s.upper) }}",
        "{{ '{0.upper}'.format(input.s) }}",
        "{{ input.l | map(attribute='upper') | list }}",
        "{{ {'k': input.d.items} }}",
        "{% for x in input.l %}{{ loop.cycle }}{% endfor %}",
        "{% macro m() %}x{% endmacro %}{{ m }}",
    ],
)
def test_a_method_or_macro_is_never_rendered(template: str) -> None:
    context = {"input": {"s": "ab", "l": ["x"], "d": {}}}
    with pytest.raises(ExpressionError) as raised:
        render_template(template, context)
    assert raised.value.code == "not_renderable"
    assert not ADDRESS.search(str(raised.value))


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ input.s.upper() }}", "AB"),
        ("{{ input.l | map('upper') }}", "['X', 'Y']"),
        ("{{ input.l | reverse }}", "['y', 'x']"),
        ("{{ input.l | select | join(',') }}", "x,y"),
        ("{{ input.d.items() | list }}", "[('k', 1)]"),
        ("{% macro m() %}hi{% endmacro %}{{ m() }}", "hi"),
        ("{{ input.s.upper is callable }}", "True"),
    ],
)
def test_calling_methods_and_filters_still_renders_data(template: str, expected: str) -> None:
    context = {"input": {"s": "ab", "l": ["x", "y"], "d": {"k": 1}}}
    assert render_template(template, context) == expected


@pytest.mark.parametrize(
    ("template", "code"),
    [
        ("{{ 1 / 0 }}", "division_by_zero"),
        ("{{ 10.0 ** 400 }}", "number_too_large"),
        ("{{ input.s + 1 }}", "invalid_operation"),
        ("{{ input.nope }}", "undefined_value"),
        ("{{ input.s.__class__ }}", "not_allowed"),
    ],
)
def test_render_errors_carry_stable_codes(template: str, code: str) -> None:
    with pytest.raises(ExpressionError) as raised:
        render_template(template, {"input": {"s": "ab"}})
    assert raised.value.code == code
    assert str(raised.value).startswith(f"{code}: ")
    assert "Error:" not in str(raised.value)  # no "ZeroDivisionError: …"


# --- DisallowedHost --------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.django_db
def test_a_disallowed_host_is_one_warning_without_traceback_and_a_json_400() -> None:
    logger = logging.getLogger("django.security.DisallowedHost")
    handler = _Records()
    logger.addHandler(handler)
    try:
        response = APIClient().get("/api/v1/runs", HTTP_HOST="evil.example")
    finally:
        logger.removeHandler(handler)
    assert response.status_code == 400
    assert response.json()["code"] == "bad_request"
    [record] = handler.records
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    assert "evil.example" in record.getMessage()


# --- .env --------------------------------------------------------------------------------------


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout"
)
def test_env_files_are_ignored_by_git_except_the_example() -> None:
    def ignored(name: str) -> bool:
        check = ["git", "check-ignore", "-q", "--no-index", name]
        return subprocess.run(check, cwd=ROOT, check=False).returncode == 0

    assert ignored(".env")
    assert ignored(".env.production")
    assert ignored(str(Path("waymark_config") / ".env"))
    assert not ignored(".env.example")
