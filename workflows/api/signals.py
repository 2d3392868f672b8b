"""Signals through the API: send one (optionally starting its run), list the ones still
waiting for a step (with their age), and deliver replies to emails a run sent."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ..engine.signals import taker_run_id
from ..models import Signal
from ..services.signals import SIGNAL_NAME_RE, SignalSent, inbound_email, signal_send
from .auth import request_key
from .filters import SignalFilter
from .serializers import (
    ErrorOut,
    JsonObjectField,
    StartKeyField,
    StrictInput,
    TypedInput,
    run_links,
)
from .views import CursorPage, ListEndpoint


class SignalStartIn(StrictInput):
    automation = serializers.SlugField(max_length=63)
    start_key = StartKeyField()
    input = JsonObjectField(required=False, default=dict)


class SignalIn(StrictInput):
    name = serializers.RegexField(
        f"^{SIGNAL_NAME_RE.pattern}$", max_length=100,
        error_messages={"invalid": "a signal name starts with a letter, then letters, digits, "
                        "_ . : or - (at most 100 characters)"},
    )  # fmt: skip
    correlation = serializers.CharField(max_length=500, required=False, default="",
                                        allow_blank=True, trim_whitespace=False)  # fmt: skip
    id = serializers.CharField(max_length=200, required=False, trim_whitespace=False,
                               help_text="Your id for this signal: sent twice, applied once. "
                               "Without one, the same name, correlation and payload are one "
                               "signal.")  # fmt: skip
    payload = serializers.JSONField(required=False, default=None, allow_null=True)
    start = SignalStartIn(required=False, help_text="Signal-with-start: deliver to the run of "
                          "this start key, starting it first if it does not exist.")  # fmt: skip


RUN_REACHED = ("The run the signal reached: the run of the step that took it, or, with "
               "`start`, the run of the start key (while pending too); null while no step "
               "has taken it.")  # fmt: skip


class SignalSentOut(serializers.Serializer):
    id = serializers.IntegerField()
    duplicate = serializers.BooleanField()
    status = serializers.ChoiceField(choices=["consumed", "pending"])
    consumed_by = serializers.CharField(help_text='"run/step/iteration", or "" while pending')
    run = serializers.IntegerField(allow_null=True, help_text=RUN_REACHED)
    run_created = serializers.BooleanField(
        required=False, help_text="With `start`: whether this signal started its run."
    )
    links = serializers.DictField(required=False, help_text="The run's, when there is one.")


class RunReachedField(serializers.IntegerField):
    """A stored signal's run: the one it was sent to (signal-with-start), else the one whose
    step took it (its ``consumed_by``), else none."""

    def get_attribute(self, instance: Signal) -> int | None:
        if instance.run_id is not None:
            return instance.run_id
        return taker_run_id(instance.consumed_by)


class SignalOut(serializers.ModelSerializer):
    status = serializers.SerializerMethodField()
    run = RunReachedField(allow_null=True, read_only=True, help_text=RUN_REACHED)

    class Meta:
        model = Signal
        fields = ["id", "name", "correlation", "run", "identity", "source", "status",
                  "consumed_by", "received_at", "consumed_at", "dropped_at"]  # fmt: skip

    def get_status(self, signal: Signal) -> str:
        if signal.dropped_at is not None:
            return "dropped"
        return "consumed" if signal.consumed_at is not None else "pending"


# Not strict: it takes what mail providers post, which carries fields it has no use for.
class InboundEmailIn(TypedInput):
    message_id = serializers.CharField(max_length=200, required=False, default="",
                                       allow_blank=True)  # fmt: skip
    in_reply_to = serializers.CharField(max_length=500, required=False, default="",
                                        allow_blank=True)  # fmt: skip
    references = serializers.ListField(child=serializers.CharField(max_length=500),
                                       required=False, default=list, max_length=100)  # fmt: skip
    sender = serializers.CharField(max_length=320, required=False, default="", allow_blank=True)
    subject = serializers.CharField(max_length=1000, required=False, default="", allow_blank=True)
    text = serializers.CharField(max_length=100_000, required=False, default="", allow_blank=True)


def _sent(sent: SignalSent) -> dict[str, Any]:
    delivered = sent.delivered
    answer: dict[str, Any] = {
        "id": delivered.signal_id, "duplicate": delivered.duplicate,
        "status": "consumed" if delivered.consumed_by else "pending",
        "consumed_by": delivered.consumed_by,
    }  # fmt: skip
    run_id = sent.run_id if sent.run_id is not None else delivered.taker_run_id
    answer["run"] = run_id
    if run_id is not None:
        answer["links"] = run_links(run_id)
    if sent.run_id is not None:
        answer["run_created"] = sent.run_created
    return answer


class SignalListView(ListEndpoint):
    model = Signal
    serializer_class = SignalOut
    pagination_class = CursorPage

    filterset_class = SignalFilter

    def scoped_queryset(self) -> QuerySet[Signal]:
        return Signal.objects.filter(org=request_key(self.request).org).order_by("-id")

    @extend_schema(
        operation_id="signals_list", responses=SignalOut(many=True),
        description="Signals, newest first; `?status=pending` for those no step has taken "
        "yet (unmatched ones are dropped after WAYMARK_SIGNAL_RETENTION_DAYS).",
    )  # fmt: skip
    def get(self, request: Request) -> Response:
        return self.list_page()

    @extend_schema(
        operation_id="signals_send", request=SignalIn,
        responses={201: SignalSentOut, 200: SignalSentOut, 400: ErrorOut, 404: ErrorOut,
                   409: ErrorOut, 413: ErrorOut},
        description="Send a signal to the step waiting for it (by `name` and `correlation`), "
        "or keep it until one waits. The same `id` again is the same signal (200, "
        '`"duplicate": true`). With `start`, it goes to the run of that start key, started '
        "first when needed; an `id` another signal (another name or correlation) holds is "
        "then 409 `signal_id_conflict`, and nothing is started.",
    )  # fmt: skip
    def post(self, request: Request) -> Response:
        data = SignalIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        sent = signal_send(
            org=request_key(request).org, name=fields["name"],
            correlation=fields["correlation"], payload=fields["payload"],
            identity=fields.get("id"), start=fields.get("start"),
        )  # fmt: skip
        code = status.HTTP_200_OK if sent.delivered.duplicate else status.HTTP_201_CREATED
        return Response(SignalSentOut(_sent(sent)).data, status=code)


class InboundEmailView(APIView):
    @extend_schema(
        operation_id="inbound_email", request=InboundEmailIn,
        responses={201: SignalSentOut, 200: SignalSentOut, 400: ErrorOut},
        description="A reply to an email a run sent (from your mail provider's inbound "
        "webhook, parsed): delivered as the signal `email.reply`, correlated by its "
        "In-Reply-To, else its References, to the Message-ID the email step stored.",
    )  # fmt: skip
    def post(self, request: Request) -> Response:
        data = InboundEmailIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        payload = {"from": fields["sender"], "subject": fields["subject"],
                   "text": fields["text"], "message_id": fields["message_id"]}  # fmt: skip
        sent = inbound_email(
            org=request_key(request).org, message_id=fields["message_id"],
            in_reply_to=fields["in_reply_to"], references=fields["references"],
            payload=payload,
        )  # fmt: skip
        code = status.HTTP_200_OK if sent.delivered.duplicate else status.HTTP_201_CREATED
        return Response(SignalSentOut(_sent(sent)).data, status=code)
