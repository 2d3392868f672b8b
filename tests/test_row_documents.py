"""The engine's row documents (workflows/engine/sql/rows.py dumps_cells: a hop's, a start's, a
batch of wakes'): written by orjson for speed, they hold exactly the JSON values json.dumps
wrote, cells that are not JSON (now(), now() plus seconds, a JSON cell) as json_rows says, and
what orjson refuses is written by json or refused with json's own error."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from workflows.engine.sql.rows import NOW, NowPlus, _cell, dumps_cells
from workflows.states import StepStatus

_STDLIB = json.JSONEncoder(default=_cell)

scalars = (
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.just(NOW) | st.builds(NowPlus, st.floats(0, 1e6)) | st.sampled_from(list(StepStatus))
)  # fmt: skip
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        | st.dictionaries(st.integers(), inner, max_size=2)
        | st.builds(Jsonb, inner)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(documents)
def test_a_document_holds_the_json_values_json_dumps_wrote(document: Any) -> None:
    assert json.loads(dumps_cells(document)) == json.loads(_STDLIB.encode(document))


def test_what_orjson_refuses_json_writes_or_refuses_as_before() -> None:
    big = {"n": 2**80, "rows": [{"cell": NOW}]}  # past orjson's 64 bits
    assert json.loads(dumps_cells(big)) == {"n": 2**80, "rows": [{"cell": 0}]}
    with pytest.raises(TypeError, match="datetime is not JSON serializable"):
        dumps_cells({"at": datetime(2026, 1, 1, tzinfo=UTC)})  # never written as a string
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        dumps_cells({"ids": {1, 2}})
