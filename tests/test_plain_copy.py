"""What a workflow's code is handed (rendering.plain_copy) is exactly what a JSON round trip
of the value gives back, shares nothing with the value, and is quick only where it can be:
drawn values, JSON's own and otherwise (tuples, keys that are not strings, dates)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from workflows.definitions.rendering import plain_copy


def round_trip(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: v.isoformat()))


leaves = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
    | st.dates() | st.datetimes()
)  # fmt: skip
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        | st.dictionaries(st.integers(), inner, max_size=3)
    ),
    max_leaves=20,
)


@given(values)
def test_a_copy_is_what_a_json_round_trip_gives_back(value: Any) -> None:
    copied = plain_copy(value)
    assert copied == round_trip(value)
    assert json.dumps(copied) == json.dumps(round_trip(value))  # the same types, in order


@given(st.dictionaries(st.text(max_size=4), st.lists(st.integers(), max_size=3), max_size=4))
def test_a_copy_shares_nothing_with_the_value(value: dict[str, list[int]]) -> None:
    before = json.dumps(value)
    copied = plain_copy(value)
    for items in copied.values():
        items.append(0)
    copied["~new"] = [1]
    assert json.dumps(value) == before


def test_dates_read_as_they_are_stored() -> None:
    assert plain_copy({"on": date(2026, 1, 2), "at": [datetime(2026, 1, 2, 3, 4, tzinfo=UTC)]}) == {
        "on": "2026-01-02", "at": ["2026-01-02T03:04:00+00:00"],
    }  # fmt: skip
