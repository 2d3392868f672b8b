"""Erasing a person through the API: ``POST /api/v1/erasures`` (a dry run on request) and
``GET /api/v1/erasures``, the organisation's tombstones. The service decides
(services/erasure/); docs/reference/api-runs.md, "Erasing a person"."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from ..models import Erasure
from ..services.erasure import erase_person, subject_of
from ..services.erasure.subject import MAX_VALUE_CHARS
from .auth import request_actor, request_key, require_scope
from .serializers import ErrorOut, StrictInput
from .views import CursorPage, ListEndpoint


class ErasureIn(StrictInput):
    email = serializers.CharField(
        required=False, max_length=MAX_VALUE_CHARS, trim_whitespace=False,
        help_text="The person's email address (compared as the mailbox it names).",
    )  # fmt: skip
    phone = serializers.CharField(
        required=False, max_length=MAX_VALUE_CHARS, trim_whitespace=False,
        help_text="The person's phone number (compared by its digits).",
    )  # fmt: skip
    identifier = serializers.CharField(
        required=False, max_length=MAX_VALUE_CHARS, trim_whitespace=False,
        help_text="A value of an identifier the definitions declare "
        "(`personal_data.identifiers`), compared exactly.",
    )  # fmt: skip
    dry_run = serializers.BooleanField(
        default=True,
        help_text="Only say what erasing would change; nothing is kept. The default: send "
        "`false` to erase.",
    )


class ErasureOut(serializers.Serializer):
    id = serializers.IntegerField(allow_null=True, help_text="The tombstone (null: a dry run).")
    dry_run = serializers.BooleanField()
    kind = serializers.CharField(help_text="email, phone or identifier: what named the person.")
    at = serializers.DateTimeField(allow_null=True)
    repeat_of = serializers.IntegerField(
        allow_null=True, help_text="An earlier erasure of the same person, if any."
    )
    runs_cancelled = serializers.ListField(child=serializers.IntegerField())
    runs_finishing = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Live runs left to finish without the data (`on_erasure: finish`).",
    )
    runs_scrubbed = serializers.ListField(child=serializers.IntegerField())
    values_removed = serializers.IntegerField(
        help_text="Distinct values removed: the one given, and the identifiers and fields the "
        "definitions of the person's runs declare."
    )
    rows_changed = serializers.IntegerField()
    counts = serializers.DictField(
        child=serializers.IntegerField(), help_text='Rows changed per "table.column".'
    )


class TombstoneOut(serializers.ModelSerializer[Erasure]):
    kind = serializers.CharField(source="subject_kind")
    actor = serializers.SerializerMethodField()
    rows_changed = serializers.IntegerField()
    repeat_of = serializers.IntegerField(source="repeat_of_id", allow_null=True)

    class Meta:
        model = Erasure
        fields = ["id", "at", "actor", "kind", "repeat_of", "runs_cancelled", "runs_finishing",
                  "runs_scrubbed", "values_removed", "rows_changed", "counts"]  # fmt: skip

    def get_actor(self, erasure: Erasure) -> dict[str, str]:
        return {"kind": erasure.actor_kind, "id": erasure.actor_id,
                "display": erasure.actor_display}  # fmt: skip


class ErasureListView(ListEndpoint):
    model = Erasure
    serializer_class = TombstoneOut
    pagination_class = CursorPage

    def scoped_queryset(self) -> QuerySet[Erasure]:
        return Erasure.objects.filter(org=request_key(self.request).org)

    @extend_schema(
        operation_id="erasures_list",
        responses=TombstoneOut(many=True),
        description="The organisation's erasures, newest first: who, when, by what kind of "
        "identifier, which runs, how many rows per table and column. Never the value.",
    )
    def get(self, request: Request) -> Response:
        return self.list_page()

    @extend_schema(
        operation_id="erasures_create",
        request=ErasureIn,
        responses={
            200: ErasureOut,
            201: ErasureOut,
            400: ErrorOut,
            403: ErrorOut,
            404: ErrorOut,
            409: ErrorOut,
        },
        description="Erase a person named by exactly one of `email`, `phone`, `identifier`: "
        "their live runs are cancelled (or finish without their data, where the definition "
        "says `on_erasure: finish`), and their values are removed from every stored row; a "
        "tombstone stays. One transaction: all of it or nothing. A dry run unless "
        "`dry_run: false`: it answers what would change (200) and keeps nothing. The key "
        "needs the `erasure` scope (403 `scope_required`), dry runs included. Nothing "
        "references the person: 404 `unknown_person`; a malformed value: 400 "
        "`invalid_person`; an identifier shorter than 4 characters: 400 "
        "`identifier_too_short`; an identifier where no definition declares "
        "`personal_data.identifiers`: 400 `identifier_not_declared`; rows held by other work "
        "too long: 409 `erasure_busy`.",
    )
    def post(self, request: Request) -> Response:
        require_scope(request, "erasure")
        data = ErasureIn(data=request.data)
        data.is_valid(raise_exception=True)
        given: dict[str, Any] = dict(data.validated_data)
        dry_run = given.pop("dry_run")
        outcome = erase_person(org=request_key(request).org, subject=subject_of(**given),
                               actor=request_actor(request), dry_run=dry_run)  # fmt: skip
        return Response(outcome.as_json(), status=200 if dry_run else 201)
