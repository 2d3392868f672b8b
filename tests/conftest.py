"""Shared fixtures. Every test that touches the database uses the real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import OperationalError
from django.db.backends.postgresql.operations import DatabaseOperations
from rest_framework.test import APIClient

from workflows.models import ApiKey, Organisation
from workflows.services.tenancy import api_key_create

# The engine as processes and a user of it through the API (tests/engine_harness.py).
from .engine_harness import e2e_engine, harness  # noqa: F401
from .factories import OrganisationFactory
from .processes import kill_tree

# The local stub servers (Slack, SMTP, an HTTP provider, a model API), for any test that
# asks for one by name.
from .stubs.fixtures import model_stub, provider_stub, slack_stub, smtp_stub  # noqa: F401

# Tracing on in this process, spans kept in memory (tests/tracing_setup.py).
from .tracing_setup import exported  # noqa: F401

FLUSH_TRIES = 5


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files marked ``long_running`` first, each file's tests in their order. ./waymark
    test hands files to its two processes in this order (pytest-xdist's --dist loadfile,
    not reordered): started last, a file of minutes would leave one process alone at the
    end for most of its length; started first, the short files fill the gaps."""
    items.sort(key=lambda item: item.get_closest_marker("long_running") is None)


@pytest.fixture(scope="session", autouse=True)
def flush_outlasts_a_deadlock() -> Iterator[None]:
    """A test that shares a running engine (engine_harness's, module-scoped) is emptied by
    Django's flush, a TRUNCATE of every table, while the engine's processes poll and claim.
    A claim locks several tables in one statement, and PostgreSQL may pick the TRUNCATE as
    a deadlock's victim: the flush then tries again, as a client of a deadlock should. Any
    other failure, or a deadlock every time, fails the test as before."""
    flush = DatabaseOperations.execute_sql_flush

    def execute_sql_flush(self: DatabaseOperations, sql_list: list[str]) -> None:
        for attempt in range(1, FLUSH_TRIES + 1):
            try:
                return flush(self, sql_list)
            except OperationalError as exc:
                deadlock = isinstance(exc.__cause__, psycopg.errors.DeadlockDetected)
                if not deadlock or attempt == FLUSH_TRIES:
                    raise

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "execute_sql_flush", execute_sql_flush)
        yield


@pytest.fixture
def org(db: None) -> Organisation:
    return OrganisationFactory.create()


@pytest.fixture
def other_org(db: None) -> Organisation:
    return OrganisationFactory.create()


def _client_for(org: Organisation) -> tuple[APIClient, ApiKey, str]:
    key, raw = api_key_create(org=org, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client, key, raw


@pytest.fixture
def api(org: Organisation) -> APIClient:
    return _client_for(org)[0]


@pytest.fixture
def other_api(other_org: Organisation) -> APIClient:
    return _client_for(other_org)[0]


@pytest.fixture
def key_and_raw(org: Organisation) -> tuple[ApiKey, str]:
    _, key, raw = _client_for(org)
    return key, raw


@pytest.fixture
def procs():
    """Processes a test starts; whatever is still running at the end is killed."""
    started: list = []
    yield started
    for process in started:
        kill_tree(process)


@pytest.fixture
def slack_signing_secret(settings: Any) -> None:
    """Slack's signing secret, the one the Slack tests sign their requests with."""
    from .test_approvals_setup import SIGNING_SECRET

    settings.APPROVALS_SLACK_SIGNING_SECRET = SIGNING_SECRET


@pytest.fixture
def alice(org: Organisation) -> Any:
    """A person of ``org`` linked to the Slack stub's user U0ALICE."""
    from approvals.models import SlackUser

    from .test_approvals_setup import TEAM, person

    user = person(org, "alice")
    SlackUser.objects.create(org=org, team_id=TEAM, slack_user_id="U0ALICE", user=user)
    return user
