"""Query-string filters of the list endpoints (django-filter), applied strictly.

A parameter an endpoint does not take (``?stauts=failed``) would otherwise be ignored and the
client would act on an unfiltered list: it is refused with 400 ``invalid_query`` naming it.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet
from django.http import HttpRequest
from django_filters.rest_framework import DjangoFilterBackend

from ..errors import InvalidFilter, InvalidQuery
from ..models import Run, Signal
from ..states import RunStatus

_STATUS_CHOICES = f"must be one of {', '.join(RunStatus.values)}"


class SlugFilter(django_filters.CharFilter):
    field_class = forms.SlugField  # a value no slug can have is a mistake worth a 400


class RunFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(
        choices=RunStatus.choices,
        error_messages={"invalid_choice": _STATUS_CHOICES},
        help_text="Only runs in this status.",
    )
    automation = SlugFilter(
        field_name="automation__slug", max_length=63, help_text="Only runs of this automation."
    )
    # Exact, as sent (no trimming), like the start key itself; unique in the organisation,
    # so this finds the one run a start key started (index run_start_key_per_org).
    start_key = django_filters.CharFilter(
        max_length=255, strip=False, help_text="The run this start key started, if any."
    )

    class Meta:
        model = Run
        fields = ["status", "automation", "start_key"]


SIGNAL_STATUSES = [("pending", "pending"), ("consumed", "consumed"), ("dropped", "dropped")]


class SignalFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(
        choices=SIGNAL_STATUSES, method="by_status",
        error_messages={"invalid_choice": "must be one of pending, consumed, dropped"},
        help_text="pending: no step has taken it yet; consumed; dropped (unmatched, past "
        "retention).",
    )  # fmt: skip
    name = django_filters.CharFilter(max_length=100, help_text="Only signals of this name.")
    correlation = django_filters.CharFilter(max_length=500, strip=False)

    class Meta:
        model = Signal
        fields = ["status", "name", "correlation"]

    def by_status(self, queryset: QuerySet[Signal], name: str, value: str) -> QuerySet[Signal]:
        if value == "dropped":
            return queryset.filter(dropped_at__isnull=False)
        if value == "consumed":
            return queryset.filter(consumed_at__isnull=False)
        return queryset.filter(consumed_at__isnull=True, dropped_at__isnull=True)


def _paging_parameters(view: Any) -> set[str]:
    paginator = getattr(view, "paginator", None)
    names = (getattr(paginator, "cursor_query_param", None),
             getattr(paginator, "page_size_query_param", None))  # fmt: skip
    return {name for name in names if name}


class StrictFilterBackend(DjangoFilterBackend):
    """django-filter, with unknown parameters and unusable values refused (400)."""

    def filter_queryset(self, request: HttpRequest, queryset: QuerySet[Any], view: Any) -> Any:
        filterset_class = self.get_filterset_class(view, queryset)
        known = set(filterset_class.base_filters) if filterset_class else set()
        unknown = sorted(set(request.GET) - known - _paging_parameters(view))
        if unknown:
            takes = ", ".join(sorted(known | _paging_parameters(view))) or "none"
            raise InvalidQuery(
                parameter=unknown[0],
                reason=f'Unknown query parameter "{unknown[0]}"; this endpoint takes: {takes}.',
            )
        if filterset_class is None:
            return queryset
        filterset = filterset_class(request.GET, queryset=queryset, request=request)
        if not filterset.is_valid():
            name, messages = next(iter(filterset.errors.items()))
            raise InvalidFilter(parameter=name, reason=f"{name}: {messages[0]}")
        return filterset.qs
