"""Retention: finished runs leave the hot tables with their steps and history, in batches."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from workflows.engine.retention import purge_finished_runs
from workflows.models import Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.control import run_act
from workflows.services.runs import run_start

from .factories import IO_DEFINITION, linear_definition

pytestmark = pytest.mark.django_db


def age(run_id: int, days: float) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workflows_run SET finished_at = now() - make_interval(days => %s)"
            " WHERE id = %s",
            [days, run_id],
        )


def test_runs_finished_before_the_horizon_go_with_their_steps_and_history(org) -> None:
    automation_publish_definition(org=org, slug="quick", definition=linear_definition("a", "b"))
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    old, recent = (
        run_start(org=org, automation_slug="quick", run_input={}, start_key=k).run_id
        for k in ("old", "recent")
    )
    live = run_start(org=org, automation_slug="io", run_input={}, start_key="live").run_id
    cancelled = run_start(org=org, automation_slug="io", run_input={}, start_key="x").run_id
    run_act(org=org, run_id=cancelled, action="cancel", actor="t")
    age(old, 100)
    age(recent, 10)
    age(cancelled, 100)

    assert purge_finished_runs(older_than_seconds=30 * 86_400, batch=1) == 2

    assert set(Run.objects.values_list("id", flat=True)) == {recent, live}
    assert not Step.objects.filter(run_id__in=[old, cancelled]).exists()
    assert not RunEvent.objects.filter(run_id__in=[old, cancelled]).exists()
    assert Step.objects.filter(run_id=live, status="ready").exists()


def test_retention_off_deletes_nothing_and_the_command_reports_counts(org, settings) -> None:
    settings.WAYMARK = {**settings.WAYMARK, "RETENTION_DAYS": 0}
    automation_publish_definition(org=org, slug="quick", definition=linear_definition("a"))
    run_id = run_start(org=org, automation_slug="quick", run_input={}, start_key="k").run_id
    age(run_id, 1000)
    assert purge_finished_runs() == 0

    out = StringIO()
    call_command("purge_runs", stdout=out)
    assert "retention is off" in out.getvalue()
    call_command("purge_runs", "--older-than-days", "30", stdout=out)
    assert "1 finished run(s) deleted" in out.getvalue()
    assert not Run.objects.filter(pk=run_id).exists()
