"""The audit log's door for apps: record who did what, in the transaction of the action.

    from workflows.plugins.audit import Actor, record_audit

    with transaction.atomic():
        connection.save()
        record_audit(org=connection.org, actor=Actor.user(request.user),
                     action="connection.update", target_type="connection",
                     target_id=connection.name, detail={"fields": ["base_url"]})

``record_audit`` refuses to run outside a transaction (the action and its record commit
together, or neither does) and refuses a ``detail`` key that names a secret. ``Actor``
names who acted: ``Actor.user(user)`` (the admin), ``Actor.api_key(key)`` (the API; see
``workflows.plugins.api.request_actor``), ``Actor.slack(...)``, ``Actor.command()``,
``Actor.system(name)``; its ``label`` is how the run history names them (``detail.by``).
"""

from __future__ import annotations

from ..models import ActorKind
from ..services.audit import Actor, as_actor, record_audit

__all__ = ["Actor", "ActorKind", "as_actor", "record_audit"]
