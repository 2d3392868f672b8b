"""The door for erasing a person from an app's own tables (docs/how-to/erase-a-person.md). Register
an eraser from ``AppConfig.ready()``::

    from workflows.plugins.erasure import Column, Erasing, register_eraser, scrub_rows

    def erase(cursor, erasing: Erasing) -> dict[str, int]:
        counts = scrub_rows(cursor, erasing.matcher, table="myapp_thing",
                            columns=["payload", "note"], where=sql.THINGS_OF_RUNS,
                            params=erasing.params())
        if erasing.org_wide:
            ...  # the organisation's rows tied to no run
        return counts

    register_eraser("myapp", erase)

An erasure calls every eraser in its one transaction, after it locked the person's runs and
cancelled (or handed back) their live steps. An eraser removes every value the matcher
recognises from every text and JSON column of its rows: ``scrub_rows`` does it for the rows
an app's own SQL condition selects (``%(org)s``, ``%(runs)s``), replacing each text or JSON
string that holds a value with ``MARKER``. It returns the rows it changed per
``table.column``; it must not commit, and must not wait long for a row (the erasure runs
under a lock timeout, and is then refused whole).

With ``org_wide`` the matcher is strict (``Matcher(strict=True)``: whole values only, as
another person's rows need); pass ``erasing.matcher`` and ``erasing.widen`` through, never
a matcher of your own. A table of yours with ``org_id`` and ``run_id`` columns is searched
for runs that mention the person without being named (its rows are then scrubbed through
``erasing.run_ids``): scrub every text and JSON column of it that can hold outside text.

``canonical_email`` (an address as the suppression list keeps it) and ``keyed_hash`` (what
is kept instead of a value that must still be recognised) are shared with the consent check.
"""

from __future__ import annotations

from ..services.erasure.registry import ERASERS, Eraser, Erasing
from ..services.erasure.scrub import (
    MARKER,
    Column,
    Counts,
    Matcher,
    add_counts,
    scrub_json,
    scrub_rows,
    scrub_text,
)
from ..services.erasure.subject import NotOneAddress, canonical_email, keyed_hash

__all__ = [
    "MARKER",
    "Column",
    "Counts",
    "Eraser",
    "Erasing",
    "Matcher",
    "NotOneAddress",
    "add_counts",
    "canonical_email",
    "keyed_hash",
    "register_eraser",
    "scrub_json",
    "scrub_rows",
    "scrub_text",
]


def register_eraser(name: str, eraser: Eraser) -> None:
    """Have every erasure call ``eraser(cursor, erasing)`` for your app's rows. Name it by
    your app; the same name again replaces it."""
    ERASERS[name] = eraser
