"""The effects' panel on the control room (the admin's first screen): effects waiting for a
person's review (``needs_review``: whether a call was made is for them to find out), and
connections whose circuit breaker is open (their calls wait for the cool-down)."""

from __future__ import annotations

from django.http import HttpRequest
from django.urls import reverse

from workflows.plugins.admin import Line, Panel, capped, register_control_panel
from workflows.plugins.health import COUNT_CAP

from .models import Connection, Effect
from .states import CircuitState, EffectState

SHOWN = 5  # effects to review listed (their list has them all)


def review_and_breakers(request: HttpRequest, orgs: tuple[int, ...]) -> Panel | None:
    if not request.user.has_perm("effects.view_effect"):
        return None
    # Both by effect_org_state (org, state, id): the oldest first, and counted up to the cap.
    review = Effect.objects.filter(org_id__in=orgs, state=EffectState.NEEDS_REVIEW)
    waiting = len(review.values_list("pk", flat=True)[: COUNT_CAP + 1])
    lines = [
        Line(
            text=f"effect {effect.pk} ({effect.provider}, run {effect.run_id} "
            f"{effect.step_id}#{effect.iteration}) waits for review",
            url=reverse("admin:effects_effect_change", args=[effect.pk]),
            tone="warning",
        )
        for effect in review.only("id", "provider", "run_id", "step_id", "iteration").order_by(
            "id"
        )[:SHOWN]
    ]
    # Connections are a few per organisation.
    open_circuits = Connection.objects.filter(
        org_id__in=orgs, circuit__in=[CircuitState.OPEN, CircuitState.HALF_OPEN]
    ).order_by("org_id", "name")
    lines += [
        Line(
            text=f"connection {connection.name} ({connection.provider}): circuit breaker "
            f"{connection.circuit} after {connection.consecutive_failures} failure(s)"
            + (
                f", until {connection.circuit_until:%H:%M:%S} UTC"
                if connection.circuit_until
                else ""
            ),
            url=reverse("admin:effects_connection_change", args=[connection.pk]),
            tone="broken",
        )
        for connection in open_circuits[:20]
    ]
    effects = reverse("admin:effects_effect_changelist")
    return Panel(
        title=f"Effects to review ({capped(waiting)}) and circuit breakers",
        lines=tuple(lines),
        empty="No effect waits for review, and every circuit breaker is closed.",
        links=(Line("Effects to review", f"{effects}?state__exact={EffectState.NEEDS_REVIEW}"),),
        order=50,
    )


def register() -> None:
    register_control_panel("effects.review_and_breakers", review_and_breakers)
