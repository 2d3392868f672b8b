"""The web while the database is away: 503 `database_unavailable` with Retry-After, one
warning line, never a 500 or a traceback (docs/how-to/call-the-api.md, "Errors"). The database is
made unreachable for real: new connections name a database the server does not have, or the
request's own connection is terminated by the server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db(transaction=True)

START = {"automation": "nothing-yet", "start_key": "k", "input": {}}


@contextmanager
def database_away() -> Iterator[None]:
    """No connection to be had: every new one names a database that does not exist (the
    embedded backend creates no test_ database), as while the server restarts."""
    name = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = "test_gone_away"
    try:
        yield
    finally:
        connection.settings_dict["NAME"] = name
        connection.close()


def _no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
    assert any("database_unavailable" in r.getMessage() for r in caplog.records)


def test_the_api_answers_503_while_the_database_is_away(
    api: APIClient, caplog: pytest.LogCaptureFixture
) -> None:
    with database_away():
        answer = api.post("/api/v1/runs", START, format="json")
    assert answer.status_code == 503, answer.content
    assert answer.json()["code"] == "database_unavailable"
    assert int(answer["Retry-After"]) > 0
    _no_error_logged(caplog)


def test_a_connection_terminated_by_the_server_is_a_503_not_a_500(
    api: APIClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The request's connection was terminated (pg_terminate_backend, as a failover or a
    restart does) between its statements: its next statement fails. (Django's health check
    at a request's start would reconnect first; it is off here, as it cannot help a
    connection that goes in the middle of a request.)"""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    connection.health_check_enabled = False  # type: ignore[attr-defined]
    try:
        params = connection.get_connection_params()
        with psycopg.connect(**params, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", [pid])
        answer = api.post("/api/v1/runs", START, format="json")
    finally:
        connection.close()
        connection.health_check_enabled = connection.settings_dict["CONN_HEALTH_CHECKS"]  # type: ignore[attr-defined]
    assert answer.status_code == 503, answer.content
    assert answer.json()["code"] == "database_unavailable"
    assert int(answer["Retry-After"]) > 0
    _no_error_logged(caplog)


def test_the_admin_answers_503_in_plain_text_while_the_database_is_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-long-1")
    client = Client()
    client.force_login(user)
    with database_away():
        answer = client.get("/admin/")
    assert answer.status_code == 503, answer.content[:300]
    assert answer["Content-Type"].startswith("text/plain")
    assert int(answer["Retry-After"]) > 0
    _no_error_logged(caplog)
