"""Thin views: parse input, call a service or selector scoped to the key's organisation, render."""

from __future__ import annotations

import re
from typing import Any

from django.db.models import Model, QuerySet
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.generics import GenericAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import selectors
from ..engine.wait_words import describe_waits
from ..errors import InvalidInput, InvalidQuery
from ..models import Automation, AutomationVersion, Run, RunEvent, Step
from ..services import automations as services
from ..services import control
from ..services.runs import run_start
from .auth import request_actor, request_key
from .filters import RunFilter
from .serializers import (
    ApiRootOut,
    AutomationIn,
    AutomationOut,
    DefinitionIn,
    ErrorOut,
    RunActionOut,
    RunBulkIn,
    RunBulkOut,
    RunDetailOut,
    RunEventOut,
    RunOut,
    RunStartedOut,
    RunStartIn,
    StepOut,
    VersionDetailOut,
    VersionOut,
    run_links,
)

# A limit's digits: any number of them (past max_page_size it is cut; too many for int() to
# read are not read).
_LIMIT = re.compile(r"[0-9]+")
_ID_POSITION = re.compile(r"-?[0-9]{1,19}")
_SLUG_POSITION = re.compile(r"[-a-zA-Z0-9_]{1,63}")


class CursorPage(CursorPagination):
    """Every list: newest first unless said otherwise, ``limit`` a page, ``next``/``previous``
    links. A ``limit`` that is not a positive whole number is refused, not ignored; one above
    ``max_page_size`` is cut to it."""

    ordering: Any = "-id"
    page_size = 50
    max_page_size = 200
    page_size_query_param = "limit"
    # What a cursor's position may be: a value of the ordering field (an id, a number).
    position_pattern = _ID_POSITION

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        digits = raw.lstrip("0")
        if not _LIMIT.fullmatch(raw) or not digits:
            raise InvalidQuery(
                parameter="limit",
                reason=f"limit must be a whole number of at least 1 (above "
                f"{self.max_page_size}: {self.max_page_size}).",
            )
        if len(digits) > len(str(self.max_page_size)):
            return self.max_page_size
        return min(int(digits), self.max_page_size)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """The schema says what get_page_size and decode_cursor take."""
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1}
                parameter["description"] = (
                    f"Results a page (default {self.page_size}); above {self.max_page_size}, "
                    f"{self.max_page_size}."
                )
            elif parameter["name"] == self.cursor_query_param:
                parameter["description"] = (
                    "Where the page starts: the `cursor` of a `next` or `previous` link, as "
                    "given. Any other value is refused (400 `invalid_input`)."
                )
        return parameters

    def decode_cursor(self, request: Request) -> Any:
        # A cursor we did not hand out is bad input, not a 404 and never a 500.
        bad = InvalidInput(reason="cursor is not valid; follow the next/previous links")
        try:
            cursor = super().decode_cursor(request)
        except NotFound as exc:
            raise bad from exc
        position = None if cursor is None else cursor.position
        if position is not None and not self.position_pattern.fullmatch(str(position)):
            raise bad
        return cursor


class OldestFirstPage(CursorPage):
    ordering = "id"
    page_size = 100
    max_page_size = 1000


class AutomationPage(CursorPage):
    ordering = "slug"  # unique in the organisation
    position_pattern = _SLUG_POSITION


class VersionPage(CursorPage):
    ordering = "-number"  # unique in the automation


class ListEndpoint(GenericAPIView[Any]):
    """A GET that lists: ``get_queryset()`` filtered (unknown parameters refused, see
    filters.py) and one cursor page of it, in the envelope ``{next, previous, results}``.
    Other apps' list endpoints use it too; by default it lists the key's organisation's rows
    of ``model``."""

    model: type[Model]

    def list_page(self) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def get_queryset(self) -> QuerySet[Any]:
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular reading the types
            return self.model._default_manager.none()
        return self.scoped_queryset()

    def scoped_queryset(self) -> QuerySet[Any]:
        return self.model._default_manager.filter(org=request_key(self.request).org)


class ApiRootView(APIView):
    """Where everything is. Public, like the schema: it names what every installation has
    and nothing of any organisation, so a client can check it reaches Waymark before it
    holds a key."""

    authentication_classes = []
    permission_classes = []
    LINKS = {"automations": "api:automations", "runs": "api:runs", "schema": "api:schema",
             "docs": "api:docs"}  # fmt: skip

    @extend_schema(operation_id="api_root", responses=ApiRootOut, auth=[])
    def get(self, request: Request) -> Response:
        links = {
            name: request.build_absolute_uri(reverse(route)) for name, route in self.LINKS.items()
        }
        return Response(ApiRootOut(links).data)


class AutomationListView(ListEndpoint):
    model = Automation
    serializer_class = AutomationOut
    pagination_class = AutomationPage

    def scoped_queryset(self) -> QuerySet[Automation]:
        return selectors.automation_list(org=request_key(self.request).org)

    @extend_schema(operation_id="automations_list", responses=AutomationOut(many=True))
    def get(self, request: Request) -> Response:
        return self.list_page()

    @extend_schema(
        request=AutomationIn,
        responses={201: AutomationOut, 409: ErrorOut},
        description="Create an automation (no version yet). A slug already taken in this "
        "organisation is 409 `automation_exists`.",
    )
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


class VersionListView(ListEndpoint):
    model = AutomationVersion
    serializer_class = VersionOut
    pagination_class = VersionPage

    def scoped_queryset(self) -> QuerySet[AutomationVersion]:
        org = request_key(self.request).org
        automation = selectors.automation_get(org=org, slug=self.kwargs["slug"])
        return automation.versions.select_related("automation")

    @extend_schema(operation_id="automations_versions_list", responses=VersionOut(many=True))
    def get(self, request: Request, slug: str) -> Response:
        return self.list_page()

    @extend_schema(request=DefinitionIn, responses={201: VersionDetailOut})
    def post(self, request: Request, slug: str) -> Response:
        automation = selectors.automation_get(org=request_key(request).org, slug=slug)
        data = DefinitionIn(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.version_create_draft(
            automation=automation, definition=data.validated_data["definition"]
        )
        return Response(VersionDetailOut(version).data, status=status.HTTP_201_CREATED)


class VersionDetailView(APIView):
    @extend_schema(responses=VersionDetailOut)
    def get(self, request: Request, slug: str, number: int) -> Response:
        automation = selectors.automation_get(org=request_key(request).org, slug=slug)
        return Response(
            VersionDetailOut(selectors.version_get(automation=automation, number=number)).data
        )

    @extend_schema(request=DefinitionIn, responses=VersionDetailOut)
    def put(self, request: Request, slug: str, number: int) -> Response:
        automation = selectors.automation_get(org=request_key(request).org, slug=slug)
        version = selectors.version_get(automation=automation, number=number)
        data = DefinitionIn(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.version_update_draft(
            version=version, definition=data.validated_data["definition"]
        )
        return Response(VersionDetailOut(version).data)


class VersionPublishView(APIView):
    @extend_schema(
        request=None,
        responses={200: VersionOut, 409: ErrorOut},
        description="Publish a draft: new runs start on it. A version published before is "
        "409 `already_published`.",
    )
    def post(self, request: Request, slug: str, number: int) -> Response:
        automation = selectors.automation_get(org=request_key(request).org, slug=slug)
        version = selectors.version_get(automation=automation, number=number)
        published = services.version_publish(version=version, actor=request_actor(request))
        return Response(VersionOut(published).data)


class RunListView(ListEndpoint):
    model = Run
    serializer_class = RunOut
    pagination_class = CursorPage
    filterset_class = RunFilter

    # Starts (POST) count against the organisation's starts-per-minute quota (api/throttles).
    throttle_scope = "run_starts"

    def scoped_queryset(self) -> QuerySet[Run]:
        return selectors.run_list(org=request_key(self.request).org)

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
        # RunStartedOut's shape, built directly: its values are already what it would render
        # (a serializer here cost 0.3 ms of CPU per start; tests/test_api_runs.py holds the
        # two equal).
        answer = {
            "id": started.run_id, "status": str(started.status), "created": started.created,
            "start_key": started.start_key, "links": run_links(started.run_id),
        }  # fmt: skip
        return Response(
            answer, status=status.HTTP_201_CREATED if started.created else status.HTTP_200_OK
        )

    @extend_schema(
        operation_id="runs_list",
        responses=RunOut(many=True),
        description="Runs, newest first. `start_key` finds the run a start key started "
        "(exact match). An unknown parameter is refused (400 `invalid_query`).",
    )
    def get(self, request: Request) -> Response:
        return self.list_page()


class RunDetailView(APIView):
    @extend_schema(responses=RunDetailOut)
    def get(self, request: Request, run_id: int) -> Response:
        return Response(
            RunDetailOut(selectors.run_get(org=request_key(request).org, run_id=run_id)).data
        )


class RunStepListView(ListEndpoint):
    model = Step
    serializer_class = StepOut
    pagination_class = OldestFirstPage

    def scoped_queryset(self) -> QuerySet[Step]:
        org = request_key(self.request).org
        return selectors.run_steps(org=org, run_id=self.kwargs["run_id"])

    @extend_schema(operation_id="runs_steps_list", responses=StepOut(many=True))
    def get(self, request: Request, run_id: int) -> Response:
        return self.list_page()

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        if args and kwargs.get("many"):  # a page: what its waiting steps wait on, at once
            page = list(args[0])
            kwargs["context"] = {**self.get_serializer_context(), "waits": describe_waits(page)}
            return StepOut(page, **kwargs)
        return super().get_serializer(*args, **kwargs)


class RunHistoryView(ListEndpoint):
    model = RunEvent
    serializer_class = RunEventOut
    pagination_class = OldestFirstPage

    def scoped_queryset(self) -> QuerySet[RunEvent]:
        org = request_key(self.request).org
        return selectors.run_history(org=org, run_id=self.kwargs["run_id"])

    @extend_schema(operation_id="runs_history_list", responses=RunEventOut(many=True))
    def get(self, request: Request, run_id: int) -> Response:
        return self.list_page()


ACTION_PARAMETER = OpenApiParameter(
    "action", str, OpenApiParameter.PATH, enum=list(control.ACTIONS), description="What to do."
)


def _check_action(action: str) -> None:
    if action not in control.ACTIONS:
        raise NotFound(f"No action {action!r}; one of {', '.join(control.ACTIONS)}.")


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
            org=request_key(request).org, run_id=run_id, action=action, actor=request_actor(request)
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
        responses={200: RunBulkOut, 400: ErrorOut, 404: ErrorOut},
        description="Apply an action to the runs a filter matches, newest first, at most "
        "1,000 per call. `dry_run` is true unless set to false: count first, then act. An "
        "`automation` this organisation does not have is 404 `unknown_automation`.",
    )
    def post(self, request: Request, action: str) -> Response:
        _check_action(action)
        data = RunBulkIn(data=request.data)
        data.is_valid(raise_exception=True)
        outcome = control.runs_act_bulk(
            org=request_key(request).org,
            action=action,
            actor=request_actor(request),
            **data.validated_data,
        )
        return Response(RunBulkOut(outcome).data)
