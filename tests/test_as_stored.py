"""``storable.as_stored`` gives back exactly what PostgreSQL's ``jsonb`` does: a code run's
replay meets a step's output either as its executor made it (the turn right after it, in
the same settle: workflows/code/history.py) or as read from the database (every later turn),
and the code must meet the same value both ways (same keys in the same order, same types).
Drawn values, against the real server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workflows.definitions.storable import as_stored

pytestmark = pytest.mark.django_db

TEXT = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")  # storable text
keys = st.text(TEXT, max_size=4)
leaves = (
    st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e16, 1.5e16, -0.0, 1e-7, 100.0, 1e300, 5e-324, 2.5e-5, 123456789.125])
    | st.text(TEXT, max_size=5)
)  # fmt: skip
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(keys, inner, max_size=5)
        | st.dictionaries(st.integers(min_value=-99, max_value=99), inner, max_size=3)
    ),
    max_leaves=20,
)


def from_jsonb(value: Any) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb::text", [json.dumps(value)])
        return json.loads(cursor.fetchone()[0])


def typed(value: Any) -> str:
    """The value with each number's type: 1 and 1.0 (and their keys' order) told apart."""
    return json.dumps(value, default=str, sort_keys=False) + repr(_types(value))


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return [(key, _types(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_types(item) for item in value]
    return type(value).__name__


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(values)
def test_a_value_is_what_jsonb_gives_back(value: Any) -> None:
    assert typed(as_stored(value)) == typed(from_jsonb(value))


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ({"bb": 1, "a": 2}, {"a": 2, "bb": 1}),  # jsonb: shorter keys first
        ({"é": 1, "zz": 2, "b": 3}, {"b": 3, "zz": 2, "é": 1}),  # then by UTF-8 bytes
        ([1e16, 1.5e16, -0.0, 1e-07, 100.0], [10**16, 15 * 10**15, 0.0, 1e-07, 100.0]),
        ((1, {2: "x"}), [1, {"2": "x"}]),
        ("text", "text"),
        (None, None),
    ],
)
def test_the_forms_jsonb_changes(value: Any, stored: Any) -> None:
    assert typed(as_stored(value)) == typed(stored) == typed(from_jsonb(value))
