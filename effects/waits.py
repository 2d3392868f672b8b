"""What a step parked by effects waits on, in words (workflows.plugins.admin's
``register_wait_describer``): an effect in review, a broken connection, an exhausted model
budget. Each reads its rows for a whole page at once, by organisation and id."""

from __future__ import annotations

from collections.abc import Sequence

from django.urls import reverse

from workflows.plugins.admin import Wait, WaitDescription, register_wait_describer

from .models import Connection, Effect


def _parked_id(wait: Wait) -> int | None:
    """The id after the colon of ``parked_on`` ("effect:12" -> 12)."""
    _, _, raw = str(wait.detail.get("parked_on", "")).partition(":")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else None


def describe_effects(waits: Sequence[Wait]) -> list[WaitDescription | None]:
    """An effect whose outcome is unknown, in review: its full key (as the provider was sent
    it, to look it up there), its state and why; it links to the effect, where a person
    resolves it."""
    ids = {i for i in (_parked_id(w) for w in waits) if i is not None}
    orgs = {w.org_id for w in waits}
    effects = {e.pk: e for e in Effect.objects.filter(pk__in=ids, org_id__in=orgs)}
    answers: list[WaitDescription | None] = []
    for wait in waits:
        effect = effects.get(_parked_id(wait) or 0)
        if effect is None or effect.org_id != wait.org_id:
            answers.append(None)
            continue
        why = f": {effect.error}" if effect.error else ""
        answers.append(WaitDescription(
            f"effect {effect.sent_key} ({effect.get_state_display().lower()}{why}) to be "
            "resolved by a person",
            admin_url=reverse("admin:effects_effect_change", args=[effect.pk]),
            api_path=f"/api/v1/effects/{effect.pk}",
        ))  # fmt: skip
    return answers


def describe_connections(waits: Sequence[Wait]) -> list[WaitDescription | None]:
    """A broken connection: its name and why; it links to the connection, to repair it."""
    ids = {i for i in (_parked_id(w) for w in waits) if i is not None}
    orgs = {w.org_id for w in waits}
    connections = {c.pk: c for c in Connection.objects.filter(pk__in=ids, org_id__in=orgs)}
    answers: list[WaitDescription | None] = []
    for wait in waits:
        connection = connections.get(_parked_id(wait) or 0)
        if connection is None or connection.org_id != wait.org_id:
            answers.append(None)
            continue
        why = connection.broken_reason or str(wait.detail.get("reason") or "")
        answers.append(WaitDescription(
            f"connection {connection.name} ({connection.status}{': ' + why if why else ''}) "
            "to be repaired",
            admin_url=reverse("admin:effects_connection_change", args=[connection.pk]),
            api_path=f"/api/v1/connections/{connection.name}",
        ))  # fmt: skip
    return answers


def describe_budgets(waits: Sequence[Wait]) -> list[WaitDescription | None]:
    """The organisation's model budget, spent: it goes on once the budget is raised."""
    return [
        WaitDescription(
            "a raise of the organisation's model budget (it is spent; this call needs "
            f"{w.detail.get('reserve', '?')})",
            admin_url=reverse("admin:effects_modelbudget_changelist"),
        )
        for w in waits
    ]


def register() -> None:
    register_wait_describer("effect", describe_effects)
    register_wait_describer("connection", describe_connections)
    register_wait_describer("budget", describe_budgets)
