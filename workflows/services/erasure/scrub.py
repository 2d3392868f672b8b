"""Removing a person's values from stored text and JSON: what every app's eraser uses.

A ``Matcher`` recognises the values (``subject.value_pattern``: no partial address, no
longer number). ``scrub_text`` replaces a whole text that holds one with ``MARKER``;
``scrub_json`` does the same for every string in a JSON document, at any depth, for object
keys too (a renamed key that would clash gets a number), and for a number whose digits are a
value. ``scrub_rows`` applies them to the columns of an app's table: it selects the rows its
``where`` names whose columns hold a candidate (ILIKE, a superset), scrubs them in Python and
writes back only what changed, counting the rows per column.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...engine.sql.rows import fetch_dicts
from .subject import MIN_IDENTIFIER_CHARS, like_patterns, phone_digits, value_pattern

MARKER = "[erased]"


@dataclass(frozen=True)
class Value:
    """One value to remove: its kind (email, phone, identifier, field) and text."""

    kind: str
    text: str


class Matcher:
    """Recognises any of ``values`` inside a text, a JSON number or an object key.

    ``strict``: the rows are not the person's own (another person's run, a row of the
    organisation tied to no run of theirs), so a value is recognised only whole: an email
    address as an address, a phone number as a token of its own, an identifier as the whole
    text, no number (``subject.py`` says exactly). Otherwise contained, as in their own rows.
    """

    def __init__(
        self, values: Iterable[Value], *, strict: bool = False, numbers: bool | None = None
    ) -> None:
        """``numbers``: whether a JSON number can be one of the values (by default, when not
        ``strict``: in the person's own rows only)."""
        self.values = tuple(sorted(set(values), key=lambda v: (v.kind, v.text)))
        self.strict = strict
        found = [value_pattern(v.kind, v.text, strict=strict) for v in self.values]
        patterns = [p for p in found if p is not None]
        self._regex = re.compile("|".join(patterns), re.IGNORECASE) if patterns else None
        self._whole = {v.text for v, p in zip(self.values, found, strict=True) if p is None}
        self._numbers = set() if not (numbers if numbers is not None else not strict) else {
            phone_digits(v.text) if v.kind == "phone" else v.text.lower()
            for v in self.values
            if v.kind != "email" and len(v.text) >= MIN_IDENTIFIER_CHARS
        }  # fmt: skip

    def __bool__(self) -> bool:
        return bool(self.values)

    def holds(self, text: str) -> bool:
        if text in self._whole:
            return True
        return self._regex is not None and self._regex.search(text) is not None

    def holds_number(self, number: int | float) -> bool:
        return str(number).lower() in self._numbers

    def found_in(self, value: Any) -> bool:
        """Does this JSON value hold one of the values anywhere (a string, a key, a number)?"""
        return scrub_json(value, self) is not value

    def like_patterns(self) -> list[str]:
        """ILIKE patterns for a column's text: every row that holds a value matches one."""
        return like_patterns(v.text for v in self.values if v.kind != "phone")

    def phone_digits(self) -> list[str]:
        """The phone numbers' digits: a row holds one only if its digits contain them."""
        return sorted({"%" + phone_digits(v.text) + "%" for v in self.values if v.kind == "phone"})


def scrub_text(text: str, matcher: Matcher) -> str:
    return MARKER if matcher.holds(text) else text


def scrub_json(value: Any, matcher: Matcher) -> Any:
    """``value`` with every string (or key) that holds a value replaced by ``MARKER`` and
    every number that is one replaced too; the same object when nothing changed."""
    if isinstance(value, str):
        return scrub_text(value, matcher)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return MARKER if matcher.holds_number(value) else value
    if isinstance(value, list):
        items = [scrub_json(item, matcher) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, dict):
        return _scrub_object(value, matcher)
    return value


def _scrub_object(value: dict[str, Any], matcher: Matcher) -> dict[str, Any]:
    changed = False
    result: dict[str, Any] = {}
    for key, item in value.items():
        new_item = scrub_json(item, matcher)
        new_key = key
        if matcher.holds(key):
            new_key, n = MARKER, 2
            while new_key in result or (new_key in value and new_key != key):
                new_key, n = f"{MARKER} {n}", n + 1
        changed = changed or new_key != key or new_item is not item
        result[new_key] = new_item
    return result if changed else value


# --- tables -----------------------------------------------------------------------------------

JSON_TYPES = ("json", "jsonb")
TEXT_TYPES = ("text", "character varying")
ARRAY_TYPE = "ARRAY"

Counts = dict[str, int]


@dataclass(frozen=True)
class Column:
    """A column to scrub. ``replace``: for a text column whose value must stay unique (a start
    key, a signal's identity), what a scrubbed row gets instead of ``MARKER``, from its row."""

    name: str
    replace: Callable[[Mapping[str, Any]], str] | None = field(default=None, compare=False)
    # A JSON object column's top-level keys that are the engine's own bookkeeping, never a
    # person's data: left as they are (a number in them is a row id, not an identifier).
    engine_key: Callable[[str], bool] | None = field(default=None, compare=False)


BATCH_ROWS = 500  # candidate rows read (and locked) at a time


def scrub_rows(
    cursor: Any,
    matcher: Matcher,
    *,
    table: str,
    columns: Sequence[Column | str],
    where: str,
    params: Mapping[str, Any],
    widen: Matcher | None = None,
) -> Counts:
    """Scrub ``columns`` of the rows of ``table`` (an app's own, with an ``id`` key) that
    ``where`` selects (an SQL condition of the app's own, over ``params``), locking each row
    changed. ``widen``: a row in which ``matcher`` finds a value is the person's, and loses
    every value ``widen`` knows (their name too). Returns the rows changed per
    ``table.column`` (only those that changed)."""
    counts: Counts = {}
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    batches = _candidates(cursor, matcher, table, cols, where, params, lock=True)
    for rows, types in batches:
        for row in rows:
            changes = _changes(row, cols, types, matcher)
            if changes and widen is not None:
                changes = _changes(row, cols, types, widen)  # theirs: all their values go
            if changes:
                _write(cursor, table, row["id"], changes, types)
                for name in changes:
                    key = f"{table}.{name}"
                    counts[key] = counts.get(key, 0) + 1
    return counts


def rows_holding(
    cursor: Any,
    matcher: Matcher,
    *,
    table: str,
    columns: Sequence[str],
    where: str,
    params: Mapping[str, Any],
    extra: str = "",
) -> Iterator[dict[str, Any]]:
    """The rows of ``table`` that ``where`` selects in which ``matcher`` finds a value in one
    of ``columns`` (read as scrub_rows reads them; nothing locked or changed). ``extra``: one
    more column to read (a run's id)."""
    cols = [Column(name) for name in columns]
    for rows, types in _candidates(cursor, matcher, table, cols, where, params, extra=extra):
        yield from (row for row in rows if _changes(row, cols, types, matcher))


def _candidates(
    cursor: Any,
    matcher: Matcher,
    table: str,
    cols: Sequence[Column],
    where: str,
    params: Mapping[str, Any],
    *,
    lock: bool = False,
    extra: str = "",
) -> Iterator[tuple[list[dict[str, Any]], dict[str, str]]]:
    """The rows ``where`` selects whose columns may hold a value, in batches of BATCH_ROWS
    (with the columns' types). First the candidates' ids, in one pass over the ``where``'s
    rows (an organisation's: by its index, ILIKE on each row's text, a superset the matcher
    narrows), then their columns a batch at a time (locked, with ``lock``): never a large
    table's rows in memory at once, never a walk over other organisations' rows in id order."""
    if not matcher:
        return
    types = _column_types(cursor, table, [c.name for c in cols])
    phones = bool(matcher.phone_digits())
    candidate = " OR ".join(_candidate(c.name, phones=phones) for c in cols)
    cursor.execute(
        f"SELECT id FROM {table} WHERE ({where}) AND ({candidate}) ORDER BY id",  # noqa: S608
        {**params, "erasure_like": matcher.like_patterns(),
         "erasure_digits": matcher.phone_digits()},
    )  # fmt: skip
    ids = [row[0] for row in cursor.fetchall()]
    selected = ", ".join([_selected(c.name, types[c.name]) for c in cols] + [extra][: bool(extra)])
    statement = (
        f"SELECT id, {selected} FROM {table}"  # noqa: S608
        f" WHERE ({where}) AND id = ANY(%(erasure_ids)s) ORDER BY id"
        + (" FOR UPDATE" if lock else "")
    )
    for at in range(0, len(ids), BATCH_ROWS):
        cursor.execute(statement, {**params, "erasure_ids": ids[at : at + BATCH_ROWS]})
        yield fetch_dicts(cursor), types


def _changes(
    row: Mapping[str, Any], cols: Sequence[Column], types: Mapping[str, str], matcher: Matcher
) -> dict[str, Any]:
    changes = {}
    for col in cols:
        new = _scrubbed(row, col, types[col.name], matcher)
        if new is not _SAME:
            changes[col.name] = new
    return changes


def _write(
    cursor: Any, table: str, row_id: int, changes: Mapping[str, Any], types: Mapping[str, str]
) -> None:
    assignments = ", ".join(
        f"{name} = %({name})s::jsonb" if types[name] in JSON_TYPES else f"{name} = %({name})s"
        for name in changes
    )
    cursor.execute(
        f"UPDATE {table} SET {assignments} WHERE id = %(id)s",  # noqa: S608
        {**changes, "id": row_id},
    )


_SAME = object()


def _scrubbed(row: Mapping[str, Any], col: Column, kind: str, matcher: Matcher) -> Any:
    value = row[col.name]
    if value is None:
        return _SAME
    if kind in JSON_TYPES:
        document = json.loads(value)
        if col.engine_key is not None and isinstance(document, dict):
            own = {key: item for key, item in document.items() if col.engine_key(key)}
            rest = {key: item for key, item in document.items() if key not in own}
            scrubbed = scrub_json(rest, matcher)
            new = document if scrubbed is rest else {**scrubbed, **own}
        else:
            new = scrub_json(document, matcher)
        return _SAME if new is document else json.dumps(new, ensure_ascii=False)
    if kind == ARRAY_TYPE:
        items = [scrub_text(item, matcher) if isinstance(item, str) else item for item in value]
        return _SAME if items == value else items
    if not matcher.holds(value):
        return _SAME
    return col.replace(row) if col.replace is not None else MARKER


def _selected(name: str, kind: str) -> str:
    return f"{name}::text AS {name}" if kind in JSON_TYPES else name


def _candidate(name: str, *, phones: bool) -> str:
    """True for a row whose column may hold a value: a superset the matcher narrows (a phone
    number's digits, written with any separators, are found among the text's digits)."""
    found = f"{name}::text ILIKE ANY(%(erasure_like)s)"
    if phones:
        found += f" OR regexp_replace({name}::text, '[^0-9]', '', 'g') LIKE ANY(%(erasure_digits)s)"
    return f"({found})"


def _column_types(cursor: Any, table: str, names: list[str]) -> dict[str, str]:
    cursor.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %(table)s"
        " AND column_name = ANY(%(names)s)",
        {"table": table, "names": names},
    )
    types = {row["column_name"]: row["data_type"] for row in fetch_dicts(cursor)}
    missing = sorted(set(names) - set(types))
    if missing:
        raise LookupError(f"{table} has no column(s) {', '.join(missing)}")
    for name, kind in types.items():
        if kind not in (*JSON_TYPES, *TEXT_TYPES, ARRAY_TYPE):
            raise TypeError(f"{table}.{name} is {kind}: only text, JSON and text arrays scrub")
    return types


def add_counts(total: Counts, more: Mapping[str, int]) -> Counts:
    for key, n in more.items():
        total[key] = total.get(key, 0) + n
    return total
