"""Connections, the effect ledger, suppressions, model budgets and the egress allowlist in the
admin, scoped to the user's organisations like every workflows page (workflows/admin/scoping).

- A connection's secret is write-only: a password field that is never filled in again, kept
  as it is when left empty, and stored encrypted (``effects/secrets.py``); the ciphertext is
  never shown either. A new secret on a broken connection repairs it.
- Effects are read-only. One in ``needs_review`` has three buttons on its page (done with a
  result, retry with the same key, fail the step), each a POST to ``resolve_view``, which
  checks the user may change effects in the effect's organisation at that moment.
- People's actions go through ``effects/resolve.py``, after the admin's own transaction has
  committed (they open durable transactions of their own), as the user's name.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from workflows.errors import WaymarkError
from workflows.plugins.admin import (
    OrgScopedMixin,
    OrgScopedRelatedFilter,
    SafeJSONField,
    may_change_here,
    pretty_json,
)
from workflows.plugins.audit import Actor
from workflows.plugins.definitions import UNSTORABLE_REASON, has_unstorable

from .allowlist import audit_allow
from .api import (
    CONNECTION_NAME,
    MAX_REASON_CHARS,
    MAX_SECRET_CHARS,
    audit_connection,
    json_problem,
    provider_names,
)
from .checks import check_connection, check_seconds
from .consent import address_refused
from .destinations import base_url_problem, moves_secret, where_it_goes
from .egress import NotAllowable, allowable_entry, in_force, tenant_ceiling
from .limits import limit_problem
from .models import Connection, Effect, EgressAllow, ModelBudget, Suppression
from .resolve import (
    DONE,
    FAIL,
    RETRY,
    ResolveError,
    budget_raised,
    repair_connection,
    resolve_effect,
)
from .secrets import secret_problem
from .states import ConnectionStatus, EffectState

CHECK_LIMIT = 20  # connections probed by one click (all within one check's bound)
_AFTER_COMMIT = "_effects_after_commit"


def actor_for(request: HttpRequest) -> Actor:
    """The signed-in person, as the audit log and the run history (``admin:<user>``) name them."""
    return Actor.user(request.user)


def _after_commit(request: HttpRequest, action: Any) -> None:
    """Run ``action(request)`` once the change form's transaction has committed (see
    ``AfterSaveMixin``): the people's actions of effects/resolve.py open durable
    transactions, which cannot nest inside the admin's."""
    getattr(request, _AFTER_COMMIT, []).append(action)


class AfterSaveMixin:
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        setattr(request, _AFTER_COMMIT, [])
        response: HttpResponse = super().changeform_view(  # type: ignore[misc]
            request, object_id, form_url, extra_context
        )
        for action in getattr(request, _AFTER_COMMIT):
            action(request)
        return response


def _json_checked(value: Any, what: str) -> Any:
    problem = json_problem(value)
    if problem is not None:
        raise ValidationError(f"The {what} {problem}.")
    return value


def _org_fixed_once_saved(fields: list[str], obj: Any, *also: str) -> list[str]:
    return fields if obj is None else ["org", *also, *fields]


# --- connections ------------------------------------------------------------------------------

HEALTH = ["has_secret", "status", "broken_reason", "broken_at", "checked_at", "circuit",
          "consecutive_failures", "circuit_until", "created_at", "updated_at"]  # fmt: skip
SETTINGS = ["base_url", "options", "max_concurrency", "timeout_seconds"]


class ConnectionForm(forms.ModelForm):
    secret = forms.CharField(
        required=False,
        max_length=MAX_SECRET_CHARS,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: stored encrypted and never shown again. Leave empty to keep "
        "the current secret. A new secret on a broken connection repairs it.",
    )

    class Meta:
        model = Connection
        fields = ["org", "name", "provider", *SETTINGS]
        field_classes = {"options": SafeJSONField}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "provider" in self.fields:  # only when it is created: fixed afterwards
            self.fields["provider"] = forms.ChoiceField(
                choices=[(name, name) for name in provider_names()],
                help_text="What the connection reaches; steps of that type may use it.",
            )

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        if not CONNECTION_NAME.fullmatch(name):
            raise ValidationError(
                "Start with a letter or digit; use only letters, digits, _ . and - "
                "(steps name the connection by it)."
            )
        return name

    def clean_base_url(self) -> str:
        base_url: str = self.cleaned_data.get("base_url") or ""
        problem = base_url_problem(base_url)
        if problem is not None:
            raise ValidationError(f"The base URL must be {problem}.")
        return base_url

    def clean_options(self) -> Any:
        options = self.cleaned_data.get("options")
        if options is None:
            return {}
        if not isinstance(options, dict):
            raise ValidationError('Options are a JSON object, like {"from": "a@b.example"}.')
        return _json_checked(options, "options")

    def clean_secret(self) -> str:
        secret: str = self.cleaned_data.get("secret") or ""
        if has_unstorable(secret):
            raise ValidationError(f"The secret {UNSTORABLE_REASON}.")
        problem = secret_problem(secret)
        if problem is not None:
            raise ValidationError(f"The secret {problem}.")
        return secret

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        stored = self.instance
        base_url = cleaned.get("base_url", stored.base_url)
        options = cleaned.get("options", stored.options)
        given = cleaned.get("secret")
        if stored.pk is not None and not given and moves_secret(stored, base_url, options):
            # Settings alone never take the stored secret elsewhere (destinations.py).
            moved = ValidationError(
                f"This change sends the secret to {where_it_goes(stored.provider)}: enter the "
                "secret again to make it.",
                code="secret_required",
            )
            self.add_error("secret", moved)
        return cleaned

    def clean_max_concurrency(self) -> int:
        value: int = self.cleaned_data["max_concurrency"]
        if value < 1:
            raise ValidationError("At least 1: no call could ever be made.")
        problem = limit_problem("max_concurrency", value)
        if problem is not None:
            raise ValidationError(problem)
        return value

    def clean_timeout_seconds(self) -> float:
        value: float = self.cleaned_data["timeout_seconds"]
        if not 0.1 <= value <= 3600:  # False for NaN too
            raise ValidationError("From 0.1 to 3600 seconds.")
        problem = limit_problem("timeout_seconds", value)
        if problem is not None:
            raise ValidationError(problem)
        return value


@admin.register(Connection)
class ConnectionAdmin(AfterSaveMixin, OrgScopedMixin, admin.ModelAdmin):
    form = ConnectionForm
    list_display = ["name", "org", "provider", "status_shown", "circuit", "max_concurrency",
                    "checked_at"]  # fmt: skip
    list_filter = ["status", "circuit", ("org", OrgScopedRelatedFilter)]
    search_fields = ["name"]
    list_select_related = ["org"]
    actions = ["check_now", "mark_repaired"]
    change_form_template = "admin/effects/connection/change_form.html"

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        sets: list[Any] = [
            (None, {"fields": ["org", "name", "provider", "base_url", "options", "secret"]}),
            ("Limits", {"fields": ["max_concurrency", "timeout_seconds"]}),
        ]
        if obj is not None:
            sets.append(("Health", {"fields": HEALTH}))
        return sets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # Steps name a connection, and its secret belongs to its organisation: the name,
        # the organisation and the provider are fixed once it exists.
        return _org_fixed_once_saved(HEALTH, obj, "name", "provider")

    @admin.display(description="status", ordering="status")
    def status_shown(self, obj: Connection) -> str:
        if obj.status == ConnectionStatus.BROKEN:
            return format_html(
                '<strong class="connection-broken" style="color: var(--error-fg)">broken'
                "</strong>: {}",
                obj.broken_reason or "no reason recorded",
            )
        return obj.status

    @admin.display(description="secret", boolean=True)
    def has_secret(self, obj: Connection) -> bool:
        return bool(obj.secret_encrypted)

    def save_model(self, request: HttpRequest, obj: Connection, form: Any, change: bool) -> None:
        secret = form.cleaned_data.get("secret") or ""
        secret_fields = obj.replace_secret(secret) if secret else []
        if not change:
            obj.save()
            audit_connection(obj, actor_for(request), "connection.create",
                             fields=sorted(form.changed_data), secret_set=bool(secret))  # fmt: skip
            return
        # Only what the form edits: the engine updates the health fields meanwhile.
        fields = [name for name in SETTINGS if name in form.cleaned_data]
        obj.save(update_fields=[*fields, *secret_fields, "updated_at"])
        changed = sorted(name for name in form.changed_data if name != "secret")
        if changed or secret:
            audit_connection(obj, actor_for(request), "connection.update", fields=changed,
                             secret_replaced=bool(secret))  # fmt: skip
        current = Connection.objects.filter(pk=obj.pk).values_list("status", flat=True).first()
        if secret and current == ConnectionStatus.BROKEN:
            _after_commit(request, lambda req: self._repair(req, obj, "with the new secret"))

    def delete_model(self, request: HttpRequest, obj: Connection) -> None:
        audit_connection(obj, actor_for(request), "connection.delete")
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Connection]) -> None:
        with transaction.atomic():  # the change list's action runs in none of its own
            for conn in queryset:
                audit_connection(conn, actor_for(request), "connection.delete")
            super().delete_queryset(request, queryset)

    def _repair(self, request: HttpRequest, conn: Connection, how: str) -> None:
        woken = repair_connection(conn, by=actor_for(request))
        messages.success(request, f"{conn.name}: repaired {how}; {woken} parked step(s) woke.")

    @admin.action(description="Check the connection now", permissions=["change"])
    def check_now(self, request: HttpRequest, queryset: QuerySet[Connection]) -> None:
        chosen = list(queryset.order_by("name")[: CHECK_LIMIT + 1])
        # A click holds one web thread: all its checks share one check's bound.
        bound = check_seconds()
        deadline = time.monotonic() + bound
        late: list[str] = []
        for conn in chosen[:CHECK_LIMIT]:
            left = deadline - time.monotonic()
            if left <= 0:
                late.append(conn.name)
            else:
                self._check_one(request, conn, left)
        if late:
            messages.warning(request, f"Not checked, this click's {bound:g} s being spent: "
                             f"{', '.join(late)}; check them again.")  # fmt: skip
        if len(chosen) > CHECK_LIMIT:
            messages.warning(
                request, f"Only {CHECK_LIMIT} connections are checked at once; check the rest."
            )

    def _check_one(self, request: HttpRequest, conn: Connection, seconds: float) -> None:
        was_broken = conn.status == ConnectionStatus.BROKEN
        try:
            result = check_connection(conn, by=actor_for(request), seconds=seconds)
        except WaymarkError as exc:  # checked already, or the organisation's checks are busy
            messages.warning(request, f"{conn.name}: not checked: {exc.detail} ({exc.code})")
            return
        if result == "ok":
            repaired = " (repaired: its parked steps woke)" if was_broken else ""
            messages.success(request, f"{conn.name}: ok{repaired}.")
        elif result == "broken":
            conn.refresh_from_db(fields=["broken_reason"])
            messages.error(request, f"{conn.name}: broken: {conn.broken_reason}")
        else:
            messages.warning(request, f"{conn.name}: {result} (left as it was).")

    @admin.action(description="Mark repaired", permissions=["change"])
    def mark_repaired(self, request: HttpRequest, queryset: QuerySet[Connection]) -> None:
        for conn in queryset.order_by("name"):
            self._repair(request, conn, "by hand")


# --- the effect ledger ------------------------------------------------------------------------


class ProviderFilter(admin.SimpleListFilter):
    """The installed providers (the stock filter would list every organisation's values)."""

    title = "provider"
    parameter_name = "provider"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in provider_names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(provider=value) if value else queryset


class ResultField(SafeJSONField):
    """JSON text, any value but null; too deep, NaN or unstorable text is a form error."""

    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)  # empty, not "null"

    def validate(self, value: Any) -> None:
        if value is None:
            raise ValidationError(self.error_messages["required"], code="required")
        _json_checked(value, "result")


class ResolveDoneForm(forms.Form):
    result = ResultField(
        widget=forms.Textarea(attrs={"rows": 6, "cols": 80}),
        help_text="What the provider made, as JSON (the step's output): look it up there first.",
    )


class ResolveRetryForm(forms.Form):
    pass


class ResolveFailForm(forms.Form):
    reason = forms.CharField(
        max_length=MAX_REASON_CHARS,
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
        help_text="Why, for the run's history and the step's error.",
    )


RESOLVE_FORMS: dict[str, type[forms.Form]] = {
    DONE: ResolveDoneForm, RETRY: ResolveRetryForm, FAIL: ResolveFailForm,
}  # fmt: skip
RESOLVE_LABELS = {
    DONE: "Mark done with result",
    RETRY: "Retry with the same key",
    FAIL: "Fail the step",
}
RESOLVE_DONE = {DONE: "marked done", RETRY: "set to retry with the same key", FAIL: "failed"}


EFFECT_FIELDS = (
    "sent_key", "org", "run", "step_id", "iteration", "provider", "connection", "state", "calls",
    "first_attempt_at", "last_attempt_at", "lease_until", "pretty_request",
    "pretty_last_response", "pretty_result", "error", "reserved_cost", "cost", "resolved_by",
    "created_at", "updated_at",
)  # fmt: skip


@admin.register(Effect)
class EffectAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["id", "sent_key", "org", "provider", "state", "calls", "last_attempt_at",
                    "resolved_by"]  # fmt: skip
    list_filter = ["state", ProviderFilter, ("org", OrgScopedRelatedFilter)]
    search_fields = ["key", "external_key"]  # the ledger's key, or the key a provider shows
    list_select_related = ["org"]
    fields = EFFECT_FIELDS
    readonly_fields = EFFECT_FIELDS
    change_form_template = "admin/effects/effect/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Effect]:
        return super().get_queryset(request).select_related("org", "connection")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # effects are claimed by the engine

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the fields never change by hand; resolving is has_resolve_permission

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the ledger is what stops a repeat

    def has_resolve_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Resolve an effect in review: the ``effects.change_effect`` permission, in the
        effect's organisation, asked at every click (membership is read per request)."""
        return may_change_here(request, self.opts, obj)

    @admin.display(description="key (as sent)", ordering="key")
    def sent_key(self, obj: Effect) -> str:
        """The key the provider was sent, to look the effect up there (``Effect.sent_key``)."""
        return obj.sent_key

    @admin.display(description="request")
    def pretty_request(self, obj: Effect) -> str:
        return pretty_json(obj.request)

    @admin.display(description="last response")
    def pretty_last_response(self, obj: Effect) -> str:
        return pretty_json(obj.last_response)

    @admin.display(description="result")
    def pretty_result(self, obj: Effect) -> str:
        return pretty_json(obj.result)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Effect | None = None,
    ) -> HttpResponse:
        if (
            obj is not None
            and obj.state == EffectState.NEEDS_REVIEW
            and self.has_resolve_permission(request, obj)
        ):
            context["resolve_forms"] = [
                (action, RESOLVE_LABELS[action], RESOLVE_FORMS[action](auto_id=f"id_{action}_%s"))
                for action in (DONE, RETRY, FAIL)
            ]
        return super().render_change_form(request, context, add, change, form_url, obj)

    def get_urls(self) -> list[URLPattern]:
        resolve = path(
            "<path:object_id>/resolve/<str:action>/",
            self.admin_site.admin_view(self.resolve_view),
            name="effects_effect_resolve",
        )
        return [resolve, *super().get_urls()]

    def resolve_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """One resolution: GET shows its form alone, POST validates it and resolves (or shows
        the form again with its errors), then goes back to the effect's page."""
        if action not in RESOLVE_FORMS:
            raise Http404("No such resolution.")
        effect = self.get_object(request, unquote(object_id))
        if effect is None:
            raise Http404("No such effect.")
        if not self.has_resolve_permission(request, effect):
            raise PermissionDenied
        effect_url = reverse("admin:effects_effect_change", args=[effect.pk])
        form = RESOLVE_FORMS[action](request.POST if request.method == "POST" else None,
                                     auto_id=f"id_{action}_%s")  # fmt: skip
        if form.is_valid():
            try:
                resolve_effect(
                    effect.pk, action, by=actor_for(request),
                    result=form.cleaned_data.get("result"),
                    reason=form.cleaned_data.get("reason", ""),
                )  # fmt: skip
            except ResolveError as refused:
                messages.error(request, f"Effect {effect.sent_key}: {refused.code}: {refused}")
            else:
                messages.success(request, f"Effect {effect.sent_key} {RESOLVE_DONE[action]}.")
            return redirect(effect_url)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{RESOLVE_LABELS[action]}?",
            "effect": effect,
            "action": action,
            "label": RESOLVE_LABELS[action],
            "form": form,
            "effect_url": effect_url,
        }
        return TemplateResponse(request, "admin/effects/effect/resolve.html", context)


# --- suppressions, model budgets, egress ------------------------------------------------------


class SuppressionForm(forms.ModelForm):
    class Meta:
        model = Suppression
        fields = ["org", "channel", "address", "reason"]

    def clean_address(self) -> str:
        # Lowercased before the uniqueness check, as it is stored (models.Suppression.save).
        address: str = self.cleaned_data["address"].strip().lower()
        if not address:
            raise ValidationError("An address is required.")
        return address

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        channel, address = self.cleaned_data.get("channel"), self.cleaned_data.get("address")
        if channel and address:
            refused = address_refused(channel, address)
            if refused is not None:
                self.add_error("address", refused)
        return cleaned


@admin.register(Suppression)
class SuppressionAdmin(OrgScopedMixin, admin.ModelAdmin):
    """Added and deleted, never edited: a suppression is a fact about an address."""

    form = SuppressionForm
    list_display = ["address", "channel", "org", "reason", "created_at"]
    list_filter = ["channel", ("org", OrgScopedRelatedFilter)]
    search_fields = ["address"]
    list_select_related = ["org"]
    readonly_fields = ["created_at"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)


class ModelBudgetForm(forms.ModelForm):
    class Meta:
        model = ModelBudget
        fields = ["org", "limit"]

    def clean_limit(self) -> Decimal:
        limit: Decimal = self.cleaned_data["limit"]
        if limit < 0:
            raise ValidationError("A limit cannot be negative.")
        return limit


@admin.register(ModelBudget)
class ModelBudgetAdmin(AfterSaveMixin, OrgScopedMixin, admin.ModelAdmin):
    form = ModelBudgetForm
    list_display = ["org", "limit", "reserved", "spent", "updated_at"]
    list_select_related = ["org"]
    list_filter = [("org", OrgScopedRelatedFilter)]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return _org_fixed_once_saved(["reserved", "spent", "updated_at"], obj)

    def save_model(self, request: HttpRequest, obj: ModelBudget, form: Any, change: bool) -> None:
        if not change:
            obj.save()
            raised = True
        else:
            before = ModelBudget.objects.filter(pk=obj.pk).values_list("limit", flat=True).first()
            # Only the limit: the engine reserves and spends meanwhile.
            obj.save(update_fields=["limit", "updated_at"])
            raised = before is None or obj.limit > before
        if raised:
            _after_commit(request, lambda req: self._raised(req, obj))

    def _raised(self, request: HttpRequest, budget: ModelBudget) -> None:
        woken = budget_raised(budget.org_id, by=actor_for(request))
        messages.success(request, f"Budget raised; {woken} parked step(s) woke.")


class EgressAllowForm(forms.ModelForm):
    class Meta:
        model = EgressAllow
        fields = ["org", "entry", "note"]

    def clean_entry(self) -> str:
        """Stored normalised, and only within the operator's ceiling (superusers too: the
        ceiling is a setting, WAYMARK_EGRESS_ALLOWABLE)."""
        try:
            return allowable_entry(self.cleaned_data["entry"])
        except NotAllowable as exc:
            raise ValidationError(str(exc), code=NotAllowable.code) from None
        except ValueError as exc:
            raise ValidationError(str(exc)) from None


@admin.register(EgressAllow)
class EgressAllowAdmin(OrgScopedMixin, admin.ModelAdmin):
    form = EgressAllowForm
    list_display = ["entry", "org", "in_force", "note"]
    list_filter = [("org", OrgScopedRelatedFilter)]
    search_fields = ["entry", "note"]
    list_select_related = ["org"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return _org_fixed_once_saved([], obj)

    def save_model(self, request: HttpRequest, obj: EgressAllow, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)  # in the admin's transaction, as this:
        audit_allow(
            obj, actor_for(request), "egress_allow.change" if change else "egress_allow.add"
        )

    def delete_model(self, request: HttpRequest, obj: EgressAllow) -> None:
        audit_allow(obj, actor_for(request), "egress_allow.remove")
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[EgressAllow]) -> None:
        with transaction.atomic():  # the change list's action runs in none of its own
            for row in queryset:
                audit_allow(row, actor_for(request), "egress_allow.remove")
            super().delete_queryset(request, queryset)

    @admin.display(description="in force", boolean=True)
    def in_force(self, obj: EgressAllow) -> bool:
        """False for an entry the operator's ceiling no longer covers: kept, opens nothing."""
        return in_force(obj.entry, tenant_ceiling())
