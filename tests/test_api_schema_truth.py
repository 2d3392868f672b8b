"""The API's OpenAPI schema is true: Schemathesis reads the schema the server serves and sends
what it allows and what it refuses, to the real server (pytest-django's live server, on the
test PostgreSQL), with every check it has. A request the schema allows must not be refused
for its shape, one the schema refuses must be refused, every status and body must be
documented, and nothing answers 500. The reference is generated from the schema, so a
mismatch here is a lie in the documentation.

The run is bounded: MAX_EXAMPLES cases an operation in each phase (coverage, fuzzing), the
stateful phase's scenarios besides, from a fixed seed, so a failure reproduces. What the
schema cannot say (rules between fields, what exists in the organisation) is in
tests/schemathesis.toml, each with its reason.
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

CONFIG = Path(__file__).with_name("schemathesis.toml")
# Fuzzed cases an operation: the coverage phase's cases (its boundaries, every enum value,
# each constraint broken once) come besides, and are most of the run's ~3,000 requests.
# With 10 the whole run takes under two minutes on a 2-core machine; 25 found nothing more
# and took three and a half.
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
def test_the_served_schema_says_what_the_api_does(live_server, org: Organisation) -> None:
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
        command, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}
    )
    report = done.stdout[-20_000:] + done.stderr[-5_000:]
    assert done.returncode == 0, report
    # It tested every operation the schema has (a run that found none would pass too).
    assert re.search(r"Tested: (\d+)", report) and "Tested: 63" in report, report
