"""Finding runs by what is inside them (a customer's name, an order id), in the admin's runs
list and the API, through the trigram index; and a list that never counts without a bound
(at a million runs a count is a scan)."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from workflows.admin.run_list import COUNT_CAP
from workflows.models import Organisation, Run
from workflows.selectors import run_search
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .factories import IO_DEFINITION

pytestmark = pytest.mark.django_db

RUNS = "/admin/workflows/run/"


def start(org: Organisation, key: str, run_input: dict) -> int:
    automation_publish_definition(org=org, slug="orders", definition=IO_DEFINITION)
    return run_start(org=org, automation_slug="orders", run_input=run_input, start_key=key).run_id


@pytest.fixture
def runs(org: Organisation, other_org: Organisation) -> dict[str, int]:
    return {
        "eve": start(org, "order-1", {"customer": {"name": "Eve Adams"}, "order": "A-1234"}),
        "bob": start(org, "order-2", {"customer": {"name": "Bob"}, "order": "B-9", "note": "50%"}),
        "steve": start(org, "order-3", {"customer": {"name": "Steve"}, "order": "C_7"}),
        "theirs": start(other_org, "order-1", {"customer": {"name": "Eve Other"}}),
    }


def found(api: APIClient, query: str) -> list[int]:
    response = api.get(f"/api/v1/runs?{query}")
    assert response.status_code == 200, response.json()
    return sorted(run["id"] for run in response.json()["results"])


def test_the_api_finds_runs_by_a_name_or_an_order_id_inside_their_input(
    api: APIClient, runs: dict[str, int]
) -> None:
    assert found(api, "search=Eve") == sorted([runs["eve"], runs["steve"]])  # stEVE too
    assert found(api, "search=eve%20adams") == [runs["eve"]]  # case-insensitive
    assert found(api, "search=A-1234") == [runs["eve"]]
    assert found(api, "search=order-2") == [runs["bob"]]  # the start key
    assert found(api, "search=nobody") == []
    assert found(api, "search=Eve&status=running") == sorted([runs["eve"], runs["steve"]])


def test_wildcards_are_matched_as_written(api: APIClient, runs: dict[str, int]) -> None:
    assert found(api, "search=50%25") == [runs["bob"]]  # a literal %
    assert found(api, "search=C_7") == [runs["steve"]]
    assert found(api, "search=C%257") == []  # not "C, anything, 7"


def test_a_search_too_short_to_use_the_index_is_refused_with_a_clear_error(
    api: APIClient, runs: dict[str, int]
) -> None:
    response = api.get("/api/v1/runs?search=Ev")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_input" and body["parameter"] == "search"
    assert "at least 3 characters" in body["detail"]


def test_digits_also_find_the_run_of_that_id(api: APIClient, runs: dict[str, int]) -> None:
    assert runs["bob"] in found(api, f"search={runs['bob']:03d}")


def test_the_admin_list_searches_inside_input_for_its_organisations_only(
    admin_client: Client, runs: dict[str, int], org: Organisation
) -> None:
    html = admin_client.get(RUNS, {"q": "Eve"}).content.decode()
    shown = {int(n) for n in re.findall(r"/admin/workflows/run/(\d+)/change/", html)}
    assert shown == {runs["eve"], runs["steve"], runs["theirs"]}  # a superuser sees all
    assert "3 runs" in html

    # A run id, too short for the index, still finds its run.
    html = admin_client.get(RUNS, {"q": str(runs["bob"])}).content.decode()
    assert f"/admin/workflows/run/{runs['bob']}/change/" in html


def test_the_search_reads_the_trigram_index(runs: dict[str, int], org: Organisation) -> None:
    query = run_search(Run.objects.all(), "Adams").order_by("-id")[:100]
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        # A handful of rows: the planner would rightly read the table; leave it nothing but
        # the bitmap scans of indexes, which it can use only if the index's expression is
        # the search's own (benchmarks/run_pages.py shows the plans it picks at a million
        # runs).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Bitmap Index Scan on run_search" in plan, plan


def fill(org: Organisation, count: int) -> None:
    """``count`` more runs of ``org``, copies of its first run under new start keys."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO workflows_run (org_id, automation_id, version_id, start_key,
                start_key_derived, input, input_digest, status, vars, outputs, entered, error,
                steps_executed, max_steps, deadline_at)
            SELECT r.org_id, r.automation_id, r.version_id, 'filled-' || i, false,
                jsonb_build_object('n', i), r.input_digest, 'running', '{}', '{}', '{}', '',
                0, r.max_steps, r.deadline_at
            FROM generate_series(1, %(count)s) AS i,
                 (SELECT * FROM workflows_run WHERE org_id = %(org)s ORDER BY id LIMIT 1) AS r
            """,
            {"org": org.pk, "count": count},
        )


def test_the_list_counts_up_to_the_cap_and_never_the_whole_table(
    admin_client: Client, runs: dict[str, int], org: Organisation
) -> None:
    fill(org, COUNT_CAP + 50)

    with CaptureQueriesContext(connection) as queries:
        html = admin_client.get(RUNS).content.decode()

    assert "1,000+ runs" in html
    reads = [q["sql"] for q in queries.captured_queries if 'FROM "workflows_run"' in q["sql"]]
    # The ids of the list, up to the cap; then the page's rows by id. No count at all.
    assert len(reads) == 2, reads
    assert reads[0].startswith('SELECT "workflows_run"."id" AS "pk" FROM "workflows_run"')
    assert reads[0].endswith(f"LIMIT {COUNT_CAP + 1}")
    assert '"workflows_run"."id" IN (' in reads[1]
    assert not any("COUNT(" in q["sql"].upper() for q in queries.captured_queries)
    # The pages up to the cap are offered; a filter narrows it to a real count.
    assert f'href="?p={COUNT_CAP // 100}"' in html
    narrowed = admin_client.get(RUNS, {"q": "order-3"}).content.decode()
    assert "1 run" in narrowed and "1,000+" not in narrowed


def test_a_search_is_read_once_however_few_runs_it_finds(
    admin_client: Client, runs: dict[str, int]
) -> None:
    with CaptureQueriesContext(connection) as queries:
        html = admin_client.get(RUNS, {"q": "Adams"}).content.decode()
    assert f"/admin/workflows/run/{runs['eve']}/change/" in html and "1 run" in html
    searched = [q["sql"] for q in queries.captured_queries if "ILIKE" in q["sql"]]
    assert len(searched) == 1, searched


def test_the_list_shows_times_to_the_second(admin_client: Client, runs: dict[str, int]) -> None:
    html = admin_client.get(RUNS).content.decode()
    created = Run.objects.get(pk=runs["eve"]).created_at
    assert f"{created:%Y-%m-%d %H:%M:%S}" in html
