"""Which runs are the person's, and which values of theirs are to be removed.

A run is the person's (*owned*) when:
- its definition declares ``personal_data.identifiers`` and the value at one of them is the
  person's (the email address compared as a mailbox, a phone number by its digits, an
  identifier exactly), or
- it declares none, and a value anywhere in its input is (compared the same way: exactly,
  never as a part of a longer value).
An identifier value found in an owned run is the person's too: runs that carry it are looked
for in turn (a request by email finds the runs keyed by the customer id its runs declare).

A run that is not the person's but holds one of these values somewhere in its own columns
(another customer's run that names them as a referrer) *mentions* them: it keeps running,
and only those values are removed from it.

Candidates are read in one pass over the organisation's runs (their text columns, filtered
in SQL by ILIKE: a superset), then decided here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...definitions.personal_data import Declaration, declaration_of, value_at
from ...engine.definition_cache import definition_for
from ...engine.sql import erasure as sql
from ...engine.sql.rows import fetch_dicts
from .scrub import Matcher, Value
from .subject import MIN_VALUE_CHARS, NotOneAddress, Subject, canonical_email, phone_digits

MAX_ROUNDS = 5  # identifier values found lead to more runs; a person's are found in one or two


@dataclass
class Found:
    owned: dict[int, dict[str, Any]] = field(default_factory=dict)  # run id -> its row
    mentioning: dict[int, dict[str, Any]] = field(default_factory=dict)
    identifying: set[Value] = field(default_factory=set)  # found anywhere: searched org-wide
    personal: set[Value] = field(default_factory=set)  # the fields: removed from owned runs
    declarations: dict[int, Declaration | None] = field(default_factory=dict)  # by version


def find_person(cursor: Any, org_id: int, subject: Subject) -> Found:
    found = Found(identifying={Value(subject.kind, subject.value)})
    searched: set[Value] = set()
    for _ in range(MAX_ROUNDS):
        fresh = found.identifying - searched
        if not fresh:
            break
        searched |= fresh
        for row in _candidates(cursor, org_id, Matcher(fresh)):
            if row["id"] in found.owned:
                continue
            declaration = _declaration(found, row["version_id"])
            if _owned(row, declaration, found.identifying):
                found.mentioning.pop(row["id"], None)
                found.owned[row["id"]] = row
                _collect(found, row, declaration)
            else:
                found.mentioning[row["id"]] = row
    # A run found as mentioning the first values may hold none of them once all are known:
    # keep those that hold one.
    matcher = Matcher(found.identifying)
    found.mentioning = {
        run_id: row for run_id, row in found.mentioning.items()
        if run_id not in found.owned and any(matcher.holds(text) for text in _texts(row))
    }  # fmt: skip
    return found


def _candidates(cursor: Any, org_id: int, matcher: Matcher) -> list[dict[str, Any]]:
    statement = sql.person_candidates(phones=bool(matcher.phone_digits()))
    cursor.execute(statement, {"org": org_id, "erasure_like": matcher.like_patterns(),
                               "erasure_digits": matcher.phone_digits()})  # fmt: skip
    rows = fetch_dicts(cursor)
    for row in rows:
        for name in ("input", "vars", "outputs", "output"):
            row[name] = json.loads(row[name]) if row[name] is not None else None
    return rows


def _declaration(found: Found, version_id: int) -> Declaration | None:
    if version_id not in found.declarations:
        found.declarations[version_id] = declaration_of(definition_for(version_id))
    return found.declarations[version_id]


def _owned(row: Mapping[str, Any], declaration: Declaration | None, values: set[Value]) -> bool:
    held: Iterable[Any]
    if declaration is not None and declaration.identifiers:
        held = (value_at({"input": row["input"]}, path) for path in declaration.identifiers)
    else:
        held = _leaves(row["input"])
    return any(_same(item, value) for item in held for value in values)


def _same(item: Any, value: Value) -> bool:
    """Is this stored value the person's ``value``: exactly, by the rules of its kind?"""
    if isinstance(item, bool) or not isinstance(item, str | int | float):
        return False
    text = str(item).strip()
    if value.kind == "email":
        if "@" not in text:
            return False
        try:
            return canonical_email(text) == value.text
        except NotOneAddress:
            return False
    if value.kind == "phone":
        return phone_digits(text) == value.text and len(text) <= 40
    return text == value.text


def _collect(found: Found, row: Mapping[str, Any], declaration: Declaration | None) -> None:
    """The values an owned run's declaration names: identifiers (searched for in turn) and
    fields (removed from its rows)."""
    if declaration is None:
        return
    data = {"input": row["input"], "vars": row["vars"], "outputs": row["outputs"]}
    for path in declaration.identifiers:
        for item in _scalars(value_at(data, path)):
            found.identifying.add(_as_value(item, "identifier"))
    for path in declaration.fields:
        for item in _scalars(value_at(data, path)):
            found.personal.add(_as_value(item, "field"))


def _as_value(item: Any, default_kind: str) -> Value:
    text = str(item).strip()
    if "@" in text:
        try:
            return Value("email", canonical_email(text))
        except NotOneAddress:
            pass
    return Value(default_kind, text)


def _scalars(value: Any) -> Iterator[Any]:
    """The strings and numbers of a value (a list of addresses gives each), long enough to
    be searched for."""
    for item in _leaves(value):
        scalar = not isinstance(item, bool) and isinstance(item, str | int | float)
        if scalar and len(str(item).strip()) >= MIN_VALUE_CHARS:
            yield item


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _texts(row: Mapping[str, Any]) -> Iterable[str]:
    yield row["start_key"]
    yield row["error"] or ""
    for name in ("input", "vars", "outputs", "output"):
        yield json.dumps(row[name], ensure_ascii=False)
