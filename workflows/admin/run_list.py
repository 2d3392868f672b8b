"""The runs list at a million runs: no count it cannot bound, and no search read twice.

Django's admin counts the rows a list shows (for its paginator) and, unless told not to,
every row of the table as well, then reads the page: at a million runs each count is a scan
of the table or of an index, every time the list is shown, and a search is run twice (for
the count, then for the page). Here the whole table is never counted
(``show_full_result_count = False``), and the paginator reads the ids of the rows shown, in
the list's order, up to ``COUNT_CAP + 1`` (one query, an index-only read of the newest ids
when nothing narrows the list): their number is the count ("1,000+" beyond the cap, with
the pages up to there; narrow the list with a filter or a search to go further back), and
a page is its ids' rows (a primary-key read of 100).
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.db.models.sql.where import WhereNode
from django.http import HttpRequest
from django.utils.functional import cached_property

COUNT_CAP = 1_000


class AtLeast(int):
    """A count known only to pass the cap: as a number it is one more than the cap (the
    paginator offers the pages up to the cap); in the admin's templates (its paginator,
    "Select all … runs", "All … selected") it reads "1,000+"."""

    def __str__(self) -> str:
        return f"{COUNT_CAP:,}+"


class CappedPaginator(Paginator):
    """Pages of a queryset through its first ``COUNT_CAP + 1`` ids (see the module)."""

    @cached_property
    def ids(self) -> list[Any]:
        rows: Any = self.object_list
        if not isinstance(rows, QuerySet):
            return list(range(len(rows)))  # a list: its positions
        return list(rows.values_list("pk", flat=True)[: COUNT_CAP + 1])

    @cached_property
    def count(self) -> int:
        counted = len(self.ids)
        return AtLeast(counted) if counted > COUNT_CAP else counted

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        ids = self.ids[bottom : bottom + self.per_page]
        rows: Any = self.object_list
        if isinstance(rows, QuerySet):
            return Page(list(by_ids(rows, ids)), number, self)
        return Page([rows[i] for i in ids], number, self)


class CappedChangeList(ChangeList):
    """The admin's change list, reading a list of one page (or "Show all") by the ids its
    paginator read, as it reads every page: Django's own runs the list's query again."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        paginator = self.paginator
        if isinstance(paginator, CappedPaginator) and isinstance(self.result_list, QuerySet):
            self.result_list = by_ids(self.queryset, paginator.ids[: self.list_max_show_all])


def by_ids(rows: QuerySet[Any], ids: list[Any]) -> QuerySet[Any]:
    """``rows``' query (its columns, joins and order) for just these ids, without its
    conditions: they chose the ids already, and a search's, asked again, could lead the
    planner to read its index once more instead of 100 rows by primary key."""
    page = rows.all()
    page.query.where = WhereNode()
    return page.filter(pk__in=ids)
