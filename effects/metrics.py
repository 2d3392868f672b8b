"""The effects' gauges, read when /metrics is scraped: effects by state (all but settled,
the ledger's history) and connections whose circuit breaker is not closed, or that are
broken, by provider. Registered through the engine's door (apps.py); docs/reference/metrics.md,
"Metrics", lists them. Labels are states and provider names: never an organisation or a
connection's name."""

from __future__ import annotations

from collections.abc import Iterator

from django.db import connection
from prometheus_client.core import GaugeMetricFamily, Metric

from workflows.plugins.engine import fetch_dicts

from . import sql
from .perform import PROVIDERS
from .states import CircuitState, EffectState

COUNTED_STATES = [state.value for state in EffectState if state != EffectState.SETTLED]
OPEN_CIRCUITS = [CircuitState.OPEN.value, CircuitState.HALF_OPEN.value]


def effect_gauges() -> Iterator[Metric]:
    yield _effects()
    yield from _connections()


def _effects() -> Metric:
    effects = GaugeMetricFamily(
        "waymark_effects",
        "Effects by state, all but settled: in_flight (a call may be under way), "
        "outcome_unknown (to reconcile), needs_review (waiting for a person), failed.",
        labels=["state"],
    )
    counts = {row["state"]: row["effects"] for row in _rows(sql.METRICS_EFFECTS)}
    for state in COUNTED_STATES:
        effects.add_metric([state], counts.get(state, 0))
    return effects


def _connections() -> Iterator[Metric]:
    circuits = GaugeMetricFamily(
        "waymark_circuit_breakers_open",
        "Connections whose circuit breaker is open (calls held back for the cool-down) or "
        "half_open (one probe call on trial), by provider.",
        labels=["provider", "state"],
    )
    broken = GaugeMetricFamily(
        "waymark_connections_broken",
        "Connections marked broken (an authorisation failure: steps wait for a person to "
        "repair them), by provider.",
        labels=["provider"],
    )
    rows = {row["provider"]: row for row in _rows(sql.METRICS_CONNECTIONS)}
    for provider in sorted({*PROVIDERS, *rows}):
        row = rows.get(provider, {})
        for state in OPEN_CIRCUITS:
            circuits.add_metric([provider, state], row.get(state, 0))
        broken.add_metric([provider], row.get("broken", 0))
    yield circuits
    yield broken


def _rows(statement: str) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(statement)
        return fetch_dicts(cursor)
