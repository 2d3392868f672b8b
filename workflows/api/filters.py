"""Query-string filters of the list endpoints (django-filter), applied strictly.

A parameter an endpoint does not take (``?stauts=failed``) would otherwise be ignored and the
client would act on an unfiltered list: it is refused with 400 ``invalid_query`` naming it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework.request import Request
from rest_framework.settings import api_settings

from ..errors import InvalidFilter, InvalidQuery
from ..models import Automation, Organisation, Run, Signal
from ..selectors import SEARCH_MAX_CHARS, SEARCH_MIN_CHARS, run_search
from ..states import RunStatus
from .auth import request_key

_STATUS_CHOICES = f"must be one of {', '.join(RunStatus.values)}"
# How far back, in runs, RunFilter.by_created_after looks for where "since" begins.
SINCE_WINDOW = 10_000
# How much earlier than "since" that bound is taken: longer than any run's start transaction.
START_OVERLAP = timedelta(minutes=5)


class SlugFilter(django_filters.CharFilter):
    field_class = forms.SlugField  # a value no slug can have is a mistake worth a 400


class TrueOrFalseField(forms.NullBooleanField):
    """``true`` or ``false``, as the schema's boolean is written in a query (Django's would
    read any other word as no filter at all, and the client would act on an unfiltered
    list)."""

    widget = forms.TextInput  # the text as sent, not Django's reading of it

    def to_python(self, value: Any) -> bool | None:  # type: ignore[override]  # None: no filter
        if value in (None, ""):
            return None
        if value in ("true", "false"):
            return bool(value == "true")
        raise forms.ValidationError("Must be true or false.")


class BooleanFilter(django_filters.BooleanFilter):
    field_class = TrueOrFalseField


class InstantField(IsoDateTimeField):
    """An ISO 8601 instant, read in UTC: Python takes offsets up to ±23:59, PostgreSQL only
    up to ±15:59 (its error would be a 500). Past the years a datetime holds, a 400."""

    def to_python(self, value: Any) -> datetime | None:
        instant = super().to_python(value)
        if instant is None:
            return None
        try:
            return instant.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("Enter an instant between the years 1 and 9999.") from None


class InstantFilter(django_filters.IsoDateTimeFilter):
    field_class = InstantField


class RunFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(
        choices=RunStatus.choices,
        error_messages={"invalid_choice": _STATUS_CHOICES},
        help_text="Only runs in this status.",
    )
    automation = SlugFilter(
        method="by_automation", max_length=63, help_text="Only runs of this automation."
    )
    # Exact, as sent (no trimming), like the start key itself; unique in the organisation,
    # so this finds the one run a start key started (index run_start_key_per_org).
    start_key = django_filters.CharFilter(
        max_length=255, strip=False, help_text="The run this start key started, if any."
    )
    # No index serves a prefix (LIKE uses the start-key index only under the C collation):
    # runs are read newest first until a page matches, all of them when none does (half a
    # second at a million runs). created_after bounds that read to the runs since.
    start_key_prefix = django_filters.CharFilter(
        field_name="start_key", lookup_expr="startswith", max_length=255, strip=False,
        help_text="Only runs whose start key begins with this.",
    )  # fmt: skip
    # Inside the input and the start key, through the trigram index run_search (see
    # selectors.run_search); fewer than 3 characters hold no trigram to look up.
    # Not stripped here, so its length is the one the schema states (run_search trims it).
    search = django_filters.CharFilter(
        method="by_search", min_length=SEARCH_MIN_CHARS, max_length=SEARCH_MAX_CHARS, strip=False,
        help_text="Only runs whose input (anywhere in its JSON: a name, an order id) or start "
        "key holds this text, case-insensitive; at least 3 characters. Digits also find the "
        "run of that id.",
    )  # fmt: skip
    created_after = InstantFilter(
        method="by_created_after", help_text="Only runs created at or after this instant."
    )
    created_before = InstantFilter(
        field_name="created_at", lookup_expr="lt", help_text="Only runs created before this."
    )

    class Meta:
        model = Run
        fields = [
            "status", "automation", "start_key", "start_key_prefix", "search", "created_after",
            "created_before",
        ]  # fmt: skip

    def __init__(self, data: Any = None, *, org: Organisation | None = None, **kw: Any) -> None:
        """``org``: whose runs these are, for a caller without a request (``manage.py runs``);
        the API's is its key's."""
        super().__init__(data, **kw)
        self.org = org

    # The filter methods' ``value`` hints are the types the OpenAPI schema gives their filters.
    def by_automation(self, queryset: QuerySet[Run], name: str, value: str) -> QuerySet[Run]:
        """By the automation's id, read first. Given a literal id the planner weighs how many
        runs it has (index run_org_automation_id); given a join on the slug it reads every
        run of the organisation, newest first, when the automation has few (1.3 s at a
        million runs) or does not exist."""
        found = Automation.objects.filter(org=self._org(), slug=value).values_list("id", flat=True)
        automation_id = found.first()
        if automation_id is None:
            return queryset.none()
        return queryset.filter(automation_id=automation_id)

    def by_search(self, queryset: QuerySet[Run], name: str, value: str) -> QuerySet[Run]:
        return run_search(queryset, value)

    def _org(self) -> Organisation:
        if self.org is not None:
            return self.org
        assert isinstance(self.request, Request), "the API filters with its request"
        return request_key(self.request).org

    def by_created_after(
        self, queryset: QuerySet[Run], name: str, value: datetime
    ) -> QuerySet[Run]:
        """Runs created since ``value``, read by id as every list reads them. A bound on
        ``created_at`` alone reads every older run of the organisation whenever fewer than a
        page match (``since`` an hour ago, a quiet hour, a million runs). Ids grow with
        creation, so the newest run created before ``value`` bounds the read: only ids above
        it. That run is looked for among the newest ``SINCE_WINDOW`` only: when it is not
        there, that many match and a page is found without a bound. The bound is taken
        ``START_OVERLAP`` before ``value``: a run's ``created_at`` is its start transaction's
        beginning and its id is drawn later, so a run created just before ``value`` can hold a
        higher id than one created just after; only a start transaction longer than that
        margin could put a matching run below the bound."""
        if value - datetime.min.replace(tzinfo=value.tzinfo) < START_OVERLAP:  # its own fields
            return queryset  # since the first years of the calendar: every run
        window_floor = queryset.order_by("-id").values("id")[SINCE_WINDOW - 1 : SINCE_WINDOW]
        before = value - START_OVERLAP
        older = queryset.filter(created_at__lt=before, id__gte=Coalesce(Subquery(window_floor), 0))
        bound = older.order_by("-id").values("id")[:1]
        return queryset.filter(created_at__gte=value, id__gt=Coalesce(Subquery(bound), 0))


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
    """The parameters a list takes beside its filters: its pages', and ``format`` (the
    format override every endpoint answers, api/negotiation.py)."""
    paginator = getattr(view, "paginator", None)
    names = (getattr(paginator, "cursor_query_param", None),
             getattr(paginator, "page_size_query_param", None),
             api_settings.URL_FORMAT_OVERRIDE)  # fmt: skip
    return {name for name in names if name}


def _refuse_empty(request: HttpRequest, filters: dict[str, django_filters.Filter]) -> None:
    """An empty value would be no filter at all (django-filter skips it), which only a text
    filter's schema allows: ``?status=`` or ``?created_after=`` is a mistake worth a 400."""
    for name, value in request.GET.items():
        known = filters.get(name)
        if value == "" and known is not None and not isinstance(known, django_filters.CharFilter):
            raise InvalidFilter(parameter=name, reason=f"{name}: empty; leave it out for no filter")


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
        _refuse_empty(request, filterset_class.base_filters)
        filterset = filterset_class(request.GET, queryset=queryset, request=request)
        if not filterset.is_valid():
            name, messages = next(iter(filterset.errors.items()))
            raise InvalidFilter(parameter=name, reason=f"{name}: {messages[0]}")
        return filterset.qs
