"""The effects API: connections, suppressions, the egress allowlist and the effect ledger,
scoped to the key's organisation (``/api/v1/connections``, ``/suppressions``,
``/egress-allowlist``, ``/effects``; routes in ``effects/urls.py``).

It follows the workflows API (``workflows/api/``): every query is filtered by the API key's
organisation, so another organisation's object is a 404 like a missing one; read-only keys
read and get 403 ``read_only_key`` on writes (the default permission class); every error is
JSON with a stable code; lists are cursor-paginated with strict filters.

A connection's secret is write-only: it is encrypted on the way in (``effects/secrets.py``)
and no answer ever carries it, or its ciphertext; ``has_secret`` says whether one is set.
"""

from __future__ import annotations

import math
import re
from typing import Any

import django_filters
from django import forms
from django.core.validators import RegexValidator
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from workflows.errors import AlreadyExists, NotFound, WaymarkError
from workflows.models import Organisation
from workflows.plugins.api import (
    CursorPage,
    ErrorOut,
    JsonObjectField,
    ListEndpoint,
    StrictInput,
    request_actor,
    request_key,
)
from workflows.plugins.audit import Actor, record_audit
from workflows.plugins.definitions import UNSTORABLE_REASON, has_unstorable, unstorable_path

from .allowlist import allow_add, allow_delete, allow_get
from .checks import check_connection
from .consent import address_refused, stored_address
from .destinations import BASE_URL_PATTERN, BASE_URL_RULE, moves_secret, where_it_goes
from .egress import in_force, tenant_ceiling
from .limits import limit_problem, operator_limit
from .models import Connection, Effect, EgressAllow, Suppression
from .resolve import ACTIONS, DONE, ResolveError, repair_connection, resolve_effect
from .secrets import encrypt, secret_problem
from .states import CircuitState, ConnectionStatus, EffectState

# The names a step's ``connection`` field may take (effects/steptypes.py checks the same).
CONNECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
NAME_RULE = "Must start with a letter or digit and hold only letters, digits, _ . and -."
MAX_JSON_DEPTH = 32
MAX_SECRET_CHARS = 8_192
MAX_REASON_CHARS = 500


# --- errors -----------------------------------------------------------------------------------


NO_CONTROLS = "The secret must not contain line breaks or other control characters."


def _usable_secret(value: str) -> None:
    problem = secret_problem(value)
    if problem is not None:
        raise serializers.ValidationError(f"The secret {problem}.")


class UnknownConnection(NotFound):
    code = "unknown_connection"
    default_detail = 'No connection "{name}" in this organisation.'


class UnknownSuppression(NotFound):
    code = "unknown_suppression"
    default_detail = "No suppression {suppression_id} in this organisation."


class UnknownEffect(NotFound):
    code = "unknown_effect"
    default_detail = "No effect {effect_id} in this organisation."


class SecretRequired(WaymarkError):
    """Settings that would send the connection's stored secret somewhere else, without the
    secret given again (destinations.moves_secret): a conflict with what the connection
    holds (the same change with the secret, or on a connection without one, is taken)."""

    code = "secret_required"
    status = 409
    default_detail = (
        "This change sends the connection's secret to {where}: give the secret again in "
        "the same request (`secret`), or keep where it goes."
    )


class ResolveRefused(WaymarkError):
    """A ``ResolveError`` from ``effects.resolve``, with its own code: 409 when the effect is
    not (or no longer) in review, 400 for a request it cannot take, 404 when it is gone."""

    STATUS = {"invalid_action": 400, "not_found": 404}

    def __init__(self, error: ResolveError) -> None:
        super().__init__(str(error))
        self.code = error.code
        self.status = self.STATUS.get(error.code, 409)


# --- shared validation ------------------------------------------------------------------------


def json_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored in a JSON column, or None: too deep, NaN or Infinity
    (which Python's json reads but PostgreSQL refuses), NUL characters or lone surrogates."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, float) and not math.isfinite(item):
            return "holds NaN or Infinity, which JSON cannot carry"
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
    if deepest > MAX_JSON_DEPTH:
        return f"nests deeper than {MAX_JSON_DEPTH} levels"
    where = unstorable_path(value)
    if where is not None:
        return f"{where} {UNSTORABLE_REASON}" if where != "(the value)" else UNSTORABLE_REASON
    return None


def storable_text(value: str) -> None:
    """A field validator: text PostgreSQL can store (DRF already refuses NUL characters)."""
    if has_unstorable(value):
        raise serializers.ValidationError(UNSTORABLE_REASON)


def provider_names() -> list[str]:
    from .perform import PROVIDERS  # registered at start-up; read at each request

    return sorted(PROVIDERS)


# --- enums: each a named schema component of its own -------------------------------------------
# Inline enums are named by drf-spectacular after the property (``status``, ``action``), and
# would collide with the workflows API's (renaming its ``ActionEnum``); these never do.


def _enum(name: str, values: list[str]) -> Any:
    return extend_schema_field({"type": "string", "enum": values}, component_name=name)


@_enum("ConnectionStatusEnum", ConnectionStatus.values)
class ConnectionStatusField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=ConnectionStatus.choices, **kwargs)


@_enum("CircuitStateEnum", CircuitState.values)
class CircuitStateField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=CircuitState.choices, **kwargs)


@_enum("EffectStateEnum", EffectState.values)
class EffectStateField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=EffectState.choices, **kwargs)


@_enum("SuppressionChannelEnum", [value for value, _ in Suppression.CHANNELS])
class ChannelField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        message: dict[str, Any] = {"invalid_choice": "Must be one of email, slack, any."}
        super().__init__(choices=Suppression.CHANNELS, error_messages=message, **kwargs)


@_enum("ResolveActionEnum", list(ACTIONS))
class ResolveActionField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        message: dict[str, Any] = {"invalid_choice": f"Must be one of {', '.join(ACTIONS)}."}
        super().__init__(choices=[(a, a) for a in ACTIONS], error_messages=message, **kwargs)


# --- connections ------------------------------------------------------------------------------


class ConnectionOut(serializers.ModelSerializer[Connection]):
    """A connection as every answer shows it: never its secret, nor the secret encrypted."""

    has_secret = serializers.SerializerMethodField(help_text="A secret is set (never shown).")
    status = ConnectionStatusField(
        help_text="`broken`: an authorisation failure; steps that reach it park until it is "
        "repaired (a new secret, a check that passes, or `repair`).",
    )
    circuit = CircuitStateField()

    class Meta:
        model = Connection
        fields = [
            "name", "provider", "base_url", "options", "has_secret", "status", "broken_reason",
            "broken_at", "checked_at", "circuit", "circuit_until", "consecutive_failures",
            "max_concurrency", "timeout_seconds", "created_at", "updated_at",
        ]  # fmt: skip

    def get_has_secret(self, conn: Connection) -> bool:
        return bool(conn.secret_encrypted)


class ConnectionSettingsIn(StrictInput):
    """What may change on a connection (PATCH): every field optional."""

    base_url = serializers.RegexField(
        BASE_URL_PATTERN, max_length=500, allow_blank=True, required=False,
        validators=[storable_text], error_messages={"invalid": f"must be {BASE_URL_RULE}"},
    )  # fmt: skip
    options = JsonObjectField(
        required=False, help_text="Provider options that are not secret: a JSON object."
    )
    secret = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=False,
        trim_whitespace=False,
        max_length=MAX_SECRET_CHARS,
        # The pattern says what _usable_secret checks, in the schema (a final line break too).
        validators=[
            storable_text,
            RegexValidator(r"^[^\x00-\x1f\x7f]*$", NO_CONTROLS),
            _usable_secret,
        ],
        help_text="Write-only: a token, password or API key, stored encrypted and never "
        "returned. Setting one on a broken connection repairs it.",
    )
    max_concurrency = serializers.IntegerField(
        min_value=1, max_value=10_000, required=False,
        help_text="At most this many calls in flight at once, for all the organisation's runs.",
    )  # fmt: skip
    timeout_seconds = serializers.FloatField(min_value=0.1, max_value=3600, required=False)

    def get_fields(self) -> dict[str, serializers.Field]:
        """The operator's limits (effects/limits.py) as the fields' bounds, read at each
        request, so the schema says them too."""
        fields = super().get_fields()
        for name, field in fields.items():
            if name in ("timeout_seconds", "max_concurrency"):
                limit: float = operator_limit(name)
                if isinstance(field, serializers.IntegerField):
                    limit = int(limit)
                field.max_value = min(field.max_value, limit)  # type: ignore[attr-defined]
        return fields

    def validate_options(self, value: Any) -> Any:
        if not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        problem = json_problem(value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value

    def validate_timeout_seconds(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("Must be a finite number of seconds.")
        problem = limit_problem("timeout_seconds", value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value

    def validate_max_concurrency(self, value: int) -> int:
        problem = limit_problem("max_concurrency", value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value


class ConnectionPatchIn(ConnectionSettingsIn):
    def unknown_message(self, name: str) -> str:
        if name in ("name", "provider"):
            return "Cannot be changed: create a new connection (steps name it)."
        return super().unknown_message(name)


class ConnectionIn(ConnectionSettingsIn):
    name = serializers.CharField(
        max_length=100,
        trim_whitespace=False,
        # The pattern for the schema; validate_name holds the whole text to it.
        validators=[RegexValidator(f"^{CONNECTION_NAME.pattern}$", NAME_RULE)],
        help_text="How steps name it (`connection`): letters, digits, `_`, `.`, `-`.",
    )
    provider = serializers.ChoiceField(choices=[], help_text="One of the installed providers "
                                       "(`http`, `email`, `crm_upsert`, …).")  # fmt: skip

    def get_fields(self) -> dict[str, serializers.Field]:
        """The providers as installed now (registered at start-up), for the schema too."""
        fields = super().get_fields()
        names = provider_names()
        message = "Unknown provider {input!r}; one of: " + ", ".join(names) + "."
        provider = fields["provider"]
        provider.choices = names  # type: ignore[attr-defined]
        provider.error_messages = {**provider.error_messages, "invalid_choice": message}
        return fields

    def validate_name(self, value: str) -> str:
        if not CONNECTION_NAME.fullmatch(value):
            raise serializers.ValidationError(NAME_RULE)
        return value


class ConnectionCheckOut(serializers.Serializer):
    name = serializers.CharField()
    result = serializers.CharField(
        help_text='"ok" (and repaired if it was broken), "broken" (marked so, with the '
        'reason), or "failed: …" (the check could not tell; the connection is left as it was).'
    )
    # Plain text here: the status enum is named once, on ConnectionOut (schema enum names).
    status = serializers.CharField(help_text="`ok` or `broken`, after the check.")
    broken_reason = serializers.CharField()
    checked_at = serializers.DateTimeField(allow_null=True)


class ConnectionRepairOut(serializers.Serializer):
    name = serializers.CharField()
    status = serializers.CharField(help_text="`ok`.")
    woken = serializers.IntegerField(help_text="Steps parked on the connection that woke.")


class ConnectionPage(CursorPage):
    ordering = "name"  # unique in the organisation
    position_pattern = CONNECTION_NAME


class ConnectionFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(
        choices=ConnectionStatus.choices,
        error_messages={"invalid_choice": f"must be one of {', '.join(ConnectionStatus.values)}"},
        help_text="Only connections in this status (`broken`: waiting for a repair).",
    )

    class Meta:
        model = Connection
        fields = ["status"]


def _org(request: Request) -> Organisation:
    return request_key(request).org  # the key's organisation: every query is scoped by it


def audit_connection(conn: Connection, actor: Actor, action: str, **detail: Any) -> None:
    """Record a change of a connection, in the caller's transaction. Never its secret: which
    fields changed, and whether a secret was set (``secret_set``, ``secret_replaced``)."""
    record_audit(org=conn.org_id, actor=actor, action=action, target_type="connection",
                 target_id=conn.name, detail={"provider": conn.provider, **detail})  # fmt: skip


def connection_get(org: Organisation, name: str) -> Connection:
    # A name the database cannot hold (a NUL from the path) names none: asking would fail.
    conn = None if has_unstorable(name) else Connection.objects.filter(org=org, name=name).first()
    if conn is None:
        raise UnknownConnection(name=name)
    return conn


class ScopedList(ListEndpoint):
    """The organisation's rows of ``model``, filtered strictly, one cursor page at a time."""

    model: type[Connection | Suppression | EgressAllow | Effect]


class ConnectionListView(ScopedList):
    model = Connection
    serializer_class = ConnectionOut
    pagination_class = ConnectionPage
    filterset_class = ConnectionFilter

    @extend_schema(
        operation_id="connections_list",
        responses=ConnectionOut(many=True),
        description="The organisation's connections, by name. Never their secrets.",
    )
    def get(self, request: Request) -> Response:
        return self.list_page()

    @extend_schema(
        operation_id="connections_create",
        request=ConnectionIn,
        responses={201: ConnectionOut, 400: ErrorOut, 409: ErrorOut},
        description="Create a connection. `secret` is write-only: the answer says "
        "`has_secret`. A name already taken is 409 `already_exists`; an unknown provider "
        "is 400 `invalid_input`.",
    )
    def post(self, request: Request) -> Response:
        data = ConnectionIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        secret = fields.pop("secret", "")
        conn = Connection(
            org=_org(request), secret_encrypted=encrypt(secret), **fields
        )  # version 1
        try:
            with transaction.atomic():
                conn.save()
                audit_connection(conn, request_actor(request), "connection.create",
                                 fields=sorted(fields), secret_set=bool(secret))  # fmt: skip
        except IntegrityError as exc:
            raise AlreadyExists(what=f'A connection "{conn.name}"', name=conn.name) from exc
        return Response(ConnectionOut(conn).data, status=status.HTTP_201_CREATED)


class ConnectionDetailView(APIView):
    @extend_schema(operation_id="connections_read", responses={200: ConnectionOut, 404: ErrorOut})
    def get(self, request: Request, name: str) -> Response:
        return Response(ConnectionOut(connection_get(_org(request), name)).data)

    @extend_schema(
        operation_id="connections_update",
        request=ConnectionPatchIn,
        responses={200: ConnectionOut, 400: ErrorOut, 404: ErrorOut, 409: ErrorOut},
        description="Change a connection's settings; `name` and `provider` are fixed. A new "
        "`secret` replaces the old one (write-only) and, on a broken connection, repairs it: "
        "the steps parked on it wake. A change that would send the stored secret elsewhere "
        "(`base_url` on another origin; for email another SMTP host or port, or TLS turned "
        "off) needs the secret in the same request: 409 `secret_required` otherwise.",
    )
    def patch(self, request: Request, name: str) -> Response:
        conn = connection_get(_org(request), name)
        data = ConnectionPatchIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        new_secret = fields.pop("secret", None)
        base_url = fields.get("base_url", conn.base_url)
        if new_secret is None and moves_secret(conn, base_url, fields.get("options", conn.options)):
            raise SecretRequired(where=where_it_goes(conn.provider))
        for field, value in fields.items():
            setattr(conn, field, value)
        changed = list(fields)
        if new_secret is not None:
            changed += conn.replace_secret(new_secret)
        if changed:
            with transaction.atomic():
                conn.save(update_fields=[*changed, "updated_at"])
                audit_connection(conn, request_actor(request), "connection.update",
                                 fields=sorted(fields),
                                 secret_replaced=new_secret is not None)  # fmt: skip
        if new_secret is not None and conn.status == ConnectionStatus.BROKEN:
            repair_connection(conn, by=request_actor(request))
            conn.refresh_from_db()
        return Response(ConnectionOut(conn).data)

    @extend_schema(
        operation_id="connections_delete",
        responses={204: None, 404: ErrorOut},
        description="Delete a connection; its secret goes with it. Steps that name it fail "
        "with `unknown_connection` until one with that name exists again.",
    )
    def delete(self, request: Request, name: str) -> Response:
        conn = connection_get(_org(request), name)
        with transaction.atomic():
            audit_connection(conn, request_actor(request), "connection.delete")
            conn.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class ConnectionCheckView(APIView):
    @extend_schema(
        operation_id="connections_check",
        request=None,
        responses={200: ConnectionCheckOut, 404: ErrorOut, 409: ErrorOut, 429: ErrorOut},
        description="Check the connection's credentials at its provider now, without acting. "
        "A check that passes repairs a broken connection; an authorisation failure marks it "
        "broken. It answers within the operator's bound (`WAYMARK_CONNECTION_CHECK_SECONDS`, "
        "5 s by default), whatever the connection's timeout: past it, `result` is "
        '`"failed: no answer within …"`. The connection being checked already is 409 '
        "`check_in_progress`; the organisation's checks in flight at their cap "
        "(`WAYMARK_CONNECTION_CHECKS_PER_ORG`, 2 by default) is 429 `checks_busy`.",
    )
    def post(self, request: Request, name: str) -> Response:
        conn = connection_get(_org(request), name)
        result = check_connection(conn, by=request_actor(request))
        conn.refresh_from_db()
        answer = {"name": conn.name, "result": result, "status": conn.status,
                  "broken_reason": conn.broken_reason, "checked_at": conn.checked_at}  # fmt: skip
        return Response(ConnectionCheckOut(answer).data)


class ConnectionRepairView(APIView):
    @extend_schema(
        operation_id="connections_repair",
        request=None,
        responses={200: ConnectionRepairOut, 404: ErrorOut},
        description="Mark the connection working again (its circuit closed) and wake the "
        "steps parked on it; they run again from the same step.",
    )
    def post(self, request: Request, name: str) -> Response:
        conn = connection_get(_org(request), name)
        woken = repair_connection(conn, by=request_actor(request))
        conn.refresh_from_db()
        answer = {"name": conn.name, "status": conn.status, "woken": woken}
        return Response(ConnectionRepairOut(answer).data)


# --- suppressions -----------------------------------------------------------------------------


class SuppressionOut(serializers.ModelSerializer[Suppression]):
    channel = ChannelField()

    class Meta:
        model = Suppression
        fields = ["id", "channel", "address", "reason", "created_at"]


class SuppressionIn(StrictInput):
    channel = ChannelField(default="any")
    address = serializers.CharField(
        max_length=320, validators=[storable_text],
        help_text="On channel `email`, one email address; on `any`, one email address or "
        "a Slack channel (text without an @); on `slack`, a Slack channel. Stored as the "
        "mailbox it names, lowercased (Name <A@B.example> is a@b.example); a Slack channel "
        "lowercased, without surrounding spaces.",
    )  # fmt: skip
    reason = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default="", validators=[storable_text]
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refused = address_refused(attrs["channel"], attrs["address"])
        if refused is not None:
            raise serializers.ValidationError({"address": [refused]})
        return {**attrs, "address": stored_address(attrs["address"])}


class SuppressionFilter(django_filters.FilterSet):
    channel = django_filters.ChoiceFilter(
        choices=Suppression.CHANNELS,
        error_messages={"invalid_choice": "must be one of email, slack, any"},
        help_text="Only suppressions of this channel.",
    )
    address = django_filters.CharFilter(
        method="by_address", max_length=320, help_text="This address (any case)."
    )

    class Meta:
        model = Suppression
        fields = ["channel", "address"]

    def by_address(
        self, queryset: QuerySet[Suppression], name: str, value: str
    ) -> QuerySet[Suppression]:
        return queryset.filter(address=stored_address(value))


def suppression_get(org: Organisation, suppression_id: int) -> Suppression:
    found = Suppression.objects.filter(org=org, pk=suppression_id).first()
    if found is None:
        raise UnknownSuppression(suppression_id=suppression_id)
    return found


class SuppressionListView(ScopedList):
    model = Suppression
    serializer_class = SuppressionOut
    pagination_class = CursorPage
    filterset_class = SuppressionFilter

    @extend_schema(
        operation_id="suppressions_list",
        responses=SuppressionOut(many=True),
        description="Addresses that must not be contacted, newest first.",
    )
    def get(self, request: Request) -> Response:
        return self.list_page()

    @extend_schema(
        operation_id="suppressions_create",
        request=SuppressionIn,
        responses={201: SuppressionOut, 400: ErrorOut, 409: ErrorOut},
        description="Suppress an address (lowercased) on a channel (`any` by default). It is "
        "checked when a step would contact it, not when a run starts. An address that is not "
        "one email address where the channel needs one (on `email`; on `any`, text with an "
        "@) is 400 `invalid_input`, with `errors` naming `address`. The same channel and "
        "address again is 409 `already_exists`, with the `id` of the suppression that holds "
        "it (nothing changes).",
    )
    def post(self, request: Request) -> Response:
        data = SuppressionIn(data=request.data)
        data.is_valid(raise_exception=True)
        org = _org(request)
        suppression = Suppression(org=org, **data.validated_data)
        try:
            with transaction.atomic():
                suppression.save()
        except IntegrityError as exc:
            held = Suppression.objects.filter(
                org=org, channel=suppression.channel, address=suppression.address
            ).first()
            raise AlreadyExists(
                what=f"A suppression of {suppression.address} on {suppression.channel}",
                id=held.pk if held else None,
            ) from exc
        return Response(SuppressionOut(suppression).data, status=status.HTTP_201_CREATED)


class SuppressionDetailView(APIView):
    @extend_schema(operation_id="suppressions_read", responses={200: SuppressionOut, 404: ErrorOut})
    def get(self, request: Request, suppression_id: int) -> Response:
        return Response(SuppressionOut(suppression_get(_org(request), suppression_id)).data)

    @extend_schema(
        operation_id="suppressions_delete",
        responses={204: None, 404: ErrorOut},
        description="Allow the address again.",
    )
    def delete(self, request: Request, suppression_id: int) -> Response:
        suppression_get(_org(request), suppression_id).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- the egress allowlist ------------------------------------------------------------------------


class EgressAllowOut(serializers.ModelSerializer[EgressAllow]):
    in_force = serializers.SerializerMethodField(
        help_text="Whether it opens anything now: false for an entry saved before the "
        "operator's ceiling (`WAYMARK_EGRESS_ALLOWABLE`) was lowered below it (kept, unused)."
    )

    class Meta:
        model = EgressAllow
        fields = ["id", "entry", "note", "in_force", "created_at"]

    def get_in_force(self, row: EgressAllow) -> bool:
        ceiling = self.context.get("ceiling")
        return in_force(row.entry, ceiling if ceiling is not None else tenant_ceiling())


class EgressAllowIn(StrictInput):
    entry = serializers.CharField(
        max_length=255, validators=[storable_text],
        help_text="A host name (`db.corp.example`), `.suffix` (every subdomain), an address or "
        "a CIDR network; stored lowercased, an address as its network (`10.0.0.5/32`).",
    )  # fmt: skip
    note = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default="", validators=[storable_text]
    )


class EgressAllowListView(ScopedList):
    model = EgressAllow
    serializer_class = EgressAllowOut
    pagination_class = CursorPage

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "ceiling": tenant_ceiling()}  # read once

    @extend_schema(
        operation_id="egress_allowlist_list",
        responses=EgressAllowOut(many=True),
        description="What the organisation's outside calls (every effect step, its email "
        "server and Slack base URL included) may reach beyond public addresses, newest first.",
    )
    def get(self, request: Request) -> Response:
        return self.list_page()

    @extend_schema(
        operation_id="egress_allowlist_create",
        request=EgressAllowIn,
        responses={201: EgressAllowOut, 400: ErrorOut, 409: ErrorOut},
        description="Allowlist a host, suffix, address or network. It must lie within what the "
        "operator lets organisations open (`WAYMARK_EGRESS_ALLOWABLE`, nothing by default): "
        "otherwise 400 `egress_not_allowable`, as for cloud metadata and link-local addresses "
        "(`169.254.0.0/16`, `fe80::/10`, `fd00:ec2::254`, `100.100.100.200`), which never "
        "open. The same entry again is 409 `already_exists` with the `id` that holds it.",
    )
    def post(self, request: Request) -> Response:
        data = EgressAllowIn(data=request.data)
        data.is_valid(raise_exception=True)
        row = allow_add(_org(request), data.validated_data["entry"], data.validated_data["note"],
                        actor=request_actor(request))  # fmt: skip
        return Response(EgressAllowOut(row).data, status=status.HTTP_201_CREATED)


class EgressAllowDetailView(APIView):
    @extend_schema(
        operation_id="egress_allowlist_read", responses={200: EgressAllowOut, 404: ErrorOut}
    )
    def get(self, request: Request, entry_id: int) -> Response:
        return Response(EgressAllowOut(allow_get(_org(request), entry_id)).data)

    @extend_schema(
        operation_id="egress_allowlist_delete",
        responses={204: None, 404: ErrorOut},
        description="Remove the entry: the next call to it is refused again.",
    )
    def delete(self, request: Request, entry_id: int) -> Response:
        allow_delete(allow_get(_org(request), entry_id), actor=request_actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- effects ----------------------------------------------------------------------------------


class EffectOut(serializers.ModelSerializer[Effect]):
    """An effect of the ledger. Not its attempt's owner (an engine host and process id)."""

    key = serializers.CharField(
        source="sent_key",
        help_text="The key as the provider was sent it (`Idempotency-Key`, Slack metadata, "
        "`X-Waymark-Effect-Key`): `run/step/iteration`, a colon and a random part fixed when "
        "the effect was first claimed. Look the effect up at the provider by it.",
    )
    run = serializers.IntegerField(source="run_id")
    connection = serializers.SerializerMethodField(help_text="The connection's name, if any.")
    state = EffectStateField(
        help_text="`needs_review`: parked for a person, who resolves it (`resolve`).",
    )

    class Meta:
        model = Effect
        fields = [
            "id", "key", "run", "step_id", "iteration", "provider", "connection", "state",
            "calls", "first_attempt_at", "last_attempt_at", "lease_until", "request", "result",
            "last_response", "error", "reserved_cost", "cost", "resolved_by", "created_at",
            "updated_at",
        ]  # fmt: skip

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_connection(self, effect: Effect) -> str | None:
        return effect.connection.name if effect.connection is not None else None


class IdFilter(django_filters.Filter):
    field_class = forms.IntegerField  # an id: a whole number, not any decimal


class EffectFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(
        choices=EffectState.choices,
        error_messages={"invalid_choice": f"must be one of {', '.join(EffectState.values)}"},
        help_text="Only effects in this state (`needs_review`: waiting for a person).",
    )
    run = IdFilter(
        field_name="run_id", min_value=1, max_value=2**63 - 1, help_text="Only this run's effects."
    )
    provider = django_filters.CharFilter(max_length=20, help_text="Only this provider's effects.")

    class Meta:
        model = Effect
        fields = ["state", "run", "provider"]


class EffectResolveIn(StrictInput):
    action = ResolveActionField(
        help_text="`done`: it was made, with this `result` (the step's output). `retry`: "
        "nothing was made; the step's next attempt calls again with the same key. `fail`: "
        "the step fails, with `reason`.",
    )
    result = serializers.JSONField(
        required=False, help_text="With `done` only, and required then: what the provider made."
    )
    reason = serializers.CharField(
        max_length=MAX_REASON_CHARS, required=False, allow_blank=True, default="",
        validators=[storable_text],
    )  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        has_result = "result" in attrs and attrs["result"] is not None
        if attrs["action"] == DONE and not has_result:
            raise serializers.ValidationError({"result": ["Required with done."]})
        if attrs["action"] != DONE and "result" in self.initial_data:
            raise serializers.ValidationError({"result": ["Only with done."]})
        if has_result:
            problem = json_problem(attrs["result"])
            if problem is not None:
                raise serializers.ValidationError({"result": [problem]})
        return attrs


def effect_get(org: Organisation, effect_id: int) -> Effect:
    found = Effect.objects.select_related("connection").filter(org=org, pk=effect_id).first()
    if found is None:
        raise UnknownEffect(effect_id=effect_id)
    return found


class EffectListView(ScopedList):
    model = Effect
    serializer_class = EffectOut
    pagination_class = CursorPage
    filterset_class = EffectFilter

    def get_queryset(self) -> QuerySet[Effect]:
        return super().get_queryset().select_related("connection")

    @extend_schema(
        operation_id="effects_list",
        responses=EffectOut(many=True),
        description="The ledger's effects, newest first: `?state=needs_review` lists the ones "
        "waiting for a person. An unknown parameter is refused (400 `invalid_query`).",
    )
    def get(self, request: Request) -> Response:
        return self.list_page()


class EffectDetailView(APIView):
    @extend_schema(operation_id="effects_read", responses={200: EffectOut, 404: ErrorOut})
    def get(self, request: Request, effect_id: int) -> Response:
        return Response(EffectOut(effect_get(_org(request), effect_id)).data)


class EffectResolveView(APIView):
    @extend_schema(
        operation_id="effects_resolve",
        request=EffectResolveIn,
        responses={200: EffectOut, 400: ErrorOut, 404: ErrorOut, 409: ErrorOut},
        description="Resolve an effect in `needs_review`: `done` with a `result`, `retry` "
        "with the same key, or `fail` the step. Recorded in the run's history "
        "(`effect.resolved`, naming the API key); the step parked on it wakes. An effect "
        "not in review is 409 `not_in_review`.",
    )
    def post(self, request: Request, effect_id: int) -> Response:
        org = _org(request)
        effect = effect_get(org, effect_id)
        data = EffectResolveIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        try:
            resolve_effect(effect.pk, fields["action"], by=request_actor(request),
                           result=fields.get("result"), reason=fields["reason"])  # fmt: skip
        except ResolveError as exc:
            raise ResolveRefused(exc) from exc
        return Response(EffectOut(effect_get(org, effect_id)).data)
