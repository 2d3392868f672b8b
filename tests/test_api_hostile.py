"""Hostile input found by fuzzing the API: each gets a JSON 4xx, never a 500."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from workflows.models import Automation, AutomationVersion, Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

pytestmark = pytest.mark.django_db

QUICK = {"start": "done", "steps": [{"id": "done", "type": "end"}]}


@pytest.fixture
def quick(org) -> Automation:
    return automation_publish_definition(org=org, slug="quick", definition=QUICK).automation


def post(api: APIClient, path: str, raw: str):
    return api.post(path, raw, content_type="application/json")


@pytest.mark.parametrize(
    "raw_input",
    [
        r'{"name": "a\u0000b"}',
        r'{"a\u0000": 1}',
        r'{"name": "\ud800"}',
        r'{"\udfff": 1}',
        r'{"deep": [{"x": "ok"}, {"y": "\u0000"}]}',
    ],
)
def test_unstorable_text_in_the_input_is_refused(api, quick, raw_input: str) -> None:
    for key in ('"start_key": "k1", ', ""):  # an explicit key, and a derived one
        response = post(
            api, "/api/v1/runs", f'{{"automation": "quick", {key}"input": {raw_input}}}'
        )
        assert response.status_code == 400, response.content
        assert response.json()["code"] == "invalid_input"
        assert "cannot be stored" in response.json()["detail"]
    assert not Run.objects.exists()


@pytest.mark.parametrize("text", [r"x\u0000", r"\udbff"])
def test_unstorable_text_in_a_definition_is_refused(api, quick, text: str) -> None:
    steps = '[{"id": "a", "type": "end"}]'
    raw = f'{{"definition": {{"start": "a", "description": "{text}", "steps": {steps}}}}}'
    response = post(api, "/api/v1/automations/quick/versions", raw)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_definition"
    assert body["errors"][0]["field"] == "description"
    assert AutomationVersion.objects.count() == 1


def test_a_template_rendering_a_nul_fails_the_run_not_the_request(api, org) -> None:
    definition = {
        "start": "a",
        "steps": [
            {"id": "a", "type": "set", "values": {"x": "{{ '\\x00' }}"}, "next": "b"},
            {"id": "b", "type": "end"},
        ],
    }
    automation_publish_definition(org=org, slug="tnul", definition=definition)
    response = api.post("/api/v1/runs", {"automation": "tnul", "input": {}}, format="json")
    assert response.status_code == 201
    assert response.json()["status"] == "failed"
    body = api.get(response.json()["links"]["self"]).json()
    assert "cannot be stored" in body["error"]


def test_reserved_start_keys_are_refused(api, quick) -> None:
    response = api.post(
        "/api/v1/runs",
        {"automation": "quick", "start_key": "input:1:abc", "input": {}},
        format="json",
    )
    assert response.status_code == 400
    assert "reserved" in response.json()["errors"]["start_key"][0]


@pytest.mark.parametrize(
    "query",
    [
        "automation=a%00",
        "automation=has%20space",
        "status=bogus",
        "cursor=cD1hYmM%3D",  # p=abc
        "cursor=cD0A",  # p=\x00
        "cursor=garbage",
    ],
)
def test_bad_run_list_queries_are_400(api, quick, query: str) -> None:
    response = api.get(f"/api/v1/runs?{query}")
    assert response.status_code == 400, query
    assert response.json()["code"] == "invalid_input"


def test_too_many_query_fields_is_a_json_400(api) -> None:
    query = "&".join(f"a{i}=1" for i in range(1100))
    response = api.get(f"/api/v1/runs?{query}")
    assert response.status_code == 400
    assert response.json()["code"] == "bad_request"


def test_a_disallowed_host_is_a_json_400(api) -> None:
    response = api.get("/api/v1/runs", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert json.loads(response.content)["code"] == "bad_request"


# --- text an answer repeats, names in the path, instants at the calendar's edge ----------------


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/api/v1/runs", r'{"automation": "quick", "\ud800": 1}'),
        ("/api/v1/signals", r'{"name": "a", "start": {"automation": "quick", "\udfff": 1}}'),
        ("/api/v1/approvals/1/decide", r'{"decision": "\ud800"}'),
        ("/api/v1/connections", r'{"name": "c", "provider": "http", "\ud800x": 1}'),
    ],
)
def test_a_lone_surrogate_an_error_repeats_is_a_400_not_a_500(
    api, quick, path: str, raw: str
) -> None:
    """Valid JSON that UTF-8 cannot carry, repeated by the error (an unknown field's name, a
    choice refused): the answer escapes it instead of failing to render."""
    response = post(api, path, raw)
    assert response.status_code == 400, response.content
    assert json.loads(response.content)["code"] in ("invalid_input", "invalid_decision")
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("path", "code"),
    [("/api/v1/connections/a%00b", "unknown_connection"),
     ("/api/v1/connections/a%00b/check", "unknown_connection"),
     ("/api/v1/schedules/a%00b", "unknown_schedule")],
)  # fmt: skip
def test_a_nul_in_a_name_in_the_path_names_nothing(api, path: str, code: str) -> None:
    for method in ("get", "post", "patch", "delete"):
        response = getattr(api, method)(path, {}, format="json")
        if response.status_code == 405:
            continue
        assert (response.status_code, response.json()["code"]) == (404, code), (method, path)


@pytest.mark.parametrize("instant", ["0001-01-01T00:00:00Z", "0001-01-01", "0001-01-01T00:04:59Z"])
def test_runs_created_after_the_calendars_first_minutes_are_every_run(
    api, quick, org, instant: str
) -> None:
    started = run_start(org=org, automation_slug="quick", run_input={}, start_key="k").run_id
    response = api.get("/api/v1/runs", {"created_after": instant})
    assert response.status_code == 200, response.content
    assert [run["id"] for run in response.json()["results"]] == [started]


def test_a_signal_with_start_under_another_signals_id_starts_nothing(api, org) -> None:
    waits = {"start": "w", "steps": [
        {"id": "w", "type": "wait_signal", "signal": "go", "correlation": "{{ input.k }}",
         "timeout": "1h", "next": {"received": "done", "timed_out": "done"}},
        {"id": "done", "type": "end"}]}  # fmt: skip
    automation_publish_definition(org=org, slug="waits", definition=waits)
    first = api.post("/api/v1/signals", {"name": "other", "correlation": "c1", "id": "sig-1"},
                     format="json")  # fmt: skip
    assert first.status_code == 201, first.content
    start = {"automation": "waits", "start_key": "s-1", "input": {"k": "z"}}

    reused = api.post("/api/v1/signals", {"name": "go", "correlation": "z", "id": "sig-1",
                                          "start": start}, format="json")  # fmt: skip

    assert (reused.status_code, reused.json()["code"]) == (409, "signal_id_conflict")
    assert not Run.objects.filter(start_key="s-1").exists()
    # The same signal-with-start sent again (its own id) is its duplicate: one run.
    for _ in range(2):
        sent = api.post("/api/v1/signals", {"name": "go", "correlation": "z", "id": "sig-2",
                                            "start": start}, format="json")  # fmt: skip
        assert sent.status_code in (200, 201), sent.content
    assert Run.objects.filter(start_key="s-1").count() == 1


def test_a_start_key_of_another_automation_says_so(api, quick, org) -> None:
    automation_publish_definition(org=org, slug="quick2", definition=QUICK)
    assert api.post("/api/v1/runs", {"automation": "quick", "start_key": "k1", "input": {}},
                    format="json").status_code == 201  # fmt: skip
    other = api.post("/api/v1/runs", {"automation": "quick2", "start_key": "k1", "input": {}},
                     format="json")  # fmt: skip
    assert (other.status_code, other.json()["code"]) == (409, "start_key_conflict")
    assert "of another automation" in other.json()["detail"]
