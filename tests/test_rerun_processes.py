"""Re-run from a step on the real engine (`runengine` processes, through the API): the
chain an operator fixes, email (an effect) -> wait -> charge (an http call whose path comes
from the input: a bad one is refused for good, 404). Re-run from the failing step with the
input fixed, it succeeds and the email went once; re-run from the first step, the settled
effects are reused (nothing is sent again, the wait waits again); with repeat_effects each
is made again under its new key. An effect, then a wait, then a re-run: the case the
composition tests add to every pair (tests/composition.py) in one automation.

Its own module: the engine's processes, shared by a module's tests, would take the steps of
runs that tests/test_rerun.py drives in its own process.
"""

from __future__ import annotations

from typing import Any

import pytest

from workflows.models import AuditEntry, Run, RunEvent

from .effect_setup import events
from .engine_harness import Harness

pytestmark = pytest.mark.django_db(transaction=True)


def history(run_id: int) -> list[str]:
    return list(
        RunEvent.objects.filter(run_id=run_id).order_by("id").values_list("kind", flat=True)
    )


def chain(api: str = "{{ input.api }}") -> dict[str, Any]:
    """email -> wait (1 s) -> charge -> done."""
    charge = {"method": "POST", "url": api + "/{{ input.charge_path }}",
              "body": {"order": "{{ input.order }}"}}  # fmt: skip
    return {
        "start": "email",
        "steps": [
            {"id": "email", "type": "email", "connection": "mail", "to": "ada@example.com",
             "subject": "Order {{ input.order }}", "body": "Thanks", "next": "pause"},
            {"id": "pause", "type": "wait", "duration": "1s", "next": "charge"},
            {"id": "charge", "type": "http", "connection": "api", "request": charge,
             "retry": {"max_attempts": 1}, "next": "done"},
            {"id": "done", "type": "end",
             "output": {"charged": "{{ steps.charge.output.body.id }}"}},
        ],
    }  # fmt: skip


def test_a_run_failed_on_bad_input_is_re_run_from_the_failing_step_with_the_input_fixed(
    harness: Harness,
) -> None:
    api_url = harness.stubs.provider.url
    slug = harness.publish(chain())
    run_id = harness.start(slug, {"api": api_url, "charge_path": "nope", "order": "A1"})
    run = harness.wait_finished([run_id])[run_id]
    assert run.status == "failed" and "step 'charge' failed" in run.error
    assert harness.stub_hits(f"{run_id}/email/1") == 1

    # The preview (dry_run is the default) changes nothing and says what would happen.
    fixed = {"api": api_url, "charge_path": "items", "order": "A1"}
    preview = harness.call("POST", f"/api/v1/runs/{run_id}/rerun",
                           {"from_step": "charge", "input": fixed}, expect=200)  # fmt: skip
    assert preview["dry_run"] is True and preview["status"] == "failed"
    assert preview["input_changes"] == [
        {"key": "charge_path", "before": "nope", "after": "items"}]  # fmt: skip
    assert preview["effects"] == []  # the failed charge made nothing; email is upstream
    assert Run.objects.get(pk=run_id).status == "failed"
    assert "run.rerun" not in history(run_id)

    body = {"from_step": "charge", "input": fixed, "dry_run": False}
    done = harness.call("POST", f"/api/v1/runs/{run_id}/rerun", body, expect=200)
    assert done["dry_run"] is False and done["status"] == "running"
    run = harness.wait_finished([run_id])[run_id]
    assert run.status == "succeeded", run.error
    assert run.input["charge_path"] == "items"
    assert str((run.output or {}).get("charged")).startswith("item_")
    assert harness.stub_hits(f"{run_id}/email/1") == 1  # the email went once in all
    assert harness.effect_keys(run_id) == {
        f"{run_id}/email/1": 1,
        f"{run_id}/charge/1": 1,
        f"{run_id}/charge/2": 1,
    }  # (1: refused, 404)
    (edited,) = events(run_id, "run.edited")
    assert edited.detail is not None
    assert edited.detail["input"] == [{"key": "charge_path", "before": "nope", "after": "items"}]
    assert history(run_id).index("run.edited") < history(run_id).index("run.rerun")

    # Succeeded, re-run from the first step without repeating effects: nothing is sent again;
    # the wait waits again (a new timer), and the history says what was reused.
    again = harness.call("POST", f"/api/v1/runs/{run_id}/rerun",
                         {"from_step": "email", "dry_run": False}, expect=200)  # fmt: skip
    assert [(e["step_id"], e["action"], e["new_key"]) for e in again["effects"]] == [
        ("email", "reuse", f"{run_id}/email/2"),
        ("charge", "reuse", f"{run_id}/charge/3"),
    ]
    run = harness.wait_finished([run_id])[run_id]
    assert run.status == "succeeded", run.error
    assert harness.effect_keys(run_id) == {f"{run_id}/email/1": 1, f"{run_id}/charge/1": 1,
                                           f"{run_id}/charge/2": 1}  # fmt: skip
    reused = [(e.step_id, e.iteration, (e.detail or {})["reused"])
              for e in events(run_id, "effect.reused")]  # fmt: skip
    assert reused == [("email", 2, f"{run_id}/email/1"), ("charge", 3, f"{run_id}/charge/2")]
    assert ("pause", 2, "done") in harness.path(run_id)

    # With repeat_effects each is made again, under its new key.
    body = {"from_step": "email", "repeat_effects": True, "dry_run": False}
    harness.call("POST", f"/api/v1/runs/{run_id}/rerun", body, expect=200)
    run = harness.wait_finished([run_id])[run_id]
    assert run.status == "succeeded", run.error
    assert harness.effect_keys(run_id) == {
        f"{run_id}/email/1": 1, f"{run_id}/charge/1": 1, f"{run_id}/charge/2": 1,
        f"{run_id}/email/3": 1, f"{run_id}/charge/4": 1,
    }  # fmt: skip
    assert len(events(run_id, "effect.reused")) == 2  # none more
    assert AuditEntry.objects.filter(action="run.rerun", target_id=str(run_id)).count() == 3
