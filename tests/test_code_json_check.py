"""What a code workflow's call or result may hold (context.check_json): the quick walk that
passes plain JSON without writing it out accepts only what the full check (a JSON dump and
PostgreSQL's storability) accepts, on drawn values of every kind, and passes JSON's own."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from workflows.code.context import CodeFailure, _plain_json, check_json
from workflows.definitions.storable import unstorable_path

leaves = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
    | st.sampled_from(["\x00", "a\ud800", math.inf, -math.inf, math.nan, b"x", object()])
)  # fmt: skip
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4) | st.sampled_from(["\x00k"]), inner, max_size=4)
        | st.dictionaries(st.integers(), inner, max_size=3)
    ),
    max_leaves=20,
)


def full_check_passes(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return unstorable_path(value) is None


@given(values)
def test_the_quick_walk_passes_only_what_the_full_check_passes(value: Any) -> None:
    if _plain_json(value):
        assert full_check_passes(value)
    try:
        check_json("s", value)
    except CodeFailure:
        assert not full_check_passes(value)
    else:
        assert full_check_passes(value)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5)
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                    max_leaves=20))  # fmt: skip
def test_plain_json_takes_the_quick_walk(value: Any) -> None:
    assert _plain_json(value) == (unstorable_path(value) is None)
