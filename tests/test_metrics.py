"""`/metrics`: Prometheus' text format, parsed by prometheus-client's own parser.

- The endpoint: off without WAYMARK_METRICS_TOKEN, and only for a scraper that shows it.
- The gauges read from the database when scraped (ready steps, runs, effects, circuit
  breakers, timers, outbox), from rows the test writes.
- Every process's counters summed: two processes record into one directory, one scrape
  reads both.
- The real engine (`runengine`: web, relay, sweep, workers, as processes) runs automations
  with an effect and a wait against a local stub; the web's /metrics then shows what the
  workers, the relay, the sweeper and the web itself counted.

No label names an organisation, and a raw path never becomes a label.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from effects.models import Effect
from workflows.engine.scrape import (
    DIRECTORY_PREFIX,
    MULTIPROC_ENV,
    SCRAPE_COLLECTORS,
    multiprocess_directory,
    process_died,
)
from workflows.engine.supervisor import EXIT_CONFIG, Child, Supervisor
from workflows.models import Run, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start

from .effect_setup import connect, post_item
from .processes import ROOT, engine_env, wait_for
from .stubs import ProviderStub
from .test_web_server import free_port

TOKEN = "scrape-token-0123456789"
BEARER = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
# Every label any Waymark family carries: bounded sets, none naming a tenant.
LABELS = {"lane", "result", "final", "task", "method", "route", "status", "state", "provider",
          "collector", "le"}  # fmt: skip


def families(text: str) -> dict[str, list[Sample]]:
    """Waymark's families by name (counters without their _total), each with its samples."""
    parsed = text_string_to_metric_families(text)
    return {f.name: f.samples for f in parsed if f.name.startswith("waymark_")}


def value(found: dict[str, list[Sample]], family: str, sample: str | None = None,
          **labels: str) -> float:  # fmt: skip
    """The one sample of ``family`` named ``sample`` (the family's name by default) with
    ``labels``; 0 when the family has none such (a labelled counter not yet incremented)."""
    name = sample or family
    matching = [
        s.value for s in found.get(family, [])
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]  # fmt: skip
    assert len(matching) <= 1, f"{name}{labels} is ambiguous: {matching}"
    return matching[0] if matching else 0.0


@pytest.fixture
def token(settings):
    settings.WAYMARK = {**settings.WAYMARK, "METRICS_TOKEN": TOKEN}


def scrape(client) -> dict[str, list[Sample]]:
    response = client.get("/metrics", **BEARER)
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return families(response.content.decode())


# --- the endpoint --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_metrics_are_off_without_a_token(client) -> None:
    response = client.get("/metrics", **BEARER)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


@pytest.mark.django_db
def test_a_scrape_must_show_the_token(client, token) -> None:
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong-token-0123456789"},
                    {"HTTP_AUTHORIZATION": f"Basic {TOKEN}"}):  # fmt: skip
        refused = client.get("/metrics", **headers)
        assert refused.status_code == 401
        assert refused.json()["code"] == "not_authenticated"
        assert refused["WWW-Authenticate"] == "Bearer"
        assert b"waymark_" not in refused.content
    posted = client.post("/metrics", **BEARER)
    assert posted.status_code == 405 and posted.json()["code"] == "method_not_allowed"


def test_a_short_token_is_refused_at_start_up() -> None:
    code = "import waymark_config.defaults"
    env = {**engine_env(), "WAYMARK_METRICS_TOKEN": "short"}
    ran = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         timeout=60)  # fmt: skip
    assert ran.returncode != 0
    assert b"invalid_setting: WAYMARK_METRICS_TOKEN must be at least 16 characters" in ran.stderr


# --- the gauges read from the database -----------------------------------------------------------


@pytest.mark.django_db
def test_the_gauges_read_what_the_database_holds(client, token, org) -> None:
    endpoint = connect(org, base_url="http://127.0.0.1:9", circuit="open")
    connect(org, name="mail", provider="email", status="broken")
    automation_publish_definition(org=org, slug="send", definition={
        "start": "send",
        "steps": [{"id": "send", **post_item("http://127.0.0.1:9"), "next": "done"},
                  {"id": "done", "type": "end"}],
    })  # fmt: skip
    run_id = run_start(org=org, automation_slug="send", run_input={"n": 1}, start_key="a").run_id
    run_start(org=org, automation_slug="send", run_input={"n": 2}, start_key="b")
    # The first run's step has been claimable for two minutes.
    Step.objects.filter(run_id=run_id).update(lease_until=timezone.now() - timedelta(minutes=2))
    Effect.objects.create(org=org, run_id=run_id, step_id="send", iteration=1, key="k",
                          provider="http", connection=endpoint, state="needs_review")  # fmt: skip
    Run.objects.filter(pk=run_id).update(status="paused")

    found = scrape(client)

    assert value(found, "waymark_steps_ready", lane="io") == 2
    assert value(found, "waymark_steps_ready", lane="slow") == 0
    # Aged by the database's clock at the scrape's transaction (this test's): a little less.
    assert 100 <= value(found, "waymark_oldest_ready_step_age_seconds", lane="io") <= 120
    assert value(found, "waymark_runs", status="running") == 1
    assert value(found, "waymark_runs", status="paused") == 1
    assert value(found, "waymark_effects", state="needs_review") == 1
    assert value(found, "waymark_effects", state="in_flight") == 0
    assert value(found, "waymark_circuit_breakers_open", provider="http", state="open") == 1
    assert value(found, "waymark_circuit_breakers_open", provider="email", state="open") == 0
    assert value(found, "waymark_connections_broken", provider="email") == 1
    assert value(found, "waymark_timers_overdue_seconds") == 0
    assert "waymark_outbox_oldest_unsent_age_seconds" in found
    for collector in ("workflows", "effects", "timers"):
        assert value(found, "waymark_metrics_collector_up", collector=collector) == 1
    assert_bounded_labels(found)


@pytest.mark.django_db
def test_a_failing_collector_is_left_out_and_the_rest_is_served(client, token, monkeypatch) -> None:
    def broken() -> Iterator:
        raise RuntimeError("the database said no")

    monkeypatch.setitem(SCRAPE_COLLECTORS, "broken", broken)
    found = scrape(client)
    assert value(found, "waymark_metrics_collector_up", collector="broken") == 0
    assert value(found, "waymark_metrics_collector_up", collector="workflows") == 1
    assert "waymark_runs" in found


@pytest.mark.django_db
def test_requests_are_timed_by_route_never_by_raw_path(client, token) -> None:
    client.get("/livez")
    client.get("/no/such/page-4815162342")
    found = scrape(client)
    duration = "waymark_http_request_duration_seconds"
    timed = {"sample": duration + "_count", "method": "GET"}
    assert value(found, duration, route="/livez", status="200", **timed) >= 1
    assert value(found, duration, route="unmatched", status="404", **timed) >= 1
    routes = {s.labels.get("route") for s in found[duration]}
    assert not any("4815162342" in route for route in routes if route)


# --- every process's counters, summed ------------------------------------------------------------


@pytest.mark.django_db
def test_a_scrape_sums_the_counters_of_every_process(client, token, tmp_path, monkeypatch) -> None:
    """Two processes record into one directory (as runengine's children do); one of them has
    exited (its counts stay). The scrape, in a third process, reads both."""
    record = (
        "import sys; from workflows.engine import metrics; n = int(sys.argv[-1]); "
        "metrics.steps_claimed('io', n); metrics.step_settled('io', 'succeeded'); "
        "metrics.relay_published(n, 0.2)"
    )
    env = engine_env(**{MULTIPROC_ENV: str(tmp_path)})
    env.setdefault("DJANGO_SETTINGS_MODULE", "waymark_config.settings")
    for count in ("3", "4"):
        subprocess.run([sys.executable, "-c", f"import django; django.setup(); {record}", count],
                       cwd=ROOT, env=env, check=True, timeout=120)  # fmt: skip
    assert len(list(tmp_path.glob("counter_*.db"))) == 2  # one file per process

    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    found = scrape(client)
    assert value(found, "waymark_steps_claimed", "waymark_steps_claimed_total", lane="io") == 7
    settled = value(found, "waymark_steps_settled", "waymark_steps_settled_total", lane="io",
                    result="succeeded")  # fmt: skip
    assert settled == 2
    assert value(found, "waymark_relay_published", "waymark_relay_published_total") == 7
    assert value(found, "waymark_relay_lag_seconds", "waymark_relay_lag_seconds_count") == 2
    assert "waymark_runs" in found  # the database's gauges come with them


def test_runengine_gives_its_children_a_fresh_directory_and_removes_it(
    tmp_path, monkeypatch
) -> None:
    """Made when runengine starts (after removing those of runengines that were killed),
    set for its children, removed when it stops. Another runengine's, alive, is left."""
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = tmp_path / f"{DIRECTORY_PREFIX}{gone.pid}-x1"
    alive = tmp_path / f"{DIRECTORY_PREFIX}{os.getpid()}-x2"
    for directory in (orphan, alive):
        directory.mkdir()
        (directory / "counter_1.db").write_bytes(b"")
    with multiprocess_directory() as path:
        assert os.environ[MULTIPROC_ENV] == str(path) and path.parent == tmp_path
        assert not orphan.exists() and alive.exists()
    assert not path.exists() and MULTIPROC_ENV not in os.environ


def test_a_dead_childs_live_gauges_go_and_its_counts_stay(tmp_path, monkeypatch) -> None:
    """The supervisor reports a child that exited; runengine's bookkeeping
    (prometheus-client's mark_process_dead) removes only its live gauges."""
    child = Child("gone", [sys.executable, "-c", f"raise SystemExit({EXIT_CONFIG})"])
    died: list[int] = []
    assert Supervisor([child], grace_seconds=1, on_exit=died.append).run() is not None
    assert child.process is not None and died == [child.process.pid]

    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    live, counts = tmp_path / f"gauge_livesum_{died[0]}.db", tmp_path / f"counter_{died[0]}.db"
    live.write_bytes(b"")
    counts.write_bytes(b"")
    process_died(died[0])
    assert not live.exists() and counts.exists()


# --- the real engine -----------------------------------------------------------------------------

RUNS = 4


@pytest.fixture
def provider() -> Iterator[ProviderStub]:
    with ProviderStub(idempotent=True) as stub:
        yield stub


def start_engine(procs: list, out: Path) -> int:
    """`runengine` with its web (one process) on a free port, its output in ``out``; the
    port, once it is ready."""
    port = free_port()
    with out.open("wb") as sink:
        engine = subprocess.Popen(
            [sys.executable, "manage.py", "runengine", "--port", str(port), "--web-workers", "1",
             "--grace", "1"],
            cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
            env=engine_env(WAYMARK_METRICS_TOKEN=TOKEN, WAYMARK_SWEEP_SECONDS="0.2",
                           WAYMARK_LOG_LEVEL="WARNING"),
        )  # fmt: skip
    procs.append(engine)
    wait_for(lambda: b"ready" in out.read_bytes() or engine.poll() is not None,
             timeout=120, what="runengine to say ready")  # fmt: skip
    assert engine.poll() is None, out.read_text(errors="replace")[-3000:]
    return port


def scrape_http(port: int) -> dict[str, list[Sample]]:
    answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30,
                       headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert answer.status_code == 200, answer.text[:500]
    return families(answer.text)


@pytest.mark.django_db(transaction=True)
def test_the_engines_processes_are_counted_in_one_scrape(org, provider, procs, tmp_path) -> None:
    """Runs that call a provider (io lane), wait a second (a timer) and end; one that the
    provider refuses (a 404: failed for good). The web's /metrics then shows what every
    process counted: the io worker's claims and settles, the sweeper's timers and
    housekeeping, the relay's wake-ups, the web's own requests."""
    connect(org, base_url=provider.url)
    automation_publish_definition(org=org, slug="call-then-wait", definition={
        "start": "call",
        "steps": [{"id": "call", **post_item(provider.url), "next": "pause"},
                  {"id": "pause", "type": "wait", "duration": "1s", "next": "done"},
                  {"id": "done", "type": "end"}],
    })  # fmt: skip
    refused = {"type": "http", "connection": "api", "request": {"method": "POST",
               "url": f"{provider.url}/nowhere", "body": {}}}  # fmt: skip
    automation_publish_definition(org=org, slug="refused", definition={
        "start": "call", "steps": [{"id": "call", **refused, "next": "done"},
                                   {"id": "done", "type": "end"}],
    })  # fmt: skip
    out = tmp_path / "engine.out"
    port = start_engine(procs, out)
    runs = [
        run_start(org=org, automation_slug="call-then-wait", run_input={"n": n},
                  start_key=f"run-{n}").run_id
        for n in range(RUNS)
    ]  # fmt: skip
    runs.append(run_start(org=org, automation_slug="refused", run_input={}, start_key="no").run_id)

    def finished() -> bool:
        ended = Run.objects.filter(pk__in=runs, status__in=("succeeded", "failed"))
        return ended.count() == len(runs)

    wait_for(finished, timeout=120, what="every run to finish")
    assert Run.objects.filter(pk__in=runs, status="succeeded").count() == RUNS

    def counted() -> dict[str, list[Sample]] | None:
        """A scrape once every process's counts of that work are in (the relay and the
        sweeper record after their commit: the runs may have finished a moment before)."""
        found = scrape_http(port)
        enough = (
            value(found, "waymark_timer_lateness_seconds",
                  "waymark_timer_lateness_seconds_count") >= RUNS
            and value(found, "waymark_relay_published", "waymark_relay_published_total") >= 1
            and value(found, "waymark_sweep_duration_seconds",
                      "waymark_sweep_duration_seconds_count", task="workflows.sweep") >= 1
        )  # fmt: skip
        return found if enough else None

    found = wait_for(counted, timeout=60, what="the relay's and the sweeper's counts")

    claimed = value(found, "waymark_steps_claimed", "waymark_steps_claimed_total", lane="io")
    assert claimed >= RUNS + 1
    succeeded = value(found, "waymark_steps_settled", "waymark_steps_settled_total",
                      lane="io", result="succeeded")  # fmt: skip
    assert succeeded == RUNS
    failed = value(found, "waymark_steps_failed", "waymark_steps_failed_total", lane="io",
                   final="true")  # fmt: skip
    assert failed == 1
    assert value(found, "waymark_relay_lag_seconds", "waymark_relay_lag_seconds_count") >= 1
    batches = value(found, "waymark_timer_batch_duration_seconds",
                    "waymark_timer_batch_duration_seconds_count")  # fmt: skip
    assert batches >= 1
    # runengine's "ready" came from its probe of /livez, through this web process.
    duration = "waymark_http_request_duration_seconds"
    assert value(found, duration, duration + "_count", route="/livez", method="GET",
                 status="200") >= 1  # fmt: skip
    assert value(found, "waymark_runs", status="running") == 0
    assert value(found, "waymark_steps_ready", lane="io") == 0
    assert value(found, "waymark_effects", state="failed") == 1  # the refused call
    assert value(found, "waymark_effects", state="in_flight") == 0
    assert value(found, "waymark_circuit_breakers_open", provider="http", state="open") == 0
    for collector in ("workflows", "effects", "timers"):
        assert value(found, "waymark_metrics_collector_up", collector=collector) == 1
    assert_bounded_labels(found)
    assert "Traceback" not in out.read_text(errors="replace")


def assert_bounded_labels(found: dict[str, list[Sample]]) -> None:
    used = {name for samples in found.values() for s in samples for name in s.labels}
    assert used <= LABELS, f"labels beyond the bounded ones: {used - LABELS}"
