"""Shared fixtures. Every test that touches the database uses the real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
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
