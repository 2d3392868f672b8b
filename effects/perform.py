"""What an effect step does when it runs: find its connection, render its request, check
consent, and make the call through the ledger (``ledger.run_effect``).

One function per provider-backed step type, made by ``executor_for_provider``; the
providers are named in ``PROVIDERS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from workflows.plugins import StepContext, StepFailure, StepResult

from .allowlist import allowlist_in_force
from .egress import Allowlist
from .ledger import Call, run_effect
from .limits import operator_limit
from .models import Connection
from .providers.base import ConnectionInfo, Provider
from .providers.crm import CrmUpsertProvider
from .providers.email import EmailProvider
from .providers.http import HttpProvider
from .providers.model import ModelProvider
from .providers.slack import SlackMessageProvider
from .secrets import SecretUnreadable, decrypt

MIN_CALL_SECONDS = 1.0  # a call begun just before its attempt's deadline still gets this

PROVIDERS: dict[str, Provider] = {
    provider.name: provider
    for provider in (
        HttpProvider(),
        EmailProvider(),
        CrmUpsertProvider(),
        SlackMessageProvider(),
        ModelProvider(),
    )
}


def executor_for_provider(
    name: str, *, channel: str | None = None
) -> Callable[[Mapping[str, Any], Mapping[str, Any], StepContext], StepResult]:
    """The execute function of a step type backed by provider ``name``; ``channel`` names
    the suppression list its recipients are checked against (it contacts a person)."""

    def execute(
        step: Mapping[str, Any], context: Mapping[str, Any], ctx: StepContext
    ) -> StepResult:
        provider = PROVIDERS[name]
        conn = within_limits(load_connection(ctx.org_id, step.get("connection"), provider), ctx)
        request = provider.prepare(step, context, conn)
        # Consent is checked by the ledger when (and only if) a call is about to begin: an
        # effect already made keeps its answer, and nothing new goes to a suppressed address.
        return run_effect(Call(ctx, provider, conn, request, channel=channel))

    return execute


def load_connection(org_id: int, name: str | None, provider: Provider) -> ConnectionInfo | None:
    """The organisation's connection called ``name``, its secret decrypted for this call."""
    if not name:
        if provider.needs_connection:
            raise StepFailure(f"a {provider.name} step needs a connection", retryable=False,
                              error_class="unknown_connection")  # fmt: skip
        return ConnectionInfo(None, "", provider.name, "", {}, "", allow=_allowlist(org_id))
    row = Connection.objects.filter(org_id=org_id, name=name).first()
    if row is None:
        raise StepFailure(f"unknown connection {name!r}: create it, then retry the run",
                          retryable=False, error_class="unknown_connection")  # fmt: skip
    if row.provider != provider.name:
        raise StepFailure(
            f"connection {name!r} is for {row.provider}, not {provider.name}",
            retryable=False, error_class="unknown_connection",
        )  # fmt: skip
    try:
        secret = decrypt(row.secret_encrypted)
    except SecretUnreadable as exc:
        raise StepFailure(str(exc), retryable=False, error_class="auth") from None
    return ConnectionInfo(
        id=row.pk, name=row.name, provider=row.provider, base_url=row.base_url,
        options=row.options or {}, secret=secret, timeout_seconds=row.timeout_seconds,
        allow=_allowlist(org_id), secret_version=row.secret_version,
    )  # fmt: skip


def within_limits(conn: ConnectionInfo | None, ctx: StepContext) -> ConnectionInfo | None:
    """The connection with its timeout held to what the operator allows
    (WAYMARK_EFFECTS_MAX_TIMEOUT_SECONDS) and to the attempt's time left: a tenant's timeout
    of an hour would otherwise keep a slot past the lane's timeout, so that the attempt came
    back as a suspect to hang again."""
    if conn is None:
        return None
    limit = min(conn.timeout_seconds, operator_limit("timeout_seconds"))
    left = ctx.seconds_left()
    if left is not None:
        limit = min(limit, max(MIN_CALL_SECONDS, left))
    return conn if limit == conn.timeout_seconds else replace(conn, timeout_seconds=limit)


def _allowlist(org_id: int) -> Allowlist:
    """The organisation's entries that the operator's ceiling still covers, read at each
    call: a row saved before the ceiling was lowered opens nothing."""
    return allowlist_in_force(org_id)
