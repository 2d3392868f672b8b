"""The ``task`` step: a person answers a small form; the checked answer is the step's output.
Same assignment, deadline and audit rules as approvals."""

from __future__ import annotations

import pytest

from approvals.forms import FormInvalid, clean_answer, schema_problems
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


def test_each_kind_of_wrong_answer_gets_its_own_message() -> None:
    form = {
        "fields": [
            {"name": "t", "type": "text", "max_length": 3, "required": True},
            {"name": "n", "type": "number", "min": 0, "max": 10},
            {"name": "d", "type": "date"},
            {"name": "e", "type": "date"},
            {"name": "c", "type": "choice", "choices": ["x", "y"]},
            {"name": "f", "type": "file_name"},
            {"name": "z", "type": "text"},
        ]
    }

    def errors(answer):
        with pytest.raises(FormInvalid) as refused:
            clean_answer(form, answer)
        return refused.value.errors

    assert errors({"n": "1e999", "d": "2025-2-1", "e": "2025-02-30", "c": "fax", "z": "a\x00"}) == {
        "t": "is required",
        "n": "must be a number",
        "d": "must be a date as YYYY-MM-DD",
        "e": "must be a real date as YYYY-MM-DD",
        "c": "must be one of x, y",
        "z": "must not contain a NUL character",
    }
    # Digits of another script are not YYYY-MM-DD; a trailing newline is not a file name.
    assert errors({"t": "abcd", "n": 11, "d": "\u0662\u0660\u0662\u0665-01-01", "f": "a\n"}) == {
        "t": "must be at most 3 characters",
        "n": "must be at most 10",
        "d": "must be a date as YYYY-MM-DD",
        "f": "must be a file name (no path, at most 255 characters)",
    }
    assert errors({"q": None, "t": ["x"], "n": True}) == {
        "q": "is not a field of this form",
        "t": "must be text",
        "n": "must be a number",
    }
    assert clean_answer(form, {"t": "ab", "n": " 7 ", "d": "", "e": "2025-02-28"}) == {
        "t": "ab",
        "n": 7,
        "d": None,
        "e": "2025-02-28",
        "c": None,
        "f": None,
        "z": None,
    }


def test_a_form_field_name_ends_where_the_text_ends() -> None:
    # jsonschema matches a pattern with re.search, where $ also matches before a final newline.
    form = {"fields": [{"name": "ab\n", "type": "text"}, {"name": "ab", "type": "text"}]}
    assert schema_problems(form) == [
        ("form.fields.0.name", "must be lowercase letters, digits and _ (at most 63)")
    ]
    twice = {"fields": [{"name": "ab", "type": "text"}, {"name": "ab", "type": "date"}]}
    assert schema_problems(twice) == [("form.fields.1.name", "'ab' is used twice")]
    only_for = {"fields": [{"name": "a", "type": "text", "choices": [""], "max_length": 40.0}]}
    assert schema_problems(only_for) == [
        ("form.fields.0.max_length", "only for text: a whole number 1 to 10000"),
        ("form.fields.0.choices", "only for choice"),
    ]


@pytest.mark.parametrize("amount", [10**400, str(10**400), -(10**400)],
                         ids=["huge", "huge as text", "huge below zero"])  # fmt: skip
def test_a_number_past_what_a_float_holds_is_an_invalid_answer(org, api, amount) -> None:
    # math.isfinite raised OverflowError on it: a 500, and no attempt in the audit.
    _, task = open_task(org)
    answer = {"answer": {"invoice": "INV-9", "amount": amount}}
    refused = api.post(f"/api/v1/tasks/{task.pk}/submit", answer, format="json")

    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_answer"), refused.content
    assert list(refused.json()["errors"]) == ["amount"]
    task.refresh_from_db()
    assert task.status == "pending"
    assert list(DecisionAttempt.objects.values_list("reason", flat=True)) == ["invalid_answer"]
