"""Which runs are the person's, which runs of others hold one of their values, and which
values of theirs are to be removed.

A run is the person's (*owned*) when:
- its definition declares ``personal_data.identifiers`` and the value at one of them is the
  person's (the email address compared as a mailbox, a phone number by its digits, an
  identifier exactly), or
- it declares none, and a value anywhere in its input is their email address or phone
  number (compared the same way: exactly, never as a part of a longer value; an identifier
  is one only where a definition declares it).
An identifier value found in a run owned by the value asked for is the person's too: runs
that carry it are looked for in turn (a request by email finds the runs keyed by the
customer id its runs declare). A run owned only through such a found value (an account id
two people share) gives none of its own: its other identifiers may be someone else's.

A run that is not the person's but holds one of their identifying values *mentions* them: it
keeps running, and only those values are removed from it. It is found through any of its
rows: the run's own columns, and every text and JSON column of every table whose rows belong
to a run (``run_id``): its steps, history, signals, effects (what a provider answered about
someone else), approvals, timers, webhook deliveries, and any app's table of the same shape.
There the values are recognised whole (``Matcher(strict=True)``; subject.py).

Candidates are read a table at a time, the organisation's rows only, in batches, filtered in
SQL by ILIKE (a superset), then decided here: an erasure is rare, and a value may be anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...definitions.personal_data import Declaration, declaration_of, value_at
from ...engine.definition_cache import definition_for
from ...engine.sql import erasure as sql
from ...engine.sql.rows import fetch_dicts
from ...errors import IdentifierNotDeclared
from .scrub import Matcher, Value, rows_holding
from .subject import (
    MIN_IDENTIFIER_CHARS,
    MIN_VALUE_CHARS,
    NotOneAddress,
    Subject,
    canonical_email,
    looks_like_phone,
    phone_digits,
)

MAX_ROUNDS = 5  # identifier values found lead to more runs; a person's are found in one or two


@dataclass
class Found:
    owned: dict[int, dict[str, Any]] = field(default_factory=dict)  # run id -> its row
    mentioning: dict[int, dict[str, Any]] = field(default_factory=dict)
    identifying: set[Value] = field(default_factory=set)  # found anywhere: searched org-wide
    personal: set[Value] = field(default_factory=set)  # the fields: removed from owned runs
    declarations: dict[int, Declaration | None] = field(default_factory=dict)  # by version


def find_person(cursor: Any, org_id: int, subject: Subject) -> Found:
    """The person's runs, the runs that mention them, and their values. An identifier is
    refused (IdentifierNotDeclared) in an organisation none of whose definitions declares
    ``personal_data.identifiers``: nothing there says which values are identifiers."""
    if subject.kind == "identifier":
        cursor.execute(sql.ORG_DECLARES_IDENTIFIERS, {"org": org_id})
        if not cursor.fetchone()[0]:
            raise IdentifierNotDeclared()
    given = {Value(subject.kind, subject.value)}
    found = Found(identifying=set(given))
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
                # Only a run that is theirs by the value asked for names more of their
                # identifiers: one that is theirs by a value found (an account two people
                # share) may name someone else's, whose other runs are not theirs.
                _collect(found, row, declaration,
                         identifiers=_owned(row, declaration, given))  # fmt: skip
            else:
                found.mentioning[row["id"]] = row
    # A run found as mentioning the first values may hold none of them, whole, once all are
    # known: keep those that hold one.
    whole = Matcher(found.identifying, strict=True)
    found.mentioning = {
        run_id: row for run_id, row in found.mentioning.items()
        if run_id not in found.owned and _mentions(row, whole)
    }  # fmt: skip
    for run_id in _mentioning_elsewhere(cursor, org_id, whole):
        if run_id not in found.owned:
            found.mentioning.setdefault(run_id, {"id": run_id})
    return found


def _mentioning_elsewhere(cursor: Any, org_id: int, whole: Matcher) -> set[int]:
    """The runs of the organisation with a row, in any table whose rows belong to a run, in
    which a text or JSON column holds one of the values (whole)."""
    cursor.execute(sql.RUN_TIED_TEXT_COLUMNS)
    tables = fetch_dicts(cursor)
    run_ids: set[int] = set()
    for table in tables:
        for row in rows_holding(cursor, whole, table=table["table_name"],
                                columns=list(table["columns"]), where=sql.OF_ORG_WITH_RUN,
                                params={"org": org_id}, extra="run_id"):  # fmt: skip
            run_ids.add(row["run_id"])
    if not run_ids:
        return run_ids
    cursor.execute(sql.RUNS_OF_ORG, {"org": org_id, "runs": sorted(run_ids)})
    return {row["id"] for row in fetch_dicts(cursor)}


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
    if declaration is not None and declaration.identifiers:
        held = [item for path in declaration.identifiers
                for item in _leaves(value_at({"input": row["input"]}, path))]  # fmt: skip
        return any(_same(item, value) for item in held for value in values)
    # Declared nowhere in this run's definition: an identifier is not one here, and a JSON
    # number is an id or a count (an order number with a phone number's digits), not theirs.
    addresses = [value for value in values if value.kind in ("email", "phone")]
    texts = [item for item in _leaves(row["input"]) if isinstance(item, str)]
    return any(_same(item, value) for item in texts for value in addresses)


def _same(item: Any, value: Value) -> bool:
    """Is this stored value the person's ``value``: exactly, by the rules of its kind (a
    phone number written as one: an id with letters and the same digits is not)?"""
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
        return len(text) <= 40 and looks_like_phone(text) and phone_digits(text) == value.text
    return text == value.text


def _collect(
    found: Found, row: Mapping[str, Any], declaration: Declaration | None, *, identifiers: bool
) -> None:
    """The values an owned run's declaration names: identifiers (searched for in turn, when
    ``identifiers``) and fields (removed from its rows)."""
    if declaration is None:
        return
    data = {"input": row["input"], "vars": row["vars"], "outputs": row["outputs"]}
    for path in declaration.identifiers if identifiers else ():
        for item in _scalars(value_at(data, path)):
            value = _as_value(item, "identifier")
            if value.kind == "identifier" and len(value.text) < MIN_IDENTIFIER_CHARS:
                found.personal.add(value)  # too short to look for in others' rows
            else:
                found.identifying.add(value)
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


def _mentions(row: Mapping[str, Any], matcher: Matcher) -> bool:
    texts = (row["start_key"], row["error"] or "")
    documents = (row[name] for name in ("input", "vars", "outputs", "output"))
    return any(matcher.holds(text) for text in texts) or any(
        matcher.found_in(document) for document in documents
    )
