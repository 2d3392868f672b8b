"""What the effect tests share: a connection to a local stub, and automations around one
effect step."""

from __future__ import annotations

from typing import Any

from django.db.models.functions import Now

from effects.models import Connection, EgressAllow
from effects.secrets import encrypt
from workflows.code.testing import run_due_steps
from workflows.engine import group_settle, hops
from workflows.engine.lanes import lane_policy
from workflows.engine.worker import Worker
from workflows.models import Organisation, RunEvent, Step
from workflows.services.automations import automation_publish_definition
from workflows.services.runs import run_start


def connect(
    org: Organisation,
    *,
    provider: str = "http",
    base_url: str = "",
    name: str = "api",
    secret: str = "",
    **fields: Any,
) -> Connection:
    """A connection of ``org`` (and loopback allowlisted: the stubs listen on 127.0.0.1)."""
    EgressAllow.objects.get_or_create(org=org, entry="127.0.0.1/32")
    options = fields.pop("options", {})
    return Connection.objects.create(
        org=org, name=name, provider=provider, base_url=base_url, options=options,
        secret_encrypted=encrypt(secret), **fields,
    )  # fmt: skip


def one_step(
    step: dict[str, Any],
    *,
    retry: int | None = None,
    output: str = "{{ steps.send.output.body.id }}",
) -> dict[str, Any]:
    """An automation: ``step`` (id "send"), then an end that outputs ``output`` (by default
    the id of what an http step created)."""
    step = {"id": "send", **step, "next": "done"}
    if retry is not None:
        step["retry"] = {"max_attempts": retry}
    return {
        "start": "send",
        "steps": [step, {"id": "done", "type": "end", "output": output}],
    }


def post_item(url: str, **extra: Any) -> dict[str, Any]:
    """An http step that creates an item at the provider stub."""
    request = {"method": "POST", "url": f"{url}/items", "body": {"n": "{{ input.n }}"}}
    return {"type": "http", "connection": "api", "request": request, **extra}


def start(org: Organisation, definition: dict[str, Any], *, key: str = "k1",
          run_input: dict[str, Any] | None = None, slug: str = "effect") -> int:  # fmt: skip
    automation_publish_definition(org=org, slug=slug, definition=definition)
    started = run_start(org=org, automation_slug=slug, run_input=run_input or {"n": 1},
                        start_key=key)  # fmt: skip
    return started.run_id


def settle_slowly(monkeypatch: Any) -> None:
    """Every settle the slow way from here on (the test's end undoes it): under the run's
    lock, its walk in the transaction, none planned as a hop (engine/hops.py)."""
    for module in (hops, group_settle):
        monkeypatch.setattr(module, "plan_hop", lambda *args, **kwargs: None)


def drive(*, lane: str = "io", rounds: int = 50, fast_forward: bool = True) -> int:
    """Run the lane's ready steps in this process through a real Worker's code path (claim,
    execute, settle), round after round, until none is ready; return how many ran. With
    ``fast_forward``, steps waiting out a retry or a deferral are made due at once (their
    recorded delay is what the tests assert, not the wait)."""
    worker = Worker(lane_policy(lane), concurrency=1, name="test-worker")
    ran = 0
    for _ in range(rounds):
        if fast_forward:
            Step.objects.filter(status="waiting", wait_kind="retry").update(wake_at=Now())
        ran_now = run_due_steps(worker)
        if not ran_now:
            break
        ran += ran_now
    return ran


def events(run_id: int, kind: str) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, kind=kind).order_by("id"))
