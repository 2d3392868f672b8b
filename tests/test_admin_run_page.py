"""The run page: steps and timeline from templates, a window of rows at a time, however large
the run, with waiting steps' details."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from workflows.admin.run_page import PAGE_SIZE
from workflows.admin.values import MAX_CHARS
from workflows.models import Organisation, Run, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .factories import IO_DEFINITION

pytestmark = pytest.mark.django_db

RUNS = "/admin/workflows/run"
# Session, user, the run (with its organisation, automation and version), one window of
# steps, one of events, the step counts, the graph's steps, the window's steps' history, one
# per kind of wait shown, and the admin's own bookkeeping: never per row.
MAX_QUERIES = 10


@pytest.fixture
def run(org: Organisation) -> Run:
    automation_publish_definition(org=org, slug="io", definition=IO_DEFINITION)
    started = run_start(org=org, automation_slug="io", run_input={}, start_key="k")
    return Run.objects.get(pk=started.run_id)


def add_steps(run: Run, count: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO workflows_step (org_id, run_id, step_id, iteration, type, lane, status,
                attempt, release_count, series_offset, max_attempts, wait_kind, error, finished_at)
            SELECT %(org)s, %(run)s, 'bulk-' || i, 1, 'noop', 'io', 'done',
                1, 0, 0, 5, '', '', now()
            FROM generate_series(1, %(count)s) AS i
            """,
            {"org": run.org_id, "run": run.pk, "count": count},
        )


def add_events(run: Run, count: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO workflows_runevent (org_id, run_id, kind, step_id, iteration, attempt,
                worker, detail)
            SELECT %(org)s, %(run)s, 'step.succeeded', 'bulk-' || i, 1, 1, 'w',
                jsonb_build_object('n', i)
            FROM generate_series(1, %(count)s) AS i
            """,
            {"org": run.org_id, "run": run.pk, "count": count},
        )


def rows(html: str, kind: str) -> int:
    return html.count(f'<tr class="{kind}')


def links(html: str, text: str) -> list[str]:
    return [unescape(href) for href in re.findall(rf'<a href="([^"]*)">{text}</a>', html)]


def event_numbers(html: str) -> list[int]:
    """The events of the timeline (each step's own history shows them too)."""
    timeline = html[html.index('id="timeline"') :]
    return [int(n) for n in re.findall(r"{&quot;n&quot;: (\d+)}", timeline)]


def test_a_run_with_10000_steps_and_20000_events_renders_one_window_of_each(
    admin_client: Client, run: Run, django_assert_max_num_queries
) -> None:
    add_steps(run, 10_000)
    add_events(run, 20_000)

    with django_assert_max_num_queries(MAX_QUERIES):
        response = admin_client.get(f"{RUNS}/{run.pk}/change/")

    assert response.status_code == 200
    html = response.content.decode()
    assert rows(html, "step ") == PAGE_SIZE
    assert rows(html, "event") == PAGE_SIZE
    # The newest window, oldest to newest within it.
    assert event_numbers(html) == list(range(20_000 - PAGE_SIZE + 1, 20_001))
    assert "<td><strong>bulk-10000</strong></td>" in html
    assert "done 10000" in html  # steps per status
    assert links(html, "&larr; earlier events")
    assert links(html, "&larr; earlier steps")
    assert not links(html, "later events &rarr;")


def test_paging_through_the_timeline_shows_every_event_once(admin_client: Client, run: Run) -> None:
    add_events(run, 2 * PAGE_SIZE + 50)
    url = f"{RUNS}/{run.pk}/change/"
    seen: list[int] = []
    query = ""
    while True:
        html = admin_client.get(url + query).content.decode()
        seen = event_numbers(html) + seen
        earlier = links(html, "&larr; earlier events")
        if not earlier:
            break
        query = earlier[0].split("#")[0]

    assert seen == list(range(1, 2 * PAGE_SIZE + 51))
    later = links(html, "later events &rarr;")[0].split("#")[0]
    assert event_numbers(admin_client.get(url + later).content.decode())[0] == 50 + 1
    assert links(html, "newest events")


def test_a_waiting_step_shows_what_it_waits_for_and_when_it_wakes(
    admin_client: Client, run: Run
) -> None:
    add_steps(run, 5)
    wake_at = timezone.now() + timedelta(hours=2)
    Step.objects.filter(run=run, step_id="work").update(
        status="waiting", wait_kind="external", wake_at=wake_at, wait_detail={"on_deadline": "x"}
    )

    html = admin_client.get(f"{RUNS}/{run.pk}/change/?step_status=waiting").content.decode()

    assert rows(html, "step ") == 1
    waiting = html[html.index('<tr class="step step-waiting"') :].split("</tr>")[0]
    # No app answers for this detail: its own words, and the deadline's.
    said = (
        f"a wake from outside; at {wake_at:%Y-%m-%d %H:%M:%S} UTC it wakes and takes the outcome x"
    )
    assert said in unescape(waiting)
    assert "{" not in waiting  # no dict
    assert "waiting 1" in html
    assert "done 5" in html


def test_bad_cursors_and_filters_are_ignored(admin_client: Client, run: Run) -> None:
    url = f"{RUNS}/{run.pk}/change/"
    for query in ("?events_before=abc", "?steps_after=-1", "?events_after=9" * 30,
                  "?step_status=nonsense", f"?events_before={'9' * 40}"):  # fmt: skip
        response = admin_client.get(url + query)
        assert response.status_code == 200, query
        assert rows(response.content.decode(), "event") == RunEvent.objects.filter(run=run).count()


def test_a_steps_input_and_output_are_shown_small_ones_open_large_ones_folded_and_cut(
    admin_client: Client, run: Run
) -> None:
    add_steps(run, 2)
    Step.objects.filter(run=run, step_id="bulk-1").update(output={"order": "o-7", "total": 12})
    Step.objects.filter(run=run, step_id="bulk-2").update(output={"blob": "x" * 50_000})

    html = unescape(admin_client.get(f"{RUNS}/{run.pk}/change/").content.decode())

    def words(step_id: str) -> str:
        row = html.index(f'data-step="{step_id}" data-iteration=')
        return html[row : html.index("</tr>", html.index('class="step-words', row))]

    small = words("bulk-1")
    assert '<pre class="value">{\n  "order": "o-7",\n  "total": 12\n}</pre>' in small
    large = words("bulk-2")
    assert '<details class="value" data-key="bulk-2/1/output"><summary>{"blob": "xxx' in large
    assert f"(50012 characters, the first {MAX_CHARS} shown)" in large
    assert large.count("x") < MAX_CHARS + 200
    # The step's input: the step as its version defines it (no id, no type).
    assert '"next": "done"' in words("work")
