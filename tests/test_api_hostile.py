"""Hostile input found by fuzzing the API: each gets a JSON 4xx, never a 500."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from workflows.models import Automation, AutomationVersion, Run
from workflows.services.automations import automation_publish_definition

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
