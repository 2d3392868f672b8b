"""The API behaves as DRF and HTTP clients expect: trailing slashes, an API root, strict query
parameters, any-case Bearer, paginated lists, lookup by start key, 406, the docs page, and
the examples of docs/how-to/call-the-api.md run against a live server."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from workflows.models import Automation, AutomationVersion, Organisation, Run
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start
from workflows.services.tenancy import api_key_create

from .factories import linear_definition

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
QUICK = {"start": "done", "steps": [{"id": "done", "type": "end", "output": "{{ input.x }}"}]}
WITH_IO = {
    "start": "work",
    "steps": [{"id": "work", "type": "noop", "next": "done"}, {"id": "done", "type": "end"}],
}


@pytest.fixture
def quick(org: Organisation) -> Automation:
    return automation_publish_definition(org=org, slug="quick", definition=QUICK).automation


def _start(api: APIClient, key: str, path: str = "/api/v1/runs") -> dict[str, Any]:
    body = {"automation": "quick", "start_key": key, "input": {"x": key}}
    response = api.post(path, body, format="json")
    assert response.status_code == 201, response.content
    answer: dict[str, Any] = response.json()
    return answer


# --- trailing slashes and the root ----------------------------------------------------------


def test_every_route_answers_with_a_trailing_slash_too(api: APIClient) -> None:
    api.post("/api/v1/automations/", {"slug": "quick"}, format="json")
    draft = {"definition": QUICK}
    assert api.post("/api/v1/automations/quick/versions/", draft, format="json").status_code == 201
    assert api.put("/api/v1/automations/quick/versions/1/", draft, format="json").status_code == 200
    assert api.post("/api/v1/automations/quick/versions/1/publish/").status_code == 200
    started = _start(api, "k1", path="/api/v1/runs/")  # the POST body is not lost
    automation_publish_definition(org=Automation.objects.get().org, slug="io", definition=WITH_IO)
    running = api.post("/api/v1/runs/", {"automation": "io"}, format="json").json()["id"]
    for path in [
        "/api/v1/automations/", "/api/v1/automations/quick/", "/api/v1/automations/quick/versions/",
        "/api/v1/automations/quick/versions/1/", "/api/v1/runs/", f"/api/v1/runs/{started['id']}/",
        f"/api/v1/runs/{started['id']}/steps/", f"/api/v1/runs/{started['id']}/history/",
    ]:  # fmt: skip
        response = api.get(path)
        assert response.status_code == 200, path
    assert api.post(f"/api/v1/runs/{running}/cancel/").json()["status"] == "cancelled"
    bulk = api.post("/api/v1/runs/bulk/cancel/", {"dry_run": True}, format="json")
    assert bulk.status_code == 200


def test_the_api_root_links_to_the_main_endpoints_without_a_key(api: APIClient) -> None:
    response = APIClient().get("/api/v1/")
    assert response.status_code == 200
    links = response.json()
    assert set(links) == {"automations", "runs", "schema", "docs"}
    assert links["runs"] == "http://testserver/api/v1/runs"
    for name in ("automations", "runs"):
        assert api.get(links[name]).status_code == 200
    assert APIClient().get(links["docs"]).status_code == 200


def test_the_root_schema_and_docs_answer_without_a_trailing_slash_too() -> None:
    # Like every other API path: the answer itself, never a redirect (Django's, an HTML
    # response) that a client must follow.
    client = APIClient()
    for bare in ("/api/v1", "/api/v1/schema"):
        response = client.get(bare)
        assert response.status_code == 200, (bare, response.status_code)
        assert response.content == client.get(f"{bare}/").content, bare
    assert client.get("/api/v1").json()["runs"] == "http://testserver/api/v1/runs"
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 200
    assert "/api/v1/schema/" in docs.content.decode()


@pytest.mark.parametrize("path", ["/api", "/api/", "/api/v2", "/api/v1/nothing"])
def test_an_unknown_api_path_is_a_json_404(path: str) -> None:
    response = APIClient().get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "not_found"


# --- query parameters -----------------------------------------------------------------------

LISTS = [
    "/api/v1/runs",
    "/api/v1/automations",
    "/api/v1/automations/quick/versions",
    "/api/v1/runs/{run}/steps",
    "/api/v1/runs/{run}/history",
]


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize("limit", ["abc", "0", "-5", "1.5", "", "1e3", "٣"])
def test_a_bad_limit_is_refused(api: APIClient, quick: Automation, path: str, limit: str) -> None:
    run = _start(api, "k")["id"]
    response = api.get(path.format(run=run), {"limit": limit})
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_query"
    assert response.json()["parameter"] == "limit"
    assert "limit" in response.json()["detail"]


@pytest.mark.parametrize("path", LISTS)
def test_an_unknown_parameter_is_refused_and_named(
    api: APIClient, quick: Automation, path: str
) -> None:
    run = _start(api, "k")["id"]
    response = api.get(path.format(run=run), {"stauts": "failed"})
    assert response.status_code == 400
    body = response.json()
    assert (body["code"], body["parameter"]) == ("invalid_query", "stauts")
    assert "stauts" in body["detail"] and "limit" in body["detail"]
    # The parameters each list does take still work.
    assert api.get(path.format(run=run), {"limit": "1000000"}).status_code == 200


def test_a_bad_filter_value_names_the_filter(api: APIClient) -> None:
    body = api.get("/api/v1/runs", {"status": "done"}).json()
    assert (body["code"], body["parameter"]) == ("invalid_input", "status")


# --- authentication scheme ------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_case_insensitive(org: Organisation, scheme: str) -> None:
    _, raw = api_key_create(org=org, name="case")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {raw}")
    assert client.get("/api/v1/runs").status_code == 200


# --- pagination of every list ---------------------------------------------------------------


def test_automations_and_versions_are_cursor_paginated(api: APIClient, org) -> None:
    for slug in ("c-three", "a-one", "b-two"):
        assert api.post("/api/v1/automations", {"slug": slug}, format="json").status_code == 201
    page = api.get("/api/v1/automations", {"limit": 2}).json()
    assert set(page) == {"next", "previous", "results"}
    assert [a["slug"] for a in page["results"]] == ["a-one", "b-two"]
    rest = api.get(page["next"]).json()
    assert [a["slug"] for a in rest["results"]] == ["c-three"]
    assert rest["next"] is None

    for letter in "abc":
        draft = {"definition": linear_definition(letter)}
        api.post("/api/v1/automations/a-one/versions", draft, format="json")
    page = api.get("/api/v1/automations/a-one/versions", {"limit": 2}).json()
    assert [v["number"] for v in page["results"]] == [3, 2]
    assert [v["number"] for v in api.get(page["next"]).json()["results"]] == [1]
    assert AutomationVersion.objects.count() == 3
    # A cursor we did not hand out is refused, whatever its position holds.
    for forged in ("cD0A", "cD0lMjc%3D", "cD1hYmM%3D"):  # p=\x00, p=', p=abc
        for path in ("/api/v1/automations", "/api/v1/automations/a-one/versions"):
            response = api.get(f"{path}?cursor={forged}")
            expected = 200 if (forged, path) == ("cD1hYmM%3D", "/api/v1/automations") else 400
            assert response.status_code == expected, (forged, path, response.content)


# --- a run by its start key -----------------------------------------------------------------


def test_a_run_is_found_by_its_start_key_exactly_and_per_organisation(
    api: APIClient, other_api: APIClient, quick: Automation, other_org: Organisation
) -> None:
    keys = ["evt_1", " evt_1", "follow-up:evt/7?&=x", "input-like:1:2"]
    ids = {key: _start(api, key)["id"] for key in keys}
    for key, run_id in ids.items():
        found = api.get("/api/v1/runs", {"start_key": key}).json()["results"]
        assert [run["id"] for run in found] == [run_id], key
        assert found[0]["start_key"] == key
    assert api.get("/api/v1/runs", {"start_key": "evt_2"}).json()["results"] == []
    # Another organisation's key finds nothing, even one it used itself.
    automation_publish_definition(org=other_org, slug="quick", definition=QUICK)
    theirs = other_api.post(
        "/api/v1/runs", {"automation": "quick", "start_key": "evt_1"}, format="json"
    ).json()["id"]
    assert other_api.get("/api/v1/runs", {"start_key": "evt_1"}).json()["results"][0]["id"] == (
        theirs
    )
    assert [r["id"] for r in api.get("/api/v1/runs?start_key=evt_1").json()["results"]] == [
        ids["evt_1"]
    ]
    bad = api.get("/api/v1/runs", {"start_key": "a\x00b"})
    assert bad.json()["code"] == "invalid_input"


# --- content negotiation --------------------------------------------------------------------


@pytest.mark.parametrize("accept", ["text/html", "application/xml", "text/csv, text/plain"])
def test_an_unsupported_accept_is_a_json_406(api: APIClient, accept: str) -> None:
    response = api.get("/api/v1/runs", HTTP_ACCEPT=accept)
    assert response.status_code == 406
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "not_acceptable"


def test_a_browser_accept_header_still_gets_json(api: APIClient) -> None:
    accept = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    assert api.get("/api/v1/runs", HTTP_ACCEPT=accept).status_code == 200


@pytest.mark.parametrize("accept", ["", " ", ","])
def test_an_empty_accept_header_means_anything_so_json(api: APIClient, accept: str) -> None:
    # RFC 9110: no media range named is no preference, not a refusal of every type.
    response = api.get("/api/v1/runs", HTTP_ACCEPT=accept)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json()["results"] == []


@pytest.mark.parametrize("path", ["/api/v1/runs", "/api/v1/runs/1", "/api/v1/"])
def test_a_format_the_endpoint_lacks_is_a_json_406_naming_the_formats(path: str) -> None:
    # DRF answered 404, as if the endpoint were not there.
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer wmk_none_none")  # refused after negotiation
    response = client.get(path, {"format": "xyz"})
    assert response.status_code == 406, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["code"] == "not_acceptable"
    assert '"xyz"' in body["detail"] and "json" in body["detail"]
    # The schema's own formats are still chosen so; another is refused the same way.
    assert client.get("/api/v1/schema/", {"format": "json"})["Content-Type"].startswith(
        "application/vnd.oai.openapi+json"
    )
    refused = client.get("/api/v1/schema/", {"format": "xyz"})
    assert refused.status_code == 406
    # An error is JSON there too, not the schema's first format (YAML).
    assert refused["Content-Type"] == "application/json", refused.content
    assert refused.json()["code"] == "not_acceptable"


def test_the_format_override_is_taken_by_lists_as_by_everything_else(api: APIClient) -> None:
    # A list refused it as an unknown filter (400 invalid_query) where a run's page took it.
    response = api.get("/api/v1/runs", {"format": "json"})
    assert response.status_code == 200, response.content
    assert response.json()["results"] == []
    assert api.get("/api/v1/runs", {"format": "json", "stauts": "x"}).json()["code"] == (
        "invalid_query"
    )


def test_406_is_in_the_documented_error_table() -> None:
    text = (ROOT / "docs" / "how-to" / "call-the-api.md").read_text()
    assert "| 406 | `not_acceptable` |" in text
    assert "| 400 | `invalid_query` |" in text


# --- the docs page --------------------------------------------------------------------------


def test_the_docs_page_is_public_and_serves_its_assets_locally() -> None:
    client = APIClient()
    page = client.get("/api/v1/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/api/v1/schema/" in html
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    for asset in assets:
        assert asset.startswith("/static/"), asset  # nothing from a CDN
        response = client.get(asset)
        assert response.status_code == 200, asset
        response.close()  # whitenoise streams the file


def test_the_schema_documents_the_run_filters_and_list_pagination() -> None:
    schema = APIClient().get("/api/v1/schema/?format=json").json()
    runs = schema["paths"]["/api/v1/runs"]["get"]
    names = {parameter["name"] for parameter in runs["parameters"]}
    assert names == {"status", "automation", "start_key", "start_key_prefix", "search",
                     "created_after", "created_before", "cursor", "limit"}  # fmt: skip
    types = {p["name"]: p["schema"] for p in runs["parameters"]}
    date_time = {"type": "string", "format": "date-time"}
    assert types["created_after"] == types["created_before"] == date_time
    # What the filters check, the schema says: a slug's pattern and length, the text's length.
    assert types["automation"] == {"type": "string", "pattern": "^[-a-zA-Z0-9_]*$", "maxLength": 63}
    assert types["search"] == {"type": "string", "maxLength": 200, "pattern": r"^(|[\s\S]{3,})$"}
    assert types["limit"] == {"type": "integer", "minimum": 1}
    search = next(p for p in runs["parameters"] if p["name"] == "search")
    assert "at least 3 characters" in search["description"]
    for path in ("/api/v1/automations", "/api/v1/automations/{slug}/versions"):
        listed = schema["paths"][path]["get"]
        assert {p["name"] for p in listed["parameters"]} >= {"cursor", "limit"}
        ref = listed["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        envelope = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert {"next", "previous", "results"} <= set(envelope["properties"])
    assert not any(path.endswith("/") and path != "/api/v1/" for path in schema["paths"])


# --- publish_automation takes both file shapes ----------------------------------------------


def test_publish_automation_takes_a_bare_or_a_wrapped_definition(
    org: Organisation, tmp_path: Path
) -> None:
    path = tmp_path / "def.json"
    publish = ["publish_automation", "--org", org.slug, "--slug", "x", "--file", str(path)]
    path.write_text(json.dumps({"definition": linear_definition("a")}))
    call_command(*publish)
    path.write_text(json.dumps(linear_definition("b")))
    call_command(*publish)
    versions = AutomationVersion.objects.order_by("number")
    assert [v.definition["start"] for v in versions] == ["a", "b"]
    for content in ([1, 2], "text", {"definition": linear_definition("c"), "x": 1},
                    {"definition": [1]}):  # fmt: skip
        path.write_text(json.dumps(content))
        with pytest.raises(CommandError, match="not_a_definition"):
            call_command(*publish)
    assert AutomationVersion.objects.count() == 2


# --- the examples of docs/how-to/call-the-api.md, run for real ---------------------------


def _example(language: str) -> str:
    text = (ROOT / "docs" / "how-to" / "call-the-api.md").read_text()
    section = text.split("## Call Waymark from another service", 1)[1]
    blocks: list[str] = re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, f"one {language} example"
    return blocks[0]


def _curl_commands(block: str) -> list[str]:
    lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return [line for line in lines if not line.lstrip().startswith("#")]


@pytest.fixture
def service(live_server, org: Organisation) -> dict[str, str]:
    definition = {
        "start": "done",
        "steps": [{"id": "done", "type": "end", "output": {"to": "{{ input.email }}"}}],
    }
    automation_publish_definition(org=org, slug="follow-up", definition=definition)
    _, raw = api_key_create(org=org, name="docs")
    return {"WAYMARK_URL": live_server.url, "WAYMARK_KEY": raw}


@pytest.mark.django_db(transaction=True)
def test_the_python_example_runs_against_a_live_server(service: dict[str, str], monkeypatch):
    for name, value in service.items():
        monkeypatch.setenv(name, value)
    code = compile(_example("python"), "docs/how-to/call-the-api.md", "exec")
    first: dict[str, Any] = {}
    second: dict[str, Any] = {}
    try:
        exec(code, first)  # noqa: S102
        exec(code, second)  # noqa: S102  (a redelivered webhook: the same run, not another)
    finally:
        # A kept-alive connection would keep a server thread, and its database session.
        for namespace in (first, second):
            if "waymark" in namespace:
                namespace["waymark"].close()
    assert first["started"]["created"] is True
    assert first["run"]["status"] == "succeeded"
    assert first["run"]["output"] == {"to": "ada@example.com"}
    assert first["failed"] == []
    assert second["started"]["created"] is False
    assert second["run"]["id"] == second["found"]["results"][0]["id"] == first["run"]["id"]


@pytest.mark.django_db(transaction=True)
def test_the_curl_example_runs_against_a_live_server(service: dict[str, str]) -> None:
    env = {**os.environ, **service}
    answers = []
    for command in _curl_commands(_example("sh")):
        done = subprocess.run(
            ["bash", "-c", command], env=env, capture_output=True, text=True, check=True
        )
        answers.append(json.loads(done.stdout))
        env.setdefault("RUN_ID", str(answers[0]["id"]))
    started, detail, found, failed = answers
    assert started["created"] is True and started["status"] == "succeeded"
    assert detail["id"] == started["id"] and detail["output"] == {"to": "ada@example.com"}
    assert [run["id"] for run in found["results"]] == [started["id"]]
    assert failed == {"next": None, "previous": None, "results": []}


# --- bodies: a field an endpoint does not take is refused, never ignored --------------------

MISSPELT_BODIES = [
    # A misspelt start key would start a run without the key that makes a retry safe.
    ("/api/v1/runs", {"automation": "quick", "start_kye": "k1"}, ["start_kye"]),
    # A misspelt filter would widen a bulk action to every run of the status.
    (
        "/api/v1/runs/bulk/cancel",
        {"status": "running", "automaton": "quick", "dry_run": False},
        ["automaton"],
    ),
    ("/api/v1/automations", {"slug": "other", "nmae": "Other"}, ["nmae"]),
    # A bare definition, without its wrapper: both errors in one answer.
    ("/api/v1/automations/quick/versions", QUICK, ["definition", "start", "steps"]),
    ("/api/v1/signals", {"name": "paid", "corelation": "order-1"}, ["corelation"]),
]


@pytest.mark.parametrize(("path", "body", "named"), MISSPELT_BODIES)
def test_a_body_field_the_endpoint_does_not_take_is_refused_and_named(
    api: APIClient, quick: Automation, path: str, body: dict[str, Any], named: list[str]
) -> None:
    # A run that waits for a worker (none runs here): the misspelt bulk cancel must leave it.
    automation_publish_definition(org=quick.org, slug="with-io", definition=WITH_IO)
    running = run_start(org=quick.org, automation_slug="with-io", run_input={}).run_id
    before = (Run.objects.count(), Automation.objects.count(), AutomationVersion.objects.count())
    response = api.post(path, body, format="json")
    assert response.status_code == 400, response.content
    answer = response.json()
    assert answer["code"] == "invalid_input"
    assert sorted(answer["errors"]) == named
    after = (Run.objects.count(), Automation.objects.count(), AutomationVersion.objects.count())
    assert after == before
    assert Run.objects.get(pk=running).status == "running"  # the bulk cancel did nothing


def test_a_field_a_signals_start_does_not_take_is_refused_too(
    api: APIClient, quick: Automation
) -> None:
    body = {"name": "paid", "start": {"automation": "quick", "start_key": "k", "imput": {}}}
    response = api.post("/api/v1/signals", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {
        "start": {"imput": ["Unknown field; this takes: automation, start_key, input."]}
    }
    assert not Run.objects.exists()
