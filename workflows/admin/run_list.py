"""The runs list at a million runs: no count it cannot bound.

Django's admin counts the rows a list shows (for its paginator) and, unless told not to,
every row of the table as well. At a million runs each is a scan of the table or of an
index, every time the list is shown. Here the whole table is never counted
(``show_full_result_count = False``) and the rows shown are counted up to ``COUNT_CAP``:
beyond it the list says "1,000+" and offers the pages up to there (narrow it with a filter
or a search to go further back).
"""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

COUNT_CAP = 1_000


class AtLeast(int):
    """A count known only to pass the cap: as a number it is one more than the cap (the
    paginator offers the pages up to the cap); in the admin's templates (its paginator,
    "Select all … runs", "All … selected") it reads "1,000+"."""

    def __str__(self) -> str:
        return f"{COUNT_CAP:,}+"


class CappedPaginator(Paginator):
    """Counts at most ``COUNT_CAP + 1`` rows: SELECT count(*) FROM (… LIMIT 1001)."""

    @cached_property
    def count(self) -> int:
        window = self.object_list[: COUNT_CAP + 1]
        counted = window.count() if isinstance(window, QuerySet) else len(window)
        return AtLeast(counted) if counted > COUNT_CAP else int(counted)
