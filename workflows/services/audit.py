"""The audit log's writes: who acted (``Actor``), ``record_audit`` in the action's own
transaction, and the retention purge.

Every action a person, an API key or a command takes from the admin, the API or the command
line (run control, decisions, resolutions, keys, connections, the egress allowlist,
publishing, webhook subscriptions) records one entry through ``record_audit``, called inside
the transaction that makes the change: both commit, or neither does. The apps reach it
through the door (``workflows.plugins.record_audit``).
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError

from ..engine import sql
from ..models import ActorKind, ApiKey, AuditEntry, Organisation

# Who acted, as the run history names them (``detail.by``): the label's prefix per kind.
_LABEL_PREFIX = {
    ActorKind.USER: "admin",
    ActorKind.API_KEY: "api_key",
    ActorKind.SLACK_USER: "slack",
    ActorKind.COMMAND: "command",
}
_KIND_OF_PREFIX = {prefix: kind for kind, prefix in _LABEL_PREFIX.items()}
LABEL_CHARS = 100  # the run history's `worker` column, where a label is also written
ACTION = re.compile(r"[a-z][a-z_]*\.[a-z][a-z_]*")  # "run.cancel", "api_key.revoke"
# A detail key naming one of these is refused unless its value is a yes or no ("secret_set":
# true): a secret never reaches the audit log.
SECRET_WORDS = ("secret", "password", "token", "credential", "private_key")


@dataclass(frozen=True)
class Actor:
    """Who did it: a kind (``ActorKind``), a stable id and a name for people."""

    kind: str
    id: str
    display: str

    @property
    def label(self) -> str:
        """How the run history names them: ``admin:<user>``, ``api_key:<prefix>``,
        ``slack:<name>``, ``command:<os user>``, or a system actor's id."""
        prefix = _LABEL_PREFIX.get(ActorKind(self.kind))
        shown = self.id if self.kind in (ActorKind.API_KEY, ActorKind.COMMAND) else self.display
        return (f"{prefix}:{shown}" if prefix else self.id)[:LABEL_CHARS]

    @classmethod
    def user(cls, user: Any) -> Actor:
        """A person signed in to the admin (a Django user)."""
        name = str(user.get_username())
        return cls(ActorKind.USER, str(user.pk), name)

    @classmethod
    def api_key(cls, key: ApiKey) -> Actor:
        return cls(ActorKind.API_KEY, key.prefix, key.name or key.prefix)

    @classmethod
    def slack(cls, *, team_id: str, user_id: str, name: str) -> Actor:
        return cls(ActorKind.SLACK_USER, f"{team_id}:{user_id}", name or user_id)

    @classmethod
    def command(cls, user: str | None = None) -> Actor:
        """A management command, run by this operating-system user."""
        who = user or getpass.getuser()
        return cls(ActorKind.COMMAND, who, who)

    @classmethod
    def system(cls, name: str = "waymark") -> Actor:
        return cls(ActorKind.SYSTEM, name, name)

    @classmethod
    def from_label(cls, label: str) -> Actor:
        """The actor a history label names (``api_key:ab12``, ``admin:ada``, ``command:ops``);
        anything else is a system actor of that name. For callers that name who acted by
        label only (the run-control service's own tests, scripts)."""
        prefix, sep, rest = label.partition(":")
        kind = _KIND_OF_PREFIX.get(prefix) if sep else None
        if kind is None or not rest:
            return cls.system(label)
        return cls(kind, rest, rest)


def as_actor(actor: Actor | str) -> Actor:
    return actor if isinstance(actor, Actor) else Actor.from_label(actor)


def record_audit(
    *,
    org: Organisation | int,
    actor: Actor,
    action: str,
    target_type: str,
    target_id: object,
    detail: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """Append one entry, in the caller's transaction (refused outside one: the action and its
    record commit together). ``action`` is a stable code (``"run.cancel"``); ``detail`` is
    JSON and holds no secret (a key naming a secret, a password or a token is refused unless
    its value is true, false or null: ``{"secret_replaced": true}`` says what happened)."""
    if not connection.in_atomic_block:
        raise TransactionManagementError(
            "record_audit joins the transaction of the action it records; call it inside one"
        )
    if not ACTION.fullmatch(action):
        raise ValueError(f"audit action {action!r} is not a code like 'run.cancel'")
    clean = dict(detail or {})
    _refuse_secrets(clean)
    return AuditEntry.objects.create(
        org_id=org if isinstance(org, int) else org.pk,
        actor_kind=ActorKind(actor.kind).value,
        actor_id=actor.id[:150],
        actor_display=actor.display[:150],
        action=action,
        target_type=target_type[:40],
        target_id=str(target_id)[:200],
        detail=clean,
    )


def _refuse_secrets(value: Any, path: str = "detail") -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            flag = item is None or isinstance(item, bool)
            if not flag and any(word in str(key).lower() for word in SECRET_WORDS):
                raise ValueError(f"{path}.{key}: the audit log never records a secret")
            _refuse_secrets(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _refuse_secrets(item, f"{path}[{index}]")


def retention_seconds() -> float:
    return float(settings.WAYMARK.get("AUDIT_RETENTION_DAYS", 0)) * 86_400


def purge_audit(
    *, older_than_seconds: float | None = None, batch: int = 5_000, max_batches: int = 20
) -> int:
    """Delete audit entries older than the retention (``WAYMARK_AUDIT_RETENTION_DAYS``; 0,
    the default, keeps them forever), oldest first, a batch per transaction; how many went.
    Each transaction announces its horizon to the append-only trigger, which lets entries
    older than it go and refuses every other deletion."""
    age = retention_seconds() if older_than_seconds is None else older_than_seconds
    if age <= 0:
        return 0
    purged = 0
    for _ in range(max_batches):
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql.AUDIT_PURGE_BEFORE, {"age": age})
            cursor.execute(sql.PURGE_AUDIT, {"batch": batch})
            deleted = cursor.rowcount
        purged += deleted
        if deleted < batch:
            break
    return purged
