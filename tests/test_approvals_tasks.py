"""The ``task`` step: a person answers a small form; the checked answer is the step's output.
Same assignment, deadline and audit rules as approvals."""

from __future__ import annotations

import pytest

from approvals.forms import schema_problems
from approvals.models import ApprovalRequest, DecisionAttempt
from approvals.services import Actor, decide
from workflows.definitions.registry import StepReport, registry
from workflows.models import Run

from .effect_setup import drive, start
from .test_approvals_setup import fire_deadline_and_run, pass_deadline, person, task_definition

pytestmark = pytest.mark.django_db(transaction=True)


def open_task(org, **fields) -> tuple[Run, ApprovalRequest]:
    run_id = start(org, task_definition(**fields), slug="tasks", run_input={"amount": 7})
    drive(lane="human")
    return Run.objects.get(pk=run_id), ApprovalRequest.objects.get(run_id=run_id)


def test_an_answer_is_checked_against_the_form_and_becomes_the_output(org, api) -> None:
    run, task = open_task(org)
    assert (task.kind, task.status, task.content["form"]["fields"][0]["name"]) == (
        "task",
        "pending",
        "invoice",
    )
    url = f"/api/v1/tasks/{task.pk}/submit"

    bad = api.post(
        url,
        {
            "answer": {
                "amount": -1,
                "due": "2025-02-30",
                "channel": "fax",
                "scan": "../etc/passwd",
                "extra": 1,
            }
        },
        format="json",
    )
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_answer")
    assert set(bad.json()["errors"]) == {"invoice", "amount", "due", "channel", "scan", "extra"}
    task.refresh_from_db()
    assert task.status == "pending"

    good = api.post(
        url,
        {
            "answer": {
                "invoice": "INV-7",
                "amount": "12.5",
                "due": "2025-02-28",
                "channel": "post",
                "scan": "inv 7.pdf",
            }
        },
        format="json",
    )
    assert good.status_code == 200, good.json()
    run.refresh_from_db()
    assert (run.status, run.output) == ("succeeded", "INV-7")
    task.refresh_from_db()
    assert task.answer == {
        "invoice": "INV-7",
        "amount": 12.5,
        "due": "2025-02-28",
        "channel": "post",
        "scan": "inv 7.pdf",
    }
    again = api.post(url, {"answer": {"invoice": "INV-8"}}, format="json")
    assert again.json()["code"] == "already_decided"
    reasons = list(DecisionAttempt.objects.order_by("id").values_list("reason", flat=True))
    assert reasons == ["invalid_answer", "accepted", "already_decided"]
    # A task is not an approval: it cannot be approved, and an approval is not a task.
    assert (
        api.post(
            f"/api/v1/approvals/{task.pk}/decide", {"decision": "approve"}, format="json"
        ).status_code
        == 404
    )


def test_a_person_answers_only_if_assigned_and_the_deadline_ends_the_wait(org) -> None:
    run, task = open_task(org)
    sam = person(org, "sam", group="sales")
    refused = decide(
        task.pk,
        decision="submit",
        kind="task",
        answer={"invoice": "x"},
        actor=Actor(via="admin", name="sam", user=sam),
    )
    assert refused.code == "not_an_approver"
    pass_deadline(task)
    fire_deadline_and_run()
    run.refresh_from_db()
    task.refresh_from_db()
    assert (task.status, run.output) == ("expired", "late")


def test_the_form_schema_is_validated_when_the_definition_is_saved() -> None:
    assert schema_problems(task_definition()["steps"][0]["form"]) == []
    broken = {
        "fields": [
            {"name": "A b", "type": "colour"},
            {"name": "c", "type": "choice"},
            {"name": "d", "type": "text", "min": 1},
        ]
    }
    assert [path for path, _ in schema_problems(broken)] == [
        "form.fields.0.name",
        "form.fields.0.type",
        "form.fields.1.choices",
        "form.fields.2.min",
    ]
    task_type = registry.get("task")
    assert task_type is not None and task_type.built and task_type.lane == "human"
    report = StepReport("fill")
    task_type.validate(
        {
            "type": "task",
            "assignees": ["group:x"],
            "message": "m",
            "deadline": "1d",
            "form": broken,
        },
        report,
    )
    assert len(report.issues) == 4
