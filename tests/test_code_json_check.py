"""What a code workflow's call or result may hold (context.check_json): the quick walk that
passes plain JSON without writing it out accepts only what the full check (a JSON dump and
PostgreSQL's storability) accepts, on drawn values of every kind, and passes JSON's own; a
call's check remembered answers as checking it anew; the quick look at a stored value's size
refuses exactly what the exact check refuses."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from hypothesis import assume, example, given
from hypothesis import strategies as st

from workflows.code import context
from workflows.code.context import (
    CodeFailure,
    _plain_json,
    check_json,
    check_stored_size,
    within_stored_limits,
)
from workflows.definitions.registry import StepReport, registry
from workflows.definitions.storable import unstorable_path
from workflows.services.runs import MAX_INPUT_DEPTH

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
        # Keys that JSON writes the same: 1 and "1", True and "true", None and "null".
        | st.dictionaries(
            st.sampled_from([1, "1", True, "true", None, "null", 1.5, "1.5"]), inner, max_size=3
        )
    ),
    max_leaves=20,
)


def full_check_passes(value: Any) -> bool:
    """A JSON dump, PostgreSQL's storability, and no value lost: the JSON read back holds
    as many keys as the value (json.dumps writes 1 and "1" both as "1")."""
    try:
        written = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return unstorable_path(value) is None and _keys(json.loads(written)) == _keys(value)


def _keys(value: Any) -> int:
    if isinstance(value, dict):
        return len(value) + sum(_keys(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(_keys(item) for item in value)
    return 0


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


# --- a call's check, remembered (context._checked_step) -------------------------------------

# Calls of a few real step types with scalar fields, valid and not: ids that are and are
# not step ids, fields a type has and has not, values that are and are not what it takes.
calls = st.tuples(
    st.sampled_from(["s1", "s2", "Bad-id", "decide"]),
    st.sampled_from(["noop", "wait", "wait_signal", "http", "no_such_type", "parallel"]),
    st.dictionaries(
        st.sampled_from(["output", "duration", "signal", "timeout", "next", "zone", "x"]),
        st.none() | st.booleans() | st.sampled_from([0, 1, 2, "1h", "0s", "paid", "", "x" * 70]),
        max_size=3,
    ),
)


def checked(check: Any, call: tuple[Any, ...]) -> str:
    """The answer as JSON (True and 1 compare equal in Python, not in a stored step)."""
    try:
        return json.dumps(check(*call), sort_keys=True)
    except CodeFailure as refused:
        return f"refused: {refused}"


@given(st.lists(calls, min_size=1, max_size=12))
@example([("s1", "noop", {"output": True}), ("s1", "noop", {"output": 1})])
@example([("s1", "wait", {"duration": "1h"}), ("s1", "wait", {"duration": "x" * 70})])
def test_a_remembered_check_answers_as_the_check_itself(sequence: list[Any]) -> None:
    """The same answer as checking anew, for every call of any sequence: a valid call is
    remembered by its id, type and fields (True and 1 are different fields), a refused one
    is refused again."""
    context._checked_calls.clear()
    for call in sequence:
        assert checked(context._checked_step, call) == checked(context._checked_anew, call)


def test_a_call_is_checked_again_against_a_type_registered_again() -> None:
    context._checked_calls.clear()
    assert context._checked_step("s1", "noop", {"output": "x"})["output"] == "x"
    original = registry.get("noop")
    assert original is not None

    def stricter(step: Any, report: StepReport) -> None:
        report.issue("no_output", "output", "is not allowed here")

    registry._types["noop"] = replace(original, validate=stricter)
    try:
        with pytest.raises(CodeFailure, match="no_output"):
            context._checked_step("s1", "noop", {"output": "x"})
    finally:
        registry._types["noop"] = original


def test_a_remembered_call_is_handed_out_as_a_copy() -> None:
    context._checked_calls.clear()
    first = context._checked_step("s1", "noop", {})
    first["output"] = "changed by its caller"
    assert context._checked_step("s1", "noop", {}) == {"id": "s1", "type": "noop"}


# --- the quick look at a stored value's size (context.within_stored_limits) ----------------

small = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12)
    | st.text(alphabet="é€😀", max_size=6),
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=3), inner, max_size=5),
    max_leaves=30,
)  # fmt: skip


@pytest.mark.parametrize("limit", [16, 64, 200])
@given(value=small)
def test_the_quick_size_look_refuses_exactly_what_the_exact_check_refuses(
    limit: int, value: Any
) -> None:
    """Against a small byte limit and the nesting limit: non-ASCII text (longer as stored
    UTF-8 than as characters, shorter than json.dumps's escapes), deep lists. (Of values
    check_json passes, as every caller's are.)"""
    assume(_plain_json(value))
    with override_settings(WAYMARK={**settings.WAYMARK, "MAX_INPUT_BYTES": limit}):
        exact = checked(lambda: check_stored_size("v", value, "too_large", "It"), ())
        quick = checked(lambda: within_stored_limits("v", value, "too_large", "It"), ())
    assert quick == exact


def test_the_quick_size_look_refuses_a_value_nested_too_deep() -> None:
    deep: Any = "x"
    for _ in range(MAX_INPUT_DEPTH + 1):
        deep = [deep]
    with pytest.raises(CodeFailure, match="too_large"):
        within_stored_limits("v", deep, "too_large", "It")
