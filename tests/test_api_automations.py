"""The automations API: happy paths, every bad input, and organisation isolation."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from workflows.models import ApiKey, Automation, AutomationVersion, Organisation
from workflows.services.tenancy import api_key_revoke

from .factories import linear_definition

pytestmark = pytest.mark.django_db


def _create(api: APIClient, slug: str = "follow-up") -> None:
    response = api.post("/api/v1/automations", {"slug": slug, "name": "Follow up"}, format="json")
    assert response.status_code == 201, response.json()


def _draft(api: APIClient, definition: object, slug: str = "follow-up"):
    return api.post(
        f"/api/v1/automations/{slug}/versions", {"definition": definition}, format="json"
    )


def test_create_draft_publish_and_read(api: APIClient) -> None:
    _create(api)
    response = _draft(api, linear_definition("a", "b"))
    assert response.status_code == 201
    assert response.json()["number"] == 1
    assert response.json()["published_at"] is None

    published = api.post("/api/v1/automations/follow-up/versions/1/publish")
    assert published.status_code == 200
    assert published.json()["published_at"] is not None

    detail = api.get("/api/v1/automations/follow-up").json()
    assert detail["current_version"]["number"] == 1
    assert detail["current_version"]["digest"] == published.json()["digest"]


def test_duplicate_slug_is_a_conflict(api: APIClient) -> None:
    _create(api)
    response = api.post("/api/v1/automations", {"slug": "follow-up"}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "automation_exists"


def test_invalid_definition_names_the_step_and_writes_nothing(api: APIClient) -> None:
    _create(api)
    definition = linear_definition("a")
    definition["steps"][0]["next"] = "missing"
    response = _draft(api, definition)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_definition"
    assert any(e["step"] == "a" and e["code"] == "unknown_step_reference" for e in body["errors"])
    assert '"missing"' in body["detail"]
    assert not AutomationVersion.objects.exists()


def test_publishing_twice_and_editing_published_are_refused(api: APIClient) -> None:
    _create(api)
    _draft(api, linear_definition("a"))
    assert api.post("/api/v1/automations/follow-up/versions/1/publish").status_code == 200

    again = api.post("/api/v1/automations/follow-up/versions/1/publish")
    assert again.status_code == 409
    assert again.json()["code"] == "already_published"

    edit = api.put(
        "/api/v1/automations/follow-up/versions/1",
        {"definition": linear_definition("b")},
        format="json",
    )
    assert edit.status_code == 409
    assert edit.json()["code"] == "version_published"
    assert AutomationVersion.objects.get().definition == linear_definition("a")


def test_editing_a_draft(api: APIClient) -> None:
    _create(api)
    _draft(api, linear_definition("a"))
    edit = api.put(
        "/api/v1/automations/follow-up/versions/1",
        {"definition": linear_definition("b")},
        format="json",
    )
    assert edit.status_code == 200
    assert edit.json()["definition"] == linear_definition("b")


def test_unknown_automation_and_version(api: APIClient) -> None:
    response = api.get("/api/v1/automations/nope")
    assert response.status_code == 404
    assert response.json()["code"] == "unknown_automation"
    _create(api)
    response = api.get("/api/v1/automations/follow-up/versions/7")
    assert response.status_code == 404
    assert response.json()["code"] == "unknown_version"


def test_other_organisation_sees_nothing(api: APIClient, other_api: APIClient) -> None:
    _create(api)
    _draft(api, linear_definition("a"))
    assert other_api.get("/api/v1/automations").json()["results"] == []
    for path in ["/api/v1/automations/follow-up", "/api/v1/automations/follow-up/versions/1"]:
        response = other_api.get(path)
        assert response.status_code == 404, path
        assert response.json()["code"] in {"unknown_automation", "unknown_version"}
    publish = other_api.post("/api/v1/automations/follow-up/versions/1/publish")
    assert publish.status_code == 404
    assert AutomationVersion.objects.get().published_at is None
    # The same slug is free in the other organisation.
    _create(other_api)
    assert Automation.objects.filter(slug="follow-up").count() == 2


def test_missing_malformed_unknown_and_revoked_keys(key_and_raw: tuple[ApiKey, str]) -> None:
    key, raw = key_and_raw
    client = APIClient()
    cases = [
        (None, "not_authenticated"),
        ("Token abc", "not_authenticated"),
        ("Bearer wmk_nothere_secret", "invalid_api_key"),
        ("Bearer garbage", "invalid_api_key"),
        (f"Bearer {raw}x", "invalid_api_key"),
    ]
    for header, code in cases:
        client.credentials(**({"HTTP_AUTHORIZATION": header} if header else {}))
        response = client.get("/api/v1/automations")
        assert response.status_code == 401, header
        assert response.json()["code"] == code, header

    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/automations").status_code == 200
    api_key_revoke(prefix=key.prefix)
    response = client.get("/api/v1/automations")
    assert response.status_code == 401
    assert response.json()["code"] == "api_key_revoked"


def test_malformed_json_and_wrong_shapes(api: APIClient) -> None:
    response = api.post("/api/v1/automations", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == "malformed_request"

    response = api.post("/api/v1/automations", {"slug": "has spaces"}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"
    assert "slug" in response.json()["errors"]

    response = api.post("/api/v1/automations", "slug=x", content_type="text/plain")
    assert response.status_code == 415
    assert response.json()["code"] == "unsupported_media_type"

    _create(api)
    not_definitions: list[object] = [None, [], "text", 5, {"steps": "nope"}]
    for definition in not_definitions:
        response = _draft(api, definition)
        assert response.status_code == 400, definition
        assert response.json()["code"] in {"invalid_definition", "invalid_input"}
    assert not AutomationVersion.objects.exists()
    assert Organisation.objects.count() == 1


def test_oversized_payload_is_refused(api: APIClient, settings) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    _create(api)
    body = json.dumps({"definition": {"start": "a", "steps": [], "description": "x" * 20_000}})
    response = api.post(
        "/api/v1/automations/follow-up/versions", body, content_type="application/json"
    )
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    assert not AutomationVersion.objects.exists()


def test_oversized_definition_is_refused(api: APIClient, settings) -> None:
    settings.WAYMARK = {**settings.WAYMARK, "MAX_DEFINITION_BYTES": 2_000}
    _create(api)
    definition = linear_definition("a")
    definition["description"] = "x" * 3_000
    response = _draft(api, definition)
    assert response.status_code == 400
    assert response.json()["errors"][0]["code"] == "definition_too_large"


def test_unknown_api_path_is_json(api: APIClient) -> None:
    response = api.get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_openapi_schema_is_served() -> None:
    response = APIClient().get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json() if "json" in response["Content-Type"] else None
    text = response.content.decode()
    assert "/api/v1/automations" in text
    assert schema is None or "paths" in schema


def test_openapi_schema_is_valid_without_warnings(tmp_path) -> None:
    from django.core.management import call_command

    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    text = target.read_text()
    assert "bearer" in text and "/api/v1/runs" in text
    # Every operation documents the JSON error body.
    assert text.count("$ref: '#/components/schemas/Error'") >= 3 * 9
