"""The erasers: one per app, each removing a person's values from that app's own tables."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .scrub import Matcher


@dataclass(frozen=True)
class Erasing:
    """What an eraser is asked to do, in the erasure's transaction (the runs are locked).

    ``run_ids``: the runs whose rows of your app to scrub with ``matcher``. ``org_wide``:
    also scrub your app's rows of the organisation that belong to no run (or to any run:
    a signal not yet matched, a suppression entry, a delivery, a schedule), with
    ``matcher`` (then the person's identifying values only, recognised whole, never a field
    such as a name: another person's rows are not to be touched by a common word, an id
    inside a URL or a run's number). The ``run_ids`` of an ``org_wide`` pass are other
    people's runs found holding one of those values in any row of theirs. ``widen``: pass it to
    ``scrub_rows``; a row in which ``matcher`` finds an identifying value is the person's,
    and then loses their other values too (a pending signal correlated by their address
    loses their name)."""

    org_id: int
    run_ids: tuple[int, ...]
    matcher: Matcher
    org_wide: bool
    widen: Matcher | None = None

    def params(self) -> dict[str, Any]:
        return {"org": self.org_id, "runs": list(self.run_ids)}


Eraser = Callable[[Any, Erasing], Mapping[str, int]]

ERASERS: dict[str, Eraser] = {}
