"""The timers' metrics: how late timers fire, how long a batch takes, and how late the
earliest pending timer is now (read when /metrics is scraped). Registered through the
engine's door (apps.py); docs/reference/metrics.md, "Metrics", lists them."""

from __future__ import annotations

from collections.abc import Iterator

from django.db import connection
from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from workflows.plugins.engine import fetch_dict

from . import sql

TIMER_LATENESS = Histogram(
    "waymark_timer_lateness_seconds",
    "How long after its due instant each timer fired.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
)
TIMER_BATCH_DURATION = Histogram(
    "waymark_timer_batch_duration_seconds",
    "How long a batch of due timers took to fire (one transaction; batches that fired none "
    "are not counted).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


def batch_fired(late_seconds: list[float], seconds: float) -> None:
    if not late_seconds:
        return
    TIMER_BATCH_DURATION.observe(seconds)
    for late in late_seconds:
        TIMER_LATENESS.observe(max(0.0, late))


def timer_gauges() -> Iterator[Metric]:
    with connection.cursor() as cursor:
        cursor.execute(sql.METRICS_OVERDUE)
        row = fetch_dict(cursor)
    yield GaugeMetricFamily(
        "waymark_timers_overdue_seconds",
        "How late the earliest pending timer is (0: none is due yet); it grows while no "
        "sweeper fires timers.",
        value=(row or {}).get("seconds") or 0.0,
    )
