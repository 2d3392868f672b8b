"""Re-run a finished run from a step: ``POST /api/v1/runs/{id}/rerun``. A preview unless
``dry_run`` is false (the service, services/rerun.py, decides either way)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ..services.rerun import REPEAT, REUSE, RerunOutcome, rerun
from ..states import RunStatus
from .auth import request_actor, request_key
from .serializers import ErrorOut, JsonObjectField, StrictInput


class RerunIn(StrictInput):
    from_step = serializers.CharField(max_length=63, help_text="The step to run again from.")
    iteration = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, help_text="A code run's: which entry "
        "of the step (its iteration) to run again from; left out: its first. Not for a "
        "definition's run.",
    )  # fmt: skip
    input = JsonObjectField(
        required=False, allow_null=True, help_text="The run's new input (a JSON object); "
        "left out or null: unchanged.",
    )  # fmt: skip
    vars = JsonObjectField(
        required=False, allow_null=True, help_text="The run's new vars (a JSON object, all "
        "of them); left out or null: unchanged.",
    )  # fmt: skip
    repeat_effects = serializers.BooleanField(
        default=False, help_text="Make settled effects again, each under its new key, "
        "instead of taking their stored answers.",
    )  # fmt: skip
    dry_run = serializers.BooleanField(
        default=True, help_text="Only say what the re-run would do (the default); false: do it."
    )


class ChangeOut(serializers.Serializer):
    key = serializers.CharField(help_text="A top-level key of the input or the vars.")
    before = serializers.JSONField(required=False, help_text="Left out: the key was absent.")
    after = serializers.JSONField(required=False, help_text="Left out: the key is removed.")


class EffectChoiceOut(serializers.Serializer):
    step_id = serializers.CharField()
    iteration = serializers.IntegerField()
    key = serializers.CharField(help_text="The settled effect's key (run/step/iteration).")
    provider = serializers.CharField()
    action = serializers.ChoiceField(choices=[REUSE, REPEAT], help_text="reuse: the step's "
                                     "new entry takes its answer; repeat: a new call.")  # fmt: skip
    new_key = serializers.CharField(
        allow_null=True, help_text="The key of the step's new entry concerned; null for an "
        "effect made in a code run's ctx.parallel branch, whose new entry's key its branch's "
        "turn decides (see place and entry).",
    )  # fmt: skip
    why = serializers.CharField()
    place = serializers.CharField(help_text='Where the effect was made: its branch path '
                                  '("fan.join:1"), "" at the top level.')  # fmt: skip
    entry = serializers.IntegerField(help_text="Which new entry of the step at that place "
                                     "takes it (1: the first).")  # fmt: skip


class RerunOut(serializers.Serializer):
    id = serializers.IntegerField(source="run_id")
    from_step = serializers.CharField()
    was = serializers.ChoiceField(choices=RunStatus.choices, help_text="The status before.")
    status = serializers.ChoiceField(choices=RunStatus.choices, help_text="The status now.")
    dry_run = serializers.BooleanField()
    iteration = serializers.IntegerField(
        allow_null=True, help_text="A code run's: the iteration of the step it runs again "
        "from; null for a definition's run.",
    )  # fmt: skip
    repeat_effects = serializers.BooleanField()
    input_changes = ChangeOut(many=True)
    vars_changes = ChangeOut(many=True)
    effects = EffectChoiceOut(many=True, help_text="Settled effects of the steps the re-run "
                              "can reach, and what it does with each.")  # fmt: skip


class RunRerunView(APIView):
    @extend_schema(
        operation_id="runs_rerun",
        request=RerunIn,
        responses={
            200: RerunOut,
            400: ErrorOut,
            404: ErrorOut,
            409: ErrorOut,
            413: ErrorOut,
            429: ErrorOut,
        },
        description="Run a finished run (failed, succeeded, cancelled or compensated) again "
        "from a step, optionally with a new input or vars. Settled effects of the steps it "
        "reaches are reused, not made again, unless `repeat_effects`. `dry_run` is true "
        "unless set to false: the answer then says what would change, nothing changes. "
        "Refused: 409 `run_state_conflict` (the run is not finished), 400 `unknown_step`, "
        "`rerun_step_not_top_level`, `rerun_step_is_compensation` or `invalid_input`; a "
        "re-run is a start for the quotas: 429 `quota_exceeded` (with `Retry-After`) when "
        "the organisation is at its running-runs or starts-per-minute quota.",
    )
    def post(self, request: Request, run_id: int) -> Response:
        data = RerunIn(data=request.data)
        data.is_valid(raise_exception=True)
        given: dict[str, Any] = data.validated_data
        outcome: RerunOutcome = rerun(
            org=request_key(request).org, run_id=run_id, actor=request_actor(request),
            from_step=given["from_step"], run_input=given.get("input"),
            variables=given.get("vars"), repeat_effects=given["repeat_effects"],
            dry_run=given["dry_run"], iteration=given.get("iteration"),
        )  # fmt: skip
        return Response(RerunOut(outcome).data)
