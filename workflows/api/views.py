"""Thin views: parse input, call a service or selector scoped to the key's organisation, render."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import selectors
from ..services import automations as services
from .serializers import AutomationIn, AutomationOut, DefinitionIn, VersionOut


class AutomationListView(APIView):
    @extend_schema(responses=AutomationOut(many=True))
    def get(self, request: Request) -> Response:
        items = selectors.automation_list(org=request.auth.org)
        return Response({"results": AutomationOut(items, many=True).data})

    @extend_schema(request=AutomationIn, responses={201: AutomationOut})
    def post(self, request: Request) -> Response:
        data = AutomationIn(data=request.data)
        data.is_valid(raise_exception=True)
        automation = services.automation_create(org=request.auth.org, **data.validated_data)
        return Response(AutomationOut(automation).data, status=status.HTTP_201_CREATED)


class AutomationDetailView(APIView):
    @extend_schema(responses=AutomationOut)
    def get(self, request: Request, slug: str) -> Response:
        automation = selectors.automation_get(org=request.auth.org, slug=slug)
        return Response(AutomationOut(automation).data)


class VersionListView(APIView):
    @extend_schema(responses=VersionOut(many=True))
    def get(self, request: Request, slug: str) -> Response:
        automation = selectors.automation_get(org=request.auth.org, slug=slug)
        versions = automation.versions.select_related("automation")
        return Response({"results": VersionOut(versions, many=True).data})

    @extend_schema(request=DefinitionIn, responses={201: VersionOut})
    def post(self, request: Request, slug: str) -> Response:
        automation = selectors.automation_get(org=request.auth.org, slug=slug)
        data = DefinitionIn(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.version_create_draft(
            automation=automation, definition=data.validated_data["definition"]
        )
        return Response(VersionOut(version).data, status=status.HTTP_201_CREATED)


class VersionDetailView(APIView):
    @extend_schema(responses=VersionOut)
    def get(self, request: Request, slug: str, number: int) -> Response:
        automation = selectors.automation_get(org=request.auth.org, slug=slug)
        return Response(VersionOut(selectors.version_get(automation=automation, number=number)).data)

    @extend_schema(request=DefinitionIn, responses=VersionOut)
    def put(self, request: Request, slug: str, number: int) -> Response:
        automation = selectors.automation_get(org=request.auth.org, slug=slug)
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
        automation = selectors.automation_get(org=request.auth.org, slug=slug)
        version = selectors.version_get(automation=automation, number=number)
        return Response(VersionOut(services.version_publish(version=version)).data)
