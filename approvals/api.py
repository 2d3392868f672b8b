"""Approvals and tasks in the API, scoped to the API key's organisation (routes in
``approvals/urls.py``):

- ``GET /api/v1/approvals`` (``?status=pending``, ``?kind=task``), ``GET .../approvals/{id}``
- ``POST /api/v1/approvals/{id}/decide`` ``{"decision": "approve"|"reject", "comment": ...,
  "digest": ...}``
- ``GET /api/v1/tasks`` (``?status=...``), ``POST /api/v1/tasks/{id}/submit``
  ``{"answer": {...}, "comment": ..., "digest": ...}``

The API key is the organisation: it may decide any of its organisation's requests (a
read-only key may not: 403 ``read_only_key``), and the decision is recorded as the key
(``api_key:<prefix>``). Every attempt is in the audit (``DecisionAttempt``). A refusal is
JSON ``{"code", "detail"}``: 409 ``already_decided`` (with ``decided`` and ``decided_by``),
409 ``expired``, ``run_cancelled``, ``run_finished``, ``step_closed``, ``content_changed``,
400 ``invalid_decision``, ``comment_too_long``, ``invalid_comment`` (text PostgreSQL cannot
store), ``invalid_answer`` (with ``errors``; text PostgreSQL cannot store too), 404
``not_found`` (another organisation's request too). The client address in the audit is read
as the rate limits read it (``services.client_ip``: ``WAYMARK_NUM_PROXIES``).
"""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from workflows.plugins.api import (
    CursorPage,
    ErrorOut,
    JsonObjectField,
    ListEndpoint,
    StrictInput,
    request_key,
)

from .models import ApprovalRequest, RequestKind, RequestStatus
from .services import MAX_COMMENT_CHARS, Actor, Outcome, client_ip, decide


class ApprovalOut(serializers.ModelSerializer[ApprovalRequest]):
    run = serializers.IntegerField(source="run_id")

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
            "kind",
            "status",
            "run",
            "step_id",
            "iteration",
            "content",
            "digest",
            "approvers",
            "level",
            "expires_at",
            "on_timeout",
            "decided_by",
            "decided_via",
            "decided_at",
            "comment",
            "answer",
            "created_at",
        ]


class ApprovalFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=RequestStatus.choices)
    kind = django_filters.ChoiceFilter(choices=RequestKind.choices)

    class Meta:
        model = ApprovalRequest
        fields = ["status", "kind"]


class TaskFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=RequestStatus.choices)

    class Meta:
        model = ApprovalRequest
        fields = ["status"]


class DecideIn(StrictInput):
    decision = serializers.ChoiceField(choices=["approve", "reject"])
    # Longer comments reach decide(), which refuses them (and records the attempt).
    comment = serializers.CharField(
        required=False, allow_blank=True, trim_whitespace=False, max_length=MAX_COMMENT_CHARS * 10
    )
    digest = serializers.RegexField(
        r"^[0-9a-f]{64}$", required=False, help_text="The digest of the content you reviewed."
    )


class SubmitIn(StrictInput):
    answer = JsonObjectField(help_text="The form's fields and their values.")
    comment = serializers.CharField(
        required=False, allow_blank=True, trim_whitespace=False, max_length=MAX_COMMENT_CHARS * 10
    )
    digest = serializers.RegexField(r"^[0-9a-f]{64}$", required=False)


class DecisionOut(serializers.Serializer):
    accepted = serializers.BooleanField()
    detail = serializers.CharField()
    approval = ApprovalOut()


def _actor(request: Request) -> Actor:
    key = request_key(request)
    return Actor(
        via="api",
        name=f"api_key:{key.prefix}",
        org_id=key.org_id,
        ip=client_ip(request),
    )


def _answer(outcome: Outcome) -> Response:
    if outcome.accepted:
        assert outcome.approval is not None
        outcome.approval.refresh_from_db()
        return Response(
            {
                "accepted": True,
                "detail": outcome.message,
                "approval": ApprovalOut(outcome.approval).data,
            }
        )
    return Response(
        {"code": outcome.code, "detail": outcome.message, **outcome.extra}, status=outcome.status
    )


class _List(ListEndpoint):
    """The organisation's requests (of one ``kind``, when set), one cursor page at a time."""

    model = ApprovalRequest
    serializer_class = ApprovalOut
    pagination_class = CursorPage
    kind: str | None = None

    def scoped_queryset(self) -> QuerySet[ApprovalRequest]:
        rows = super().scoped_queryset()
        return rows.filter(kind=self.kind) if self.kind else rows


class ApprovalListView(_List):
    filterset_class = ApprovalFilter

    @extend_schema(
        operation_id="approvals_list",
        responses=ApprovalOut(many=True),
        description="The organisation's approvals and tasks, newest first; "
        "`?status=pending` lists the open ones.",
    )
    def get(self, request: Request) -> Response:
        return self.list_page()


class TaskListView(_List):
    filterset_class = TaskFilter
    kind = RequestKind.TASK

    @extend_schema(operation_id="tasks_list", responses=ApprovalOut(many=True))
    def get(self, request: Request) -> Response:
        return self.list_page()


class ApprovalDetailView(APIView):
    @extend_schema(operation_id="approvals_read", responses={200: ApprovalOut, 404: ErrorOut})
    def get(self, request: Request, approval_id: int) -> Response:
        found = ApprovalRequest.objects.filter(
            pk=approval_id, org_id=request_key(request).org_id
        ).first()
        if found is None:
            return Response(
                {"code": "not_found", "detail": f"No approval {approval_id}."}, status=404
            )
        return Response(ApprovalOut(found).data)


class ApprovalDecideView(APIView):
    @extend_schema(
        operation_id="approvals_decide",
        request=DecideIn,
        responses={200: DecisionOut, 400: ErrorOut, 404: ErrorOut, 409: ErrorOut},
        description="Approve or reject, as the API key. The first decision wins; a later "
        "one is 409 `already_decided`.",
    )
    def post(self, request: Request, approval_id: int) -> Response:
        data = DecideIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        from .slack import update_after

        outcome = decide(
            approval_id,
            decision=fields["decision"],
            actor=_actor(request),
            comment=fields.get("comment", ""),
            digest=fields.get("digest"),
            after_commit=update_after,
        )
        return _answer(outcome)


class TaskSubmitView(APIView):
    @extend_schema(
        operation_id="tasks_submit",
        request=SubmitIn,
        responses={200: DecisionOut, 400: ErrorOut, 404: ErrorOut, 409: ErrorOut},
        description="Answer a task, as the API key: the answer is checked against the "
        "task's form (400 `invalid_answer` with `errors` by field) and becomes the step's "
        "output.",
    )
    def post(self, request: Request, task_id: int) -> Response:
        data = SubmitIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        from .slack import update_after

        outcome = decide(
            task_id,
            decision="submit",
            kind=RequestKind.TASK,
            actor=_actor(request),
            answer=fields["answer"],
            comment=fields.get("comment", ""),
            digest=fields.get("digest"),
            after_commit=update_after,
        )
        return _answer(outcome)
