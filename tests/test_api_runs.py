"""The runs API: starting runs once per start key, reading them, listing them, isolation.

Every refused request is checked to have written nothing (no run, step, event or outbox row).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pytest
from pytest_django.fixtures import Settings
from rest_framework.test import APIClient

from workflows.api.serializers import RunStartedOut
from workflows.definitions.validator import canonical_json
from workflows.models import Automation, Organisation, Outbox, Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition, version_create_draft
from workflows.states import RunStatus

from .factories import AutomationFactory, linear_definition

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"

# Only quick steps: a run of it finishes inside the start request.
QUICK: dict[str, Any] = {
    "start": "greet",
    "steps": [
        {
            "id": "greet",
            "type": "set",
            "values": {"greeting": "Hi {{ input.name }}"},
            "next": "route",
        },
        {
            "id": "route",
            "type": "branch",
            "when": [{"outcome": "vip", "if": "(input.tier | default('none')) == 'gold'"}],
            "next": {"vip": "vip_end", "default": "done"},
        },
        {"id": "vip_end", "type": "end", "output": {"text": "VIP {{ vars.greeting }}"}},
        {"id": "done", "type": "end", "output": {"text": "{{ vars.greeting }}"}},
    ],
}

# A noop on the io lane: a run of it stays running with a ready step and a wake-up.
WITH_IO: dict[str, Any] = {
    "start": "prepare",
    "steps": [
        {"id": "prepare", "type": "set", "values": {"who": "{{ input.name }}"}, "next": "work"},
        {"id": "work", "type": "noop", "next": "done"},
        {"id": "done", "type": "end"},
    ],
}


@pytest.fixture
def quick(org: Organisation) -> Automation:
    return automation_publish_definition(org=org, slug="quick", definition=QUICK).automation


@pytest.fixture
def with_io(org: Organisation) -> Automation:
    return automation_publish_definition(org=org, slug="with-io", definition=WITH_IO).automation


@pytest.fixture
def draft_only(org: Organisation) -> Automation:
    automation = AutomationFactory.create(org=org, slug="draft-only")
    version_create_draft(automation=automation, definition=linear_definition("a"))
    return automation


def counts() -> dict[str, int]:
    return {
        "runs": Run.objects.count(),
        "steps": Step.objects.count(),
        "events": RunEvent.objects.count(),
        "outbox": Outbox.objects.count(),
    }


@dataclass
class Started:
    """A start's answer, and the run's detail read after it (GET): most tests here check
    what the start did to the run."""

    status_code: int
    answer: dict[str, Any]
    detail: dict[str, Any]

    def json(self) -> dict[str, Any]:
        return self.detail


def start(api: APIClient, body: dict[str, Any]) -> Started:
    response = api.post(RUNS, body, format="json")
    answer = response.json()
    if response.status_code not in (200, 201):
        return Started(response.status_code, answer, answer)
    assert set(answer) == {"id", "status", "created", "start_key", "links"}, answer
    # The view builds the answer without its serializer: it must be what RunStartedOut (the
    # schema's) renders, status one of its choices.
    assert RunStartedOut(answer).data == answer and answer["status"] in RunStatus.values
    detail = api.get(answer["links"]["self"]).json()
    assert (answer["id"], answer["status"]) == (detail["id"], detail["status"])
    return Started(response.status_code, answer, detail)


def kinds(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(event["kind"], event["step_id"]) for event in body["history"]]


# --- starting -------------------------------------------------------------------------------


def test_first_start_is_201_and_quick_steps_finish_inline(
    api: APIClient, quick: Automation
) -> None:
    response = start(
        api,
        {"automation": "quick", "start_key": "order-1", "input": {"name": "Ada", "tier": "gold"}},
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    run = Run.objects.get()
    assert body["id"] == run.pk
    assert body["automation"] == "quick"
    assert body["version"] == 1
    assert body["start_key"] == "order-1"
    assert body["start_key_derived"] is False
    assert body["status"] == "succeeded"
    assert body["input"] == {"name": "Ada", "tier": "gold"}
    assert body["output"] == {"text": "VIP Hi Ada"}
    assert body["vars"] == {"greeting": "Hi Ada"}
    assert body["error"] == ""
    assert body["steps_executed"] == 3
    assert body["max_steps"] == 1000
    assert body["finished_at"] is not None
    assert [(s["step_id"], s["lane"], s["status"], s["attempt"]) for s in body["steps"]] == [
        ("greet", "inline", "done", 1),
        ("route", "inline", "done", 1),
        ("vip_end", "inline", "done", 1),
    ]
    assert body["steps"][1]["output"] == {"outcome": "vip"}
    assert kinds(body) == [
        ("run.started", ""),
        ("step.succeeded", "greet"),
        ("step.succeeded", "route"),
        ("step.succeeded", "vip_end"),
        ("run.succeeded", ""),
    ]
    assert run.version_id == quick.current_version_id
    assert not Outbox.objects.exists()


def test_a_repeat_with_the_same_key_and_input_returns_the_same_run(
    api: APIClient, quick: Automation
) -> None:
    first = start(api, {"automation": "quick", "start_key": "k", "input": {"name": "A", "n": 1}})
    assert first.status_code == 201
    before = counts()

    # Same input with its keys in another order: the same canonical input.
    again = start(api, {"automation": "quick", "start_key": "k", "input": {"n": 1, "name": "A"}})

    assert again.status_code == 200, again.json()
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["status"] == "succeeded"
    assert again.json()["history"] == first.json()["history"]
    assert counts() == before


def test_the_same_key_with_another_input_is_a_conflict(api: APIClient, quick: Automation) -> None:
    first = start(api, {"automation": "quick", "start_key": "k", "input": {"name": "A"}})
    assert first.status_code == 201
    before = counts()

    response = start(api, {"automation": "quick", "start_key": "k", "input": {"name": "B"}})

    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "start_key_conflict"
    assert body["run_id"] == first.json()["id"]
    assert '"k"' in body["detail"]
    assert counts() == before
    assert Run.objects.count() == 1
    assert Run.objects.get().input == {"name": "A"}


def test_without_a_start_key_the_input_digest_is_the_key(api: APIClient, quick: Automation) -> None:
    run_input = {"name": "Ada", "tier": "silver"}
    first = start(api, {"automation": "quick", "input": run_input})

    assert first.status_code == 201
    body = first.json()
    digest = hashlib.sha256(canonical_json(run_input).encode()).hexdigest()
    assert body["start_key"] == f"input:{quick.pk}:{digest}"
    assert body["start_key_derived"] is True
    assert body["output"] == {"text": "Hi Ada"}

    again = start(api, {"automation": "quick", "input": {"tier": "silver", "name": "Ada"}})
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]

    other = start(api, {"automation": "quick", "input": {"name": "Bo"}})
    assert other.status_code == 201
    assert other.json()["id"] != body["id"]
    assert Run.objects.count() == 2


def test_missing_input_is_an_empty_object(api: APIClient, with_io: Automation) -> None:
    response = start(api, {"automation": "with-io", "start_key": "no-input"})

    # `prepare` renders {{ input.name }}: with an empty input it fails on the undefined name.
    assert response.status_code == 201
    body = response.json()
    assert body["input"] == {}
    assert body["status"] == "failed"
    assert body["error"].startswith("step 'prepare' failed: template error:")


def test_derived_keys_do_not_collide_across_automations(
    api: APIClient, quick: Automation, with_io: Automation
) -> None:
    first = start(api, {"automation": "quick", "input": {"name": "Ada"}})
    assert first.status_code == 201

    second = start(api, {"automation": "with-io", "input": {"name": "Ada"}})

    assert second.status_code == 201, second.json()
    assert second.json()["automation"] == "with-io"
    assert Run.objects.filter(automation=with_io).count() == 1


def test_a_start_key_of_another_automation_never_returns_its_run(
    api: APIClient, quick: Automation, with_io: Automation
) -> None:
    first = start(api, {"automation": "quick", "start_key": "shared", "input": {"name": "Ada"}})
    assert first.status_code == 201

    second = start(api, {"automation": "with-io", "start_key": "shared", "input": {"name": "Ada"}})

    assert second.status_code in (201, 409), second.json()
    if second.status_code == 201:
        assert second.json()["automation"] == "with-io"
    else:
        assert second.json()["code"] == "start_key_conflict"


def test_a_start_key_of_255_characters_is_accepted(api: APIClient, quick: Automation) -> None:
    response = start(api, {"automation": "quick", "start_key": "k" * 255, "input": {"name": "A"}})

    assert response.status_code == 201
    assert response.json()["start_key"] == "k" * 255


def test_a_run_with_a_lane_step_stays_running(
    api: APIClient, org: Organisation, with_io: Automation
) -> None:
    response = start(api, {"automation": "with-io", "start_key": "io-1", "input": {"name": "Ada"}})

    assert response.status_code == 201
    body = response.json()
    assert body["status"] == "running"
    assert body["finished_at"] is None
    assert body["output"] is None
    assert body["vars"] == {"who": "Ada"}
    assert [(s["step_id"], s["lane"], s["status"]) for s in body["steps"]] == [
        ("prepare", "inline", "done"),
        ("work", "io", "ready"),
    ]
    work = body["steps"][1]
    assert work["type"] == "noop"
    assert work["attempt"] == 0
    assert work["max_attempts"] == 5
    assert "owner" not in work  # which worker holds a step is for operators (the admin)
    assert work["lease_until"] is not None
    assert kinds(body) == [
        ("run.started", ""),
        ("step.succeeded", "prepare"),
        ("step.ready", "work"),
    ]
    outbox = Outbox.objects.get()
    assert (outbox.org_id, outbox.topic) == (org.pk, "lane.wake")
    assert outbox.payload == {"lane": "io", "run": body["id"]}


# --- refused starts write nothing -----------------------------------------------------------

REFUSED: list[tuple[str, dict[str, Any], int, str]] = [
    ("unknown automation", {"automation": "nope"}, 404, "unknown_automation"),
    ("no published version", {"automation": "draft-only"}, 409, "no_published_version"),
    ("input is a list", {"automation": "quick", "input": [1, 2]}, 400, "invalid_input"),
    ("input is a string", {"automation": "quick", "input": "text"}, 400, "invalid_input"),
    ("input is a number", {"automation": "quick", "input": 5}, 400, "invalid_input"),
    ("input is null", {"automation": "quick", "input": None}, 400, "invalid_input"),
    ("start key too long", {"automation": "quick", "start_key": "k" * 256}, 400, "invalid_input"),
    ("empty start key", {"automation": "quick", "start_key": ""}, 400, "invalid_input"),
    ("no automation", {"input": {}}, 400, "invalid_input"),
    ("automation not a slug", {"automation": "not a slug!"}, 400, "invalid_input"),
    (
        "same key, other input",
        {"automation": "with-io", "start_key": "taken", "input": {"name": "Other"}},
        409,
        "start_key_conflict",
    ),
    (
        "unknown automation, taken key",
        {"automation": "nope", "start_key": "taken", "input": {"name": "Ada"}},
        404,
        "unknown_automation",
    ),
]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [pytest.param(body, status, code, id=name) for name, body, status, code in REFUSED],
)
def test_refused_starts_write_nothing(
    api: APIClient,
    quick: Automation,
    with_io: Automation,
    draft_only: Automation,
    body: dict[str, Any],
    status: int,
    code: str,
) -> None:
    taken = start(api, {"automation": "with-io", "start_key": "taken", "input": {"name": "Ada"}})
    assert taken.status_code == 201
    before = counts()
    assert before == {"runs": 1, "steps": 2, "events": 3, "outbox": 1}

    response = start(api, body)

    assert response.status_code == status, response.json()
    assert response.json()["code"] == code
    assert response.json()["detail"]
    assert counts() == before


def test_an_oversized_input_is_413(api: APIClient, quick: Automation, settings: Settings) -> None:
    settings.WAYMARK = {**settings.WAYMARK, "MAX_INPUT_BYTES": 64}
    at_limit = {"name": "x" * (64 - len(canonical_json({"name": ""})))}
    assert len(canonical_json(at_limit).encode()) == 64
    over = {"name": "x" * (65 - len(canonical_json({"name": ""})))}

    response = start(api, {"automation": "quick", "start_key": "big", "input": over})

    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    assert "65" in response.json()["detail"]
    assert "64" in response.json()["detail"]
    assert counts() == {"runs": 0, "steps": 0, "events": 0, "outbox": 0}

    # Exactly at the limit is fine.
    fits = start(api, {"automation": "quick", "start_key": "fits", "input": at_limit})
    assert fits.status_code == 201
    assert fits.json()["status"] == "succeeded"


def test_size_is_measured_in_utf8_bytes(
    api: APIClient, quick: Automation, settings: Settings
) -> None:
    settings.WAYMARK = {**settings.WAYMARK, "MAX_INPUT_BYTES": 64}
    # 30 characters of "é" are 60 bytes in UTF-8 (but the JSON escape \u00e9 is 6 bytes each).
    response = start(api, {"automation": "quick", "input": {"name": "é" * 30}})

    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    assert counts()["runs"] == 0


def test_an_unauthenticated_start_is_401_and_writes_nothing(quick: Automation) -> None:
    response = APIClient().post(RUNS, {"automation": "quick"}, format="json")

    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
    assert counts() == {"runs": 0, "steps": 0, "events": 0, "outbox": 0}


# --- reading --------------------------------------------------------------------------------


def test_get_a_run_with_steps_and_history(api: APIClient, with_io: Automation) -> None:
    started = start(api, {"automation": "with-io", "input": {"name": "Ada"}}).json()

    response = api.get(f"{RUNS}/{started['id']}")

    assert response.status_code == 200
    body = response.json()
    assert body["id"] == started["id"]
    assert body["automation"] == "with-io"
    assert body["status"] == "running"
    assert body["input"] == {"name": "Ada"}
    assert [(s["step_id"], s["status"]) for s in body["steps"]] == [
        ("prepare", "done"),
        ("work", "ready"),
    ]
    assert [e["kind"] for e in body["history"]] == ["run.started", "step.succeeded", "step.ready"]
    ids = [e["id"] for e in body["history"]]
    assert ids == sorted(ids)
    assert body["history"][0]["detail"] == {"version_id": with_io.current_version_id}


def test_an_unknown_run_is_404(api: APIClient) -> None:
    response = api.get(f"{RUNS}/999999999")

    assert response.status_code == 404
    assert response.json()["code"] == "unknown_run"


def _start_mix(api: APIClient) -> dict[str, list[int]]:
    """Two succeeded runs of `quick`, then two running runs of `with-io`."""
    ids: dict[str, list[int]] = {"quick": [], "with-io": []}
    for name in ("a", "b"):
        response = start(api, {"automation": "quick", "input": {"name": name}})
        assert response.json()["status"] == "succeeded"
        ids["quick"].append(response.json()["id"])
    for name in ("c", "d"):
        response = start(api, {"automation": "with-io", "input": {"name": name}})
        assert response.json()["status"] == "running"
        ids["with-io"].append(response.json()["id"])
    return ids


def test_list_runs_newest_first_with_filters(
    api: APIClient, quick: Automation, with_io: Automation
) -> None:
    ids = _start_mix(api)
    every = sorted(ids["quick"] + ids["with-io"], reverse=True)

    listed = api.get(RUNS)
    assert listed.status_code == 200
    assert [r["id"] for r in listed.json()["results"]] == every
    first = listed.json()["results"][0]
    assert first["automation"] == "with-io"
    assert "steps" not in first
    assert "history" not in first

    running = api.get(RUNS, {"status": "running"}).json()["results"]
    assert [r["id"] for r in running] == sorted(ids["with-io"], reverse=True)
    succeeded = api.get(RUNS, {"status": "succeeded"}).json()["results"]
    assert [r["id"] for r in succeeded] == sorted(ids["quick"], reverse=True)
    assert api.get(RUNS, {"status": "cancelled"}).json()["results"] == []

    by_automation = api.get(RUNS, {"automation": "quick"}).json()["results"]
    assert [r["id"] for r in by_automation] == sorted(ids["quick"], reverse=True)
    both = api.get(RUNS, {"automation": "quick", "status": "running"}).json()["results"]
    assert both == []
    assert api.get(RUNS, {"automation": "nope"}).json()["results"] == []


def test_list_runs_is_cursor_paginated(
    api: APIClient, quick: Automation, with_io: Automation
) -> None:
    ids = _start_mix(api)
    every = sorted(ids["quick"] + ids["with-io"], reverse=True)

    page = api.get(RUNS, {"limit": 3}).json()
    assert page["previous"] is None
    seen = [r["id"] for r in page["results"]]
    assert seen == every[:3]
    assert page["next"] is not None
    page = api.get(page["next"]).json()
    assert [r["id"] for r in page["results"]] == every[3:]
    assert page["next"] is None
    assert page["previous"] is not None

    # The filter survives in the cursor links.
    filtered = api.get(RUNS, {"limit": "1", "status": "running"}).json()
    assert [r["id"] for r in filtered["results"]] == [max(ids["with-io"])]
    rest = api.get(filtered["next"]).json()
    assert [r["id"] for r in rest["results"]] == [min(ids["with-io"])]
    assert rest["next"] is None


@pytest.mark.parametrize("bad", ["done", "RUNNING", "ready", "succeeded,failed"])
def test_an_invalid_status_filter_is_400(api: APIClient, bad: str) -> None:
    response = api.get(RUNS, {"status": bad})

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"
    assert "running" in response.json()["detail"]


# --- organisation isolation -----------------------------------------------------------------


def test_another_organisation_cannot_see_or_start_runs(
    api: APIClient, other_api: APIClient, quick: Automation, with_io: Automation
) -> None:
    mine = start(api, {"automation": "with-io", "start_key": "k", "input": {"name": "Ada"}})
    assert mine.status_code == 201
    run_id = mine.json()["id"]
    before = counts()

    detail = other_api.get(f"{RUNS}/{run_id}")
    assert detail.status_code == 404
    assert detail.json()["code"] == "unknown_run"

    listed = other_api.get(RUNS)
    assert listed.status_code == 200
    assert listed.json()["results"] == []
    assert other_api.get(RUNS, {"automation": "with-io"}).json()["results"] == []
    assert other_api.get(RUNS, {"status": "running"}).json()["results"] == []

    started = other_api.post(RUNS, {"automation": "with-io", "input": {"name": "X"}}, format="json")
    assert started.status_code == 404
    assert started.json()["code"] == "unknown_automation"
    # Not even the same start key and input reach the other organisation's run.
    replay = other_api.post(
        RUNS,
        {"automation": "with-io", "start_key": "k", "input": {"name": "Ada"}},
        format="json",
    )
    assert replay.status_code == 404
    assert replay.json()["code"] == "unknown_automation"
    assert counts() == before


def test_start_keys_are_per_organisation(
    api: APIClient, other_api: APIClient, other_org: Organisation, quick: Automation
) -> None:
    automation_publish_definition(org=other_org, slug="quick", definition=QUICK)
    body = {"automation": "quick", "start_key": "same", "input": {"name": "Ada"}}

    mine = start(api, body)
    theirs = start(other_api, body)

    assert mine.status_code == 201
    assert theirs.status_code == 201
    assert theirs.json()["id"] != mine.json()["id"]
    assert Run.objects.get(pk=theirs.json()["id"]).org_id == other_org.pk
    assert [r["id"] for r in other_api.get(RUNS).json()["results"]] == [theirs.json()["id"]]
    assert [r["id"] for r in api.get(RUNS).json()["results"]] == [mine.json()["id"]]


@pytest.mark.parametrize("depth", [40, 50_000])
def test_deeply_nested_input_is_refused_cleanly(
    api: APIClient, with_io: Automation, depth: int
) -> None:
    body = '{"automation": "with-io", "input": {"a": ' + "[" * depth + "]" * depth + "}}"
    response = api.post("/api/v1/runs", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] in {"invalid_input", "malformed_request"}
    assert not Run.objects.exists()


def test_deeply_nested_definition_is_refused_cleanly(api: APIClient, quick: Automation) -> None:
    body = '{"definition": ' + '{"a":' * 5000 + "1" + "}" * 5000 + "}"
    response = api.post("/api/v1/automations/quick/versions", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == "malformed_request"


def test_a_run_with_30000_steps_is_shown_one_page_at_a_time(org, api) -> None:
    from django.db import connection

    automation_publish_definition(org=org, slug="with-io", definition=WITH_IO)
    run = api.post(RUNS, {"automation": "with-io", "start_key": "big"}, format="json").json()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status,
                attempt, release_count, series_offset, max_attempts, wait_kind, error,
                created_at, finished_at)
            SELECT %(org)s, %(run)s, 'loop', g, 'noop', 'io', 'done', 1, 0, 0, 5, '', '',
                   now(), now()
              FROM generate_series(1, 30000) g;
            INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, worker, at)
            SELECT %(org)s, %(run)s, 'step.succeeded', 'loop', g, 'w', now()
              FROM generate_series(1, 30000) g;
            """,
            {"org": org.pk, "run": run["id"]},
        )

    detail = api.get(f"{RUNS}/{run['id']}").json()
    assert len(detail["steps"]) == 100 and len(detail["history"]) == 100
    assert detail["links"]["steps"] == f"/api/v1/runs/{run['id']}/steps"

    seen, url = 0, f"{RUNS}/{run['id']}/steps?limit=1000"
    while url:
        page = api.get(url).json()
        seen += len(page["results"])
        url = page["next"]
    assert seen == Step.objects.filter(run_id=run["id"]).count() > 30_000
    history = api.get(f"{RUNS}/{run['id']}/history?limit=5").json()
    assert len(history["results"]) == 5 and history["next"]


def test_another_organisations_run_steps_and_history_are_unknown(org, other_api, api) -> None:
    automation_publish_definition(org=org, slug="with-io", definition=WITH_IO)
    run = api.post(RUNS, {"automation": "with-io", "start_key": "mine"}, format="json").json()
    for part in ("steps", "history"):
        response = other_api.get(f"{RUNS}/{run['id']}/{part}")
        assert (response.status_code, response.json()["code"]) == (404, "unknown_run")
