"""Every step type followed by every other, on the real engine (`runengine --no-web` as
processes), started through the API, with effects against the local stubs and signals,
approvals and tasks answered through the API: each run ends as its definition says (status,
output, the steps it entered), each effect reaches its stub once per pass, no step or run
error, no traceback or `engine_error` in the engine's log (issue 26).

An io step followed by `wait` or `wait_until` failed its run after the effect went out
(the speculative walk of a settle entered the wait outside the walk's transaction); this is
the end-to-end proof that every pair composes. tests/composition.py builds the definitions.
"""

from __future__ import annotations

import pytest

from .composition import KINDS, Plan, loop, pair, run_plans
from .engine_harness import Harness

pytestmark = pytest.mark.django_db(transaction=True)

FIRST = [kind for kind in KINDS if kind != "end"]  # nothing follows an end


def report(found: dict[str, list[str]]) -> str:
    lines = [f"{len(found)} composition(s) did not do what their definition says:"]
    lines += [f"  {name}: {'; '.join(wrong)}" for name, wrong in sorted(found.items())]
    return "\n".join(lines)


def test_every_step_type_followed_by_every_other(harness: Harness) -> None:
    plans: list[Plan] = [pair(a, b) for a in FIRST for b in KINDS]
    assert len(plans) == 16 * 17  # wait_signal twice: answered, and left to time out

    found = run_plans(harness, plans)

    assert not found, report(found)


def test_every_step_type_in_a_loop_entered_twice(harness: Harness) -> None:
    """A loop's second pass is a new iteration: a new effect key, a new request, a new
    timer, a new fork."""
    found = run_plans(harness, [loop(kind) for kind in FIRST])

    assert not found, report(found)
