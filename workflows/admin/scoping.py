"""Organisation scoping for every admin page.

A superuser sees every organisation. Any other staff user sees and acts on only the objects
of the organisations they are a member of (``Membership``): the change lists, the objects a
URL names (anything else is a 404, whether it exists or not, so ids leak nothing), the
choices of foreign keys and of list filters, and the querysets admin actions receive.

Memberships are read from the database once per request, never from the session, so a
membership removed a moment ago already counts for the next click.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest

from ..models import Membership, Organisation

_CACHE_ATTR = "_waymark_member_org_ids"


def member_org_ids(request: HttpRequest) -> frozenset[int] | None:
    """The organisations the request's user may see; None means all (a superuser)."""
    user = request.user
    if not user.is_authenticated:
        return frozenset()  # an anonymous user is a member of nothing
    if user.is_superuser:
        return None
    cached = getattr(request, _CACHE_ATTR, None)
    if cached is None:
        ids = Membership.objects.filter(user_id=user.pk).values_list("org_id", flat=True)
        cached = frozenset(ids) if user.is_active else frozenset()
        setattr(request, _CACHE_ATTR, cached)
    return cached


def org_lookup(model: type[Model]) -> str | None:
    """The lookup from ``model`` to its organisation's id, or None for unscoped models."""
    if issubclass(model, Organisation):
        return "pk"
    if any(field.name == "org" for field in model._meta.get_fields()):
        return "org"
    return None


def scoped(queryset: QuerySet, request: HttpRequest) -> QuerySet:
    """``queryset`` limited to the user's organisations (unchanged for a superuser)."""
    orgs = member_org_ids(request)
    lookup = org_lookup(queryset.model)
    if orgs is None or lookup is None:
        return queryset
    return queryset.filter(**{f"{lookup}__in": orgs})


def in_scope(request: HttpRequest, obj: Model | None) -> bool:
    """May the user see ``obj``? (None, a permission asked about no object in particular: yes.)"""
    orgs = member_org_ids(request)
    lookup = org_lookup(type(obj)) if obj is not None else None
    if obj is None or orgs is None or lookup is None:
        return True
    org_id = obj.pk if lookup == "pk" else getattr(obj, f"{lookup}_id")
    return org_id in orgs


def may_change_here(request: HttpRequest, opts: Any, obj: Model | None) -> bool:
    """The model's change permission, for an object of the user's organisations: asked at
    every click (memberships are read per request), for actions beyond editing."""
    codename = get_permission_codename("change", opts)
    return in_scope(request, obj) and request.user.has_perm(f"{opts.app_label}.{codename}")


class OrgScopedMixin:
    """Scopes a ModelAdmin or an inline to the user's organisations. Put it first in the bases."""

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return scoped(super().get_queryset(request), request)  # type: ignore[misc]

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        obj = super().get_object(request, object_id, from_field)  # type: ignore[misc]
        if obj is None and member_org_ids(request) is not None:
            # Another organisation's object and a missing one look the same: not found.
            raise Http404("No such object in your organisations.")
        return obj

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if "queryset" not in kwargs and org_lookup(db_field.related_model) is not None:
            kwargs["queryset"] = scoped(db_field.related_model._default_manager.all(), request)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)  # type: ignore[misc]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return in_scope(request, obj) and super().has_view_permission(request, obj)  # type: ignore[misc]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return in_scope(request, obj) and super().has_change_permission(request, obj)  # type: ignore[misc]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return in_scope(request, obj) and super().has_delete_permission(request, obj)  # type: ignore[misc]


class OrgScopedRelatedFilter(admin.RelatedFieldListFilter):
    """A list filter on a foreign key whose choices are only the user's organisations' objects
    (the stock filter lists every row of the related table, other organisations' names too)."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> Any:
        orgs = member_org_ids(request)
        lookup = org_lookup(field.related_model)
        if orgs is None or lookup is None:
            return super().field_choices(field, request, model_admin)
        ordering = self.field_admin_ordering(field, request, model_admin)
        return field.get_choices(
            include_blank=False, ordering=ordering, limit_choices_to={f"{lookup}__in": orgs}
        )
