"""What ``/metrics`` answers: every process's instruments, and gauges read from the database.

- **Every process's instruments** (``metrics.py``, and the apps' own). Under ``runengine``
  each child writes them to memory-mapped files in one directory
  (``PROMETHEUS_MULTIPROC_DIR``, see ``multiprocess_directory``), and a scrape sums the
  files of every process, live or dead: a worker's counts survive its restart. Without that
  directory (``manage.py runserver``, a host's own server) it is this process's own.
- **Gauges read from the database when scraped**: the engine's (ready steps, runs not
  finished, the outbox) and those apps registered (``workflows.plugins
  .register_metrics_collector``). Each collector runs in a transaction of its own under a
  short ``statement_timeout``; one that fails is logged and left out, and
  ``waymark_metrics_collector_up`` says so, so a slow database cannot hold a scrape.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from django.db import connection, transaction
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from . import sql
from .lanes import WORKER_LANES
from .sql.rows import fetch_dict, fetch_dicts

logger = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's own variable
DIRECTORY_PREFIX = "waymark-metrics-"  # runengine's own, in the temporary directory
STATEMENT_TIMEOUT_MS = 2_000  # per statement of a scrape-time collector
ENGINE_COLLECTOR = "workflows"

# name -> a function returning metric families, read from the database (apps register theirs
# through workflows.plugins.register_metrics_collector).
MetricsCollector = Callable[[], Iterable[Metric]]
SCRAPE_COLLECTORS: dict[str, MetricsCollector] = {}


def render(accept: str = "") -> tuple[bytes, str]:
    """The body and content type of a scrape: Prometheus' text format (0.0.4), or the
    format the scraper's ``Accept`` header asks for (OpenMetrics, text 1.0.0)."""
    registry = CollectorRegistry()
    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        MultiProcessCollector(registry, path=directory)
    else:
        registry.register(_ThisProcess())
    registry.register(DatabaseGauges())
    encode, content_type = choose_encoder(accept)
    return encode(registry), content_type


class _ThisProcess(Collector):
    """This process's own instruments (the default registry), when no directory gathers
    every process's."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


class DatabaseGauges(Collector):
    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "waymark_metrics_collector_up",
            "1 when the collector's gauges were read from the database at this scrape, 0 "
            "when it failed (its gauges are missing; the web's log says why).",
            labels=["collector"],
        )
        for name, collect in list(SCRAPE_COLLECTORS.items()):
            families = _collected(name, collect)
            up.add_metric([name], 0 if families is None else 1)
            yield from families or ()
        yield up


def _collected(name: str, collect: MetricsCollector) -> list[Metric] | None:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true)", [str(STATEMENT_TIMEOUT_MS)]
            )
            return list(collect())
    except Exception:
        logger.warning("metrics: the %s collector failed; its gauges are left out", name,
                       exc_info=True)  # fmt: skip
        return None


# --- the engine's own gauges ------------------------------------------------------------------


def engine_gauges() -> Iterator[Metric]:
    yield from _ready_steps()
    yield _live_runs()
    yield _outbox_oldest()


def _ready_steps() -> Iterator[Metric]:
    ready = GaugeMetricFamily(
        "waymark_steps_ready", "Steps claimable now, waiting for a worker.", labels=["lane"]
    )
    oldest = GaugeMetricFamily(
        "waymark_oldest_ready_step_age_seconds",
        "How long the lane's oldest ready step has been claimable (0: none is ready).",
        labels=["lane"],
    )
    rows = {row["lane"]: row for row in _rows(sql.METRICS_READY_STEPS)}
    for lane in sorted({*WORKER_LANES, *rows}):
        row = rows.get(lane, {"ready": 0, "oldest_seconds": 0.0})
        ready.add_metric([lane], row["ready"])
        oldest.add_metric([lane], row["oldest_seconds"] or 0.0)
    yield ready
    yield oldest


def _live_runs() -> Metric:
    runs = GaugeMetricFamily(
        "waymark_runs",
        "Runs not finished, by status (finished runs are history and are not counted).",
        labels=["status"],
    )
    counts = {row["status"]: row["runs"] for row in _rows(sql.METRICS_LIVE_RUNS)}
    for status in ("running", "paused"):
        runs.add_metric([status], counts.get(status, 0))
    return runs


def _outbox_oldest() -> Metric:
    with connection.cursor() as cursor:
        cursor.execute(sql.METRICS_OUTBOX_OLDEST)
        row = fetch_dict(cursor)
    return GaugeMetricFamily(
        "waymark_outbox_oldest_unsent_age_seconds",
        "How long the oldest outbox row not yet published has waited (0: none): the relay's "
        "lag as the database sees it, growing while no relay runs.",
        value=row["seconds"] if row else 0.0,
    )


def _rows(statement: str) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(statement)
        return fetch_dicts(cursor)


# --- the directory every process writes to ------------------------------------------------------


@contextmanager
def multiprocess_directory() -> Iterator[Path]:
    """The directory ``runengine``'s children record their instruments in, for the web's
    ``/metrics`` to sum: a fresh one, removed when runengine stops, set in this process's
    environment, which every child inherits (it must be set before a child imports
    prometheus-client, hence here, before any child starts).

    ``PROMETHEUS_MULTIPROC_DIR`` set by the operator wins and is left as it is: several
    runengines may share it (``--no-web`` and ``--web-only`` on one machine), and emptying
    it would cut off the other's live processes. Emptying it before they all start is the
    operator's (docs/reference/metrics.md, "Metrics")."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    _remove_orphans()
    path = Path(tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-"))
    os.environ[MULTIPROC_ENV] = str(path)
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def _remove_orphans() -> None:
    """The directories of runengines that were killed (SIGKILL, a crash) and could not
    remove their own: named after their pid, removed once no such process lives. Another
    user's cannot be removed, and are not."""
    for orphan in Path(tempfile.gettempdir()).glob(f"{DIRECTORY_PREFIX}*-*"):
        pid = orphan.name.removeprefix(DIRECTORY_PREFIX).partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(orphan, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def process_died(pid: int) -> None:
    """A child exited: its live gauges go (its counters stay, summed with its successor's)."""
    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        mark_process_dead(pid, directory)
