"""The API's OpenAPI schema is true: Schemathesis reads the schema the server serves and sends
what it allows and what it refuses, to the real server (pytest-django's live server, on the
test PostgreSQL), with every check it has. A request the schema allows must not be refused
for its shape, one the schema refuses must be refused, every status and body must be
documented, and nothing answers 500. The reference is generated from the schema, so a
mismatch here is a lie in the documentation.

The run is bounded: the coverage phase's cases (each operation's boundaries, enum values,
each constraint broken once), MAX_EXAMPLES fuzzed cases an operation, and the stateful
phase's scenarios along the links Schemathesis infers, from a fixed seed, so a failure
reproduces. What the schema cannot say (rules between fields, what exists in the
organisation) is in tests/schemathesis.toml, each with its reason. The mismatches it found
are held below too, one request each, so they stay fixed whatever a seed draws.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from workflows.models import Organisation
from workflows.services.automations import automation_publish_definition
from workflows.services.tenancy import api_key_create

pytestmark = pytest.mark.long_running

CONFIG = Path(__file__).with_name("schemathesis.toml")
# Fuzzed cases an operation. The coverage phase's cases come besides and are most of the
# run's ~3,000 requests and of its time (about two minutes on a 2-core machine): 5 took as
# long as 10, and 20 (with other seeds) found nothing 10 did not.
MAX_EXAMPLES = 10
SEED = 43


def _seed_data(raw_key: str) -> None:
    """Something of each kind for the operations that read one: an automation with a
    published version, a run, a schedule, a suppression, a connection, a signal."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    made = [
        client.post("/api/v1/runs", {"automation": "quick", "start_key": "k1"}, format="json"),
        client.post(
            "/api/v1/schedules",
            {"name": "daily", "automation": "quick", "cron": "0 9 * * *"},
            format="json",
        ),
        client.post("/api/v1/suppressions", {"address": "a@b.example"}, format="json"),
        client.post("/api/v1/connections", {"name": "crm", "provider": "http"}, format="json"),
        client.post("/api/v1/signals", {"name": "paid", "correlation": "o-1"}, format="json"),
    ]
    assert [answer.status_code for answer in made] == [201] * len(made), [
        answer.content for answer in made
    ]


@pytest.mark.django_db(transaction=True)
def test_the_served_schema_says_what_the_api_does(
    live_server, org: Organisation, tmp_path: Path
) -> None:
    quick = {"start": "done", "steps": [{"id": "done", "type": "end"}]}
    automation_publish_definition(org=org, slug="quick", definition=quick)
    # With the erasure scope, so POST /erasures is tested past its 403 too.
    _, raw = api_key_create(org=org, name="schemathesis", scopes=["erasure"])
    _seed_data(raw)
    command = [
        str(Path(sys.executable).with_name("st")),
        "--config-file", str(CONFIG),
        "run", f"{live_server.url}/api/v1/schema/",
        "--checks", "all",
        "--phases", "coverage,fuzzing,stateful",
        "--max-examples", str(MAX_EXAMPLES),
        "--seed", str(SEED),
        "--header", f"Authorization: Bearer {raw}",
        "--workers", "2",
        "--max-failures", "50",
        "--output-truncate", "true",
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"},
        cwd=tmp_path,  # whatever it writes, never in the checkout
    )  # fmt: skip
    report = done.stdout[-20_000:] + done.stderr[-5_000:]
    assert done.returncode == 0, report
    # It tested every operation the schema has (a run that found none would pass too).
    assert re.search(r"Tested: (\d+)", report) and "Tested: 63" in report, report


# --- what Schemathesis found, held one request each -----------------------------------------

WRONG_TYPES = [
    ("/api/v1/automations", {"slug": "0", "name": 0}, "name"),
    ("/api/v1/runs/bulk/cancel", {"status": "running", "dry_run": 0}, "dry_run"),
    ("/api/v1/suppressions", {"address": 0}, "address"),
    ("/api/v1/runs", {"automation": "quick", "start_key": 5}, "start_key"),
    ("/api/v1/connections", {"name": "c", "provider": "http", "max_concurrency": "5"},
     "max_concurrency"),
    ("/api/v1/inbound-email", {"in_reply_to": 0}, "in_reply_to"),
    ("/api/v1/inbound-email", {"references": [0]}, "references"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "field"), WRONG_TYPES)
def test_a_value_of_another_json_type_is_refused_not_coerced(api, path, body, field) -> None:
    refused = api.post(path, body, format="json")
    assert refused.status_code == 400, refused.content
    assert refused.json()["code"] == "invalid_input"
    assert field in refused.json()["errors"]


@pytest.mark.parametrize(
    "query",
    ["/api/v1/runs?status=", "/api/v1/runs?created_after=", "/api/v1/schedules?enabled=null",
     "/api/v1/schedules?enabled=1", "/api/v1/approvals?limit=0", "/api/v1/runs?search=ab"],
)  # fmt: skip
def test_a_filter_value_the_schema_refuses_is_refused(api, query: str) -> None:
    refused = api.get(query)
    assert refused.status_code == 400, refused.content
    assert refused.json()["code"] in ("invalid_input", "invalid_query")


def test_an_instant_with_any_offset_is_read_in_utc(api) -> None:
    # PostgreSQL takes offsets up to 15:59; this one was a 500.
    assert api.get("/api/v1/audit?at_after=0439-08-09T21:18:54.21-21:23").status_code == 200
    assert api.get("/api/v1/runs?created_before=0001-01-01T00:00:00%2B05:00").status_code == 400


def test_a_limit_above_the_maximum_is_cut_however_long(api) -> None:
    assert api.get("/api/v1/runs?limit=" + "9" * 5000).status_code == 200


def test_the_schema_says_what_strict_bodies_refuse(api) -> None:
    schema = api.get("/api/v1/schema/?format=json").json()
    components = schema["components"]["schemas"]
    automation = components["AutomationIn"]
    assert automation["additionalProperties"] is False
    assert automation["properties"]["slug"]["minLength"] == 1
    conflicts = schema["paths"]["/api/v1/automations"]["post"]["responses"]
    assert {"201", "400", "401", "403", "404", "409", "413", "429", "503"} <= set(conflicts)
