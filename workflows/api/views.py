"""Thin views: parse input, call a service or selector scoped to the key's organisation, render."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import selectors
from ..errors import InvalidInput
from ..services import automations as services
from ..services import control
from ..services.runs import run_start
from ..states import RunStatus
from .auth import request_key
from .serializers import (
    AutomationIn,
    AutomationListOut,
    AutomationOut,
    DefinitionIn,
    ErrorOut,
    RunActionOut,
    RunBulkIn,
    RunBulkOut,
    RunDetailOut,
    RunEventOut,
    RunEventPageOut,
    RunFilterIn,
    RunOut,
    RunPageOut,
    RunStartedOut,
    RunStartIn,
    StepOut,
    StepPageOut,
    VersionListOut,
    VersionOut,
    run_links,
)


class AutomationListView(APIView):
    @extend_schema(operation_id="automations_list", responses=AutomationListOut)
    def get(self, request: Request) -> Response:
        items = selectors.automation_list(org=request_key(request).org)
        return Response({"results": AutomationOut(items, many=True).data})

    @extend_schema(request=AutomationIn, responses={201: AutomationOut})
    def post(self, request: Request) -> Response:
        data = AutomationIn(data=request.data)
        data.is_valid(raise_exception=True)
        automation = services.automation_create(org=request_key(request).org, **data.validated_data)
        return Response(AutomationOut(automation).data, status=status.HTTP_201_CREATED)


class AutomationDetailView(APIView):
    @extend_schema(responses=AutomationOut)
    def get(self, request: Request, slug: str) -> Response:
        automation = selectors.automation_get(org=request_key(request).org, slug=slug)
        return Response(AutomationOut(automation).data)


class VersionListView(APIView):
    @extend_schema(operation_id="automations_versions_list", responses=VersionListOut)
    def get(self, request: Request, slug: str) -> Response:
        automation = selectors.automation_get(org=request_key(request).org, slug=slug)
        versions = automation.versions.select_related("automation")
        return Response({"results": VersionOut(versions, many=True).data})

    @extend_schema(request=DefinitionIn, responses={201: VersionOut})
    def post(self, request: Request, slug: str) -> Response:
        automation = selectors.automation_get(org=request_key(request).org, slug=slug)
        data = DefinitionIn(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.version_create_draft(
            automation=automation, definition=data.validated_data["definition"]
        )
        return Response(VersionOut(version).data, status=status.HTTP_201_CREATED)


class VersionDetailView(APIView):
    @extend_schema(responses=VersionOut)
    def get(self, request: Request, slug: str, number: int) -> Response:
        automation = selectors.automation_get(org=request_key(request).org, slug=slug)
        return Response(
            VersionOut(selectors.version_get(automation=automation, number=number)).data
        )

    @extend_schema(request=DefinitionIn, responses=VersionOut)
    def put(self, request: Request, slug: str, number: int) -> Response:
        automation = selectors.automation_get(org=request_key(request).org, slug=slug)
        version = selectors.version_get(automation=automation, number=number)
        data = DefinitionIn(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.version_update_draft(
            version=version, definition=data.validated_data["definition"]
        )
        return Response(VersionOut(version).data)


class VersionPublishView(APIView):
    @extend_schema(request=None, responses=VersionOut)
    def post(self, request: Request, slug: str, number: int) -> Response:
        automation = selectors.automation_get(org=request_key(request).org, slug=slug)
        version = selectors.version_get(automation=automation, number=number)
        return Response(VersionOut(services.version_publish(version=version)).data)


class RunPagination(CursorPagination):
    ordering = "-id"
    page_size = 50
    max_page_size = 200
    page_size_query_param = "limit"

    def decode_cursor(self, request: Request) -> Any:
        # A cursor we did not hand out is bad input, not a 404 and never a 500.
        bad = InvalidInput(reason="cursor is not valid; follow the next/previous links")
        try:
            cursor = super().decode_cursor(request)
        except NotFound as exc:
            raise bad from exc
        if cursor is not None and cursor.position is not None:
            try:
                int(cursor.position)
            except ValueError as exc:
                raise bad from exc
        return cursor


class RunListView(APIView):
    # Starts (POST) count against the organisation's starts-per-minute quota (api/throttles).
    throttle_scope = "run_starts"

    @extend_schema(
        request=RunStartIn,
        responses={
            201: RunStartedOut,
            200: RunStartedOut,
            400: ErrorOut,
            401: ErrorOut,
            404: ErrorOut,
            409: ErrorOut,
            413: ErrorOut,
        },
        description="Start a run. The same start key returns the run it already started "
        "(200); the same key with a different input is refused (409 start_key_conflict). "
        "The answer is the run's id, status and links; GET the run for its detail.",
    )
    def post(self, request: Request) -> Response:
        data = RunStartIn(data=request.data)
        data.is_valid(raise_exception=True)
        started = run_start(
            org=request_key(request).org,
            automation_slug=data.validated_data["automation"],
            run_input=data.validated_data["input"],
            start_key=data.validated_data.get("start_key"),
        )
        answer = {
            "id": started.run_id, "status": started.status, "created": started.created,
            "start_key": started.start_key, "links": run_links(started.run_id),
        }  # fmt: skip
        return Response(
            RunStartedOut(answer).data,
            status=status.HTTP_201_CREATED if started.created else status.HTTP_200_OK,
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=[s.value for s in RunStatus]),
            OpenApiParameter("automation", str),
            OpenApiParameter("limit", int),
        ],
        operation_id="runs_list",
        responses=RunPageOut,
    )
    def get(self, request: Request) -> Response:
        filters = RunFilterIn(data=request.query_params)
        if not filters.is_valid():
            field, messages = next(iter(filters.errors.items()))
            raise InvalidInput(reason=f"{field}: {messages[0]}")
        runs = selectors.run_list(org=request_key(request).org, **filters.validated_data)
        paginator = RunPagination()
        page = paginator.paginate_queryset(runs, request, view=self)
        return paginator.get_paginated_response(RunOut(page, many=True).data)


class RunDetailView(APIView):
    @extend_schema(responses=RunDetailOut)
    def get(self, request: Request, run_id: int) -> Response:
        return Response(
            RunDetailOut(selectors.run_get(org=request_key(request).org, run_id=run_id)).data
        )


class OldestFirstPagination(RunPagination):
    ordering = "id"
    page_size = 100
    max_page_size = 1000


class RunStepListView(APIView):
    @extend_schema(
        operation_id="runs_steps_list",
        parameters=[OpenApiParameter("limit", int)],
        responses=StepPageOut,
    )
    def get(self, request: Request, run_id: int) -> Response:
        steps = selectors.run_steps(org=request_key(request).org, run_id=run_id)
        paginator = OldestFirstPagination()
        page = paginator.paginate_queryset(steps, request, view=self)
        return paginator.get_paginated_response(StepOut(page, many=True).data)


class RunHistoryView(APIView):
    @extend_schema(
        operation_id="runs_history_list",
        parameters=[OpenApiParameter("limit", int)],
        responses=RunEventPageOut,
    )
    def get(self, request: Request, run_id: int) -> Response:
        events = selectors.run_history(org=request_key(request).org, run_id=run_id)
        paginator = OldestFirstPagination()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(RunEventOut(page, many=True).data)


ACTION_PARAMETER = OpenApiParameter(
    "action", str, OpenApiParameter.PATH, enum=list(control.ACTIONS), description="What to do."
)


def _check_action(action: str) -> None:
    if action not in control.ACTIONS:
        raise NotFound(f"No action {action!r}; one of {', '.join(control.ACTIONS)}.")


def _actor(request: Request) -> str:
    return f"api_key:{request_key(request).prefix}"


class RunActionView(APIView):
    @extend_schema(
        operation_id="runs_act",
        parameters=[ACTION_PARAMETER],
        request=None,
        responses={200: RunActionOut, 404: ErrorOut, 409: ErrorOut},
        description="Cancel, pause, resume or retry one run. A status that does not allow "
        "the action is refused with 409 `run_state_conflict` (or `nothing_to_retry`); the "
        "refusal is recorded in the run's history.",
    )
    def post(self, request: Request, run_id: int, action: str) -> Response:
        _check_action(action)
        outcome = control.run_act(
            org=request_key(request).org, run_id=run_id, action=action, actor=_actor(request)
        )
        return Response(
            {"id": outcome.run_id, "action": action, "status": outcome.status,
             "steps_changed": outcome.steps}
        )  # fmt: skip


class RunBulkActionView(APIView):
    @extend_schema(
        operation_id="runs_act_bulk",
        parameters=[ACTION_PARAMETER],
        request=RunBulkIn,
        responses={200: RunBulkOut, 400: ErrorOut},
        description="Apply an action to the runs a filter matches, newest first, at most "
        "1,000 per call. `dry_run` is true unless set to false: count first, then act.",
    )
    def post(self, request: Request, action: str) -> Response:
        _check_action(action)
        data = RunBulkIn(data=request.data)
        data.is_valid(raise_exception=True)
        outcome = control.runs_act_bulk(
            org=request_key(request).org,
            action=action,
            actor=_actor(request),
            **data.validated_data,
        )
        return Response(RunBulkOut(outcome).data)
