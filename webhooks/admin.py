"""Webhook subscriptions and their deliveries in the admin, scoped to the user's organisations
like every page (workflows.plugins.admin).

- A subscription is made, changed and deleted through ``services`` (each change audited as
  the person); its signing secret is shown once, on its own page, when it is made or
  rotated, never in a message or again.
- Deliveries are read-only; a failed one can be sent again ("Send again").
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from workflows.errors import WaymarkError
from workflows.plugins.admin import OrgScopedMixin, OrgScopedRelatedFilter, pretty_json
from workflows.plugins.audit import Actor

from .events import EVENT_TYPES
from .models import Delivery, DeliveryStatus, Subscription
from .services import (
    delivery_redeliver,
    url_problem,
    webhook_create,
    webhook_delete,
    webhook_rotate_secret,
    webhook_update,
)

SHOWN_ONCE_TEMPLATE = "admin/webhooks/subscription/secret.html"
_SHOWN_ONCE = "_webhooks_shown_once"


class SubscriptionForm(forms.ModelForm):
    event_types = forms.MultipleChoiceField(
        choices=[(name, f"{name}: {what}") for name, what in EVENT_TYPES.items()],
        widget=forms.CheckboxSelectMultiple,
    )

    class Meta:
        model = Subscription
        fields = ["org", "url", "description", "event_types", "active"]

    def clean_url(self) -> str:
        url: str = self.cleaned_data["url"]
        problem = url_problem(url)
        if problem is not None:
            raise forms.ValidationError(f"The URL {problem}.")
        return url


@admin.register(Subscription)
class SubscriptionAdmin(OrgScopedMixin, admin.ModelAdmin):
    form = SubscriptionForm
    list_display = ["id", "url", "org", "active", "types", "created_at"]
    list_filter = ["active", ("org", OrgScopedRelatedFilter)]
    search_fields = ["url", "description"]
    list_select_related = ["org"]
    actions = ["rotate_secret"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["created_at", "updated_at"] if obj is None else ["org", "created_at", "updated_at"]

    @admin.display(description="event types")
    def types(self, obj: Subscription) -> str:
        return ", ".join(obj.event_types)

    def save_model(self, request: HttpRequest, obj: Subscription, form: Any, change: bool) -> None:
        actor = Actor.user(request.user)
        fields = {name: form.cleaned_data[name] for name in
                  ("url", "description", "event_types", "active")}  # fmt: skip
        if change:
            current = Subscription.objects.get(pk=obj.pk)
            webhook_update(current, actor=actor, **fields)
            return
        made, secret = webhook_create(org=obj.org, actor=actor, **fields)
        obj.pk = made.pk
        setattr(request, _SHOWN_ONCE, secret)  # for response_add only

    def response_add(
        self, request: HttpRequest, obj: Subscription, post_url_continue: Any = None
    ) -> Any:
        secret = getattr(request, _SHOWN_ONCE, None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        return self._secret_page(request, Subscription.objects.get(pk=obj.pk), secret)

    def delete_model(self, request: HttpRequest, obj: Subscription) -> None:
        webhook_delete(obj, actor=Actor.user(request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Subscription]) -> None:
        with transaction.atomic():
            for subscription in queryset:
                webhook_delete(subscription, actor=Actor.user(request.user))

    @admin.action(description="Rotate the signing secret (one at a time)", permissions=["change"])
    def rotate_secret(self, request: HttpRequest, queryset: QuerySet[Subscription]) -> Any:
        chosen = list(queryset[:2])
        if len(chosen) != 1:
            messages.error(request, "Rotate one subscription at a time: its secret is shown once.")
            return None
        secret = webhook_rotate_secret(chosen[0], actor=Actor.user(request.user))
        return self._secret_page(request, chosen[0], secret)

    def _secret_page(self, request: HttpRequest, subscription: Subscription, secret: str) -> Any:
        """The secret, this once, on a page of its own: not in a message, which would carry
        it in a (signed, not encrypted) cookie."""
        context = {**self.admin_site.each_context(request), "opts": self.opts,
                   "subscription": subscription, "secret": secret,
                   "title": "Webhook signing secret"}  # fmt: skip
        response = TemplateResponse(request, SHOWN_ONCE_TEMPLATE, context)
        response["Cache-Control"] = "no-store"
        return response


DELIVERY_FIELDS = (
    "id", "org", "subscription", "event_type", "event_id", "run_id", "occurred_at", "status",
    "attempts", "next_at", "lease_until", "last_attempt_at", "last_status", "last_error",
    "last_response", "created_at", "delivered_at", "pretty_payload",
)  # fmt: skip


@admin.register(Delivery)
class DeliveryAdmin(OrgScopedMixin, admin.ModelAdmin):
    list_display = ["id", "subscription", "org", "event_type", "status", "attempts",
                    "last_status", "last_attempt_at", "created_at"]  # fmt: skip
    list_filter = ["status", "event_type", ("org", OrgScopedRelatedFilter)]
    search_fields = ["=id", "=run_id"]
    list_select_related = ["org", "subscription"]
    show_full_result_count = False
    fields = DELIVERY_FIELDS
    readonly_fields = DELIVERY_FIELDS
    actions = ["send_again"]

    @admin.display(description="data")
    def pretty_payload(self, obj: Delivery) -> str:
        return pretty_json(obj.payload)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # the trigger writes them, with their event

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)  # actions only

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # retention deletes them

    @admin.action(description="Send again (failed ones)", permissions=["change"])
    def send_again(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        sent = 0
        for delivery in queryset.filter(status=DeliveryStatus.FAILED)[:1000]:
            try:
                delivery_redeliver(delivery, actor=Actor.user(request.user))
            except WaymarkError as exc:
                messages.error(request, f"Delivery {delivery.pk}: {exc.code}: {exc.detail}")
            else:
                sent += 1
        messages.success(request, f"{sent} failed delivery(ies) will be sent again.")
