"""Migrating runs between versions through the API: a dry run (the default), a job that moves
the runs (at most ``limit`` tried per call: call again with ``resume`` while ``more``), its
status, and the automation's jobs. The services decide (services/run_migration/)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import selectors
from ..errors import InvalidInput
from ..models import RunMigration
from ..services.run_migration import (
    MAX_STEP_ID,
    STAY,
    JobProgress,
    dry_run,
    migration_get,
    migration_plan,
    migration_resume,
    migration_start,
)
from ..states import RunStatus
from .auth import request_actor, request_key
from .serializers import ErrorOut, StrictInput
from .views import CursorPage, ListEndpoint

MAX_LIMIT = 1_000  # runs tried per call: a request's worth of moves (a few ms each)
PLAN_FIELDS = ("from_version", "to_version", "to_automation", "map", "removed", "steps",
               "statuses")  # fmt: skip


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "pattern": rf"^(stay|move_to:[\s\S]{{1,{MAX_STEP_ID}}})$"},
            {
                "type": "object",
                "properties": {
                    "move_to": {"type": "string", "minLength": 1, "maxLength": MAX_STEP_ID}
                },
                "required": ["move_to"],
                "additionalProperties": False,
            },
        ]
    }
)
class RemovedField(serializers.JSONField):
    """What happens to a run parked on a removed step (RemovedRule.parse reads it)."""


class MigrationIn(StrictInput):
    from_version = serializers.IntegerField(min_value=1, required=False,
                                            help_text="The version the runs are on.")  # fmt: skip
    to_version = serializers.IntegerField(min_value=1, required=False,
                                          help_text="The version to move them to.")  # fmt: skip
    to_automation = serializers.SlugField(
        max_length=63, required=False,
        help_text="Whose version `to_version` is: only this automation's is accepted.",
    )  # fmt: skip
    map = serializers.DictField(
        child=serializers.CharField(max_length=63), required=False, default=dict,
        help_text="Old step id -> new step id. A step the new version has too, with the same "
        "type, maps to itself.",
    )  # fmt: skip
    removed = RemovedField(
        required=False, allow_null=True,
        help_text='A run parked on a step with no new id: "stay" (on the old version, '
        'reported) or {"move_to": "<step id>"} (its wait cancelled, that step entered).',
    )  # fmt: skip
    steps = serializers.ListField(
        child=serializers.CharField(max_length=63), required=False, default=list,
        help_text="Only runs at one of these steps (empty: any).",
    )  # fmt: skip
    statuses = serializers.ListField(
        child=serializers.ChoiceField(choices=RunStatus.values), required=False, default=list,
        help_text="Only runs in one of these statuses (default: running and paused).",
    )  # fmt: skip
    dry_run = serializers.BooleanField(
        default=True, help_text="Only say what would move where (the default)."
    )
    limit = serializers.IntegerField(
        min_value=1, max_value=MAX_LIMIT, default=MAX_LIMIT,
        help_text="Runs tried in this call; `more` says when some are left: call again with "
        "`resume`.",
    )  # fmt: skip
    resume = serializers.IntegerField(
        min_value=1, required=False, help_text="Go on with this migration (its own plan)."
    )


class MigrationOut(serializers.ModelSerializer):
    automation = serializers.CharField(source="automation.slug")
    from_version = serializers.IntegerField(source="from_version.number")
    to_version = serializers.IntegerField(source="to_version.number")

    class Meta:
        model = RunMigration
        fields = [
            "id", "automation", "from_version", "to_version", "plan", "status", "moved",
            "planned", "report", "created_by", "created_at", "updated_at", "finished_at",
        ]  # fmt: skip


class MigrationProgressOut(MigrationOut):
    moved_now = serializers.IntegerField(help_text="Runs this call moved.")
    more = serializers.BooleanField(help_text="Stopped at `limit`: call again with `resume`.")

    class Meta(MigrationOut.Meta):
        fields = [*MigrationOut.Meta.fields, "moved_now", "more"]


class DryRunOut(serializers.Serializer):
    dry_run = serializers.BooleanField()
    plan = serializers.JSONField(help_text="The plan as it would apply: the complete mapping.")
    report = serializers.JSONField(
        help_text="matched, would_move, cannot (reason -> runs, sample), steps (per current "
        "step: to, how, cannot, runs, sample)."
    )


MIGRATION_ANSWER = PolymorphicProxySerializer(
    component_name="MigrationAnswer",
    serializers=[DryRunOut, MigrationProgressOut],
    resource_type_field_name=None,
)


def _progress(progress: JobProgress) -> dict[str, Any]:
    job = MigrationOut(progress.job).data
    return {**job, "moved_now": progress.moved_now, "more": progress.more}


class MigrationListView(ListEndpoint):
    model = RunMigration
    serializer_class = MigrationOut
    pagination_class = CursorPage

    def scoped_queryset(self) -> QuerySet[RunMigration]:
        org = request_key(self.request).org
        automation = selectors.automation_get(org=org, slug=self.kwargs["slug"])
        return RunMigration.objects.filter(org=org, automation=automation).select_related(
            "automation", "from_version", "to_version"
        )

    @extend_schema(operation_id="automations_migrations_list", responses=MigrationOut(many=True))
    def get(self, request: Request, slug: str) -> Response:
        return self.list_page()

    @extend_schema(
        operation_id="automations_migrations_create",
        request=MigrationIn,
        responses={
            200: MIGRATION_ANSWER,
            400: ErrorOut,
            403: ErrorOut,
            404: ErrorOut,
            409: ErrorOut,
        },
        description="Move runs of this automation from one version to another. `dry_run` is "
        "true unless set to false: the answer says, per current step, how many runs would "
        "move where and which would not, and why. With `dry_run: false` a migration job moves "
        "the runs one by one (at most `limit` tried in this call); `resume` with its id goes "
        "on with it (a call stopped at its limit, a process that died), never moving a run "
        "twice.",
    )
    def post(self, request: Request, slug: str) -> Response:
        data = MigrationIn(data=request.data)
        data.is_valid(raise_exception=True)
        given = data.validated_data
        org = request_key(request).org
        actor = request_actor(request)
        if "resume" in given:
            asked = sorted(name for name in PLAN_FIELDS if name in request.data)
            if asked:
                raise InvalidInput(reason=f"resume goes on with the migration's own plan: "
                                   f"leave out {', '.join(asked)}")  # fmt: skip
            progress = migration_resume(org=org, automation_slug=slug,
                                        migration_id=given["resume"], actor=actor,
                                        limit=given["limit"])  # fmt: skip
            return Response(_progress(progress))
        missing = [name for name in ("from_version", "to_version") if name not in given]
        if missing:
            raise InvalidInput(reason=f"{' and '.join(missing)} required (or resume)")
        plan = migration_plan(
            org=org, automation_slug=slug, from_version=given["from_version"],
            to_version=given["to_version"], to_automation=given.get("to_automation"),
            mapping=given["map"], removed=given.get("removed", STAY), steps=given["steps"],
            statuses=given["statuses"],
        )  # fmt: skip
        if given["dry_run"]:
            report = dry_run(plan).as_json()
            return Response({"dry_run": True, "plan": plan.describe(), "report": report})
        progress = migration_start(plan=plan, actor=actor, limit=given["limit"])
        return Response(_progress(progress))


class MigrationDetailView(APIView):
    @extend_schema(operation_id="automations_migrations_retrieve", responses=MigrationOut)
    def get(self, request: Request, slug: str, migration_id: int) -> Response:
        job = migration_get(org=request_key(request).org, automation_slug=slug,
                            migration_id=migration_id)  # fmt: skip
        return Response(MigrationOut(job).data)
