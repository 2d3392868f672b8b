"""What an app's admin pages share with Waymark's own: scoping to the organisations the staff
member belongs to (``OrgScopedMixin``, ``OrgScopedRelatedFilter``, ``scoped``, ``in_scope``),
the JSON field that refuses what PostgreSQL cannot store, JSON shown readably, the words
for what a step parked by the app waits on (``register_wait_describer``), and the app's panel
on the control room, the admin's first screen (``register_control_panel``)."""

from __future__ import annotations

from ..admin.control_room import CONTROL_PANELS, Line, Panel, PanelSource, capped
from ..admin.display import pretty_json
from ..admin.fields import SafeJSONField
from ..admin.scoping import (
    OrgScopedMixin,
    OrgScopedRelatedFilter,
    in_scope,
    may_change_here,
    scoped,
)
from ..engine.wait_words import WAIT_DESCRIBERS, Describer, Wait, WaitDescription, when

__all__ = [
    "Describer",
    "Line",
    "OrgScopedMixin",
    "OrgScopedRelatedFilter",
    "Panel",
    "PanelSource",
    "SafeJSONField",
    "Wait",
    "WaitDescription",
    "capped",
    "in_scope",
    "may_change_here",
    "pretty_json",
    "register_control_panel",
    "register_wait_describer",
    "scoped",
    "when",
]


def register_wait_describer(kind: str, describe: Describer) -> None:
    """Say in words what the steps your app parks wait on, for the run page and the API's
    run detail (``waiting_on``). ``kind``: the prefix of the ``parked_on`` your parks carry
    (``"effect"`` for ``"effect:12"``), or a key of their detail (``"approval"``).

    ``describe(waits)`` gets every waiting step of that kind on one page (``Wait``: its
    organisation, run, step, iteration, ``detail`` and ``wake_at``) and returns a
    ``WaitDescription`` for each, in the same order (None: the detail's own words): ``text``,
    read after "waits on" ("effect 15/apply/1:9cf… to be resolved by a person"), and, when
    there is one, the ``admin_url`` and ``api_path`` of the thing waited on. Read your rows
    in one query for all of them, filtered by organisation as well as id. The engine adds
    the deadline ("; at … it wakes"). The same kind again replaces it."""
    WAIT_DESCRIBERS[kind] = describe


def register_control_panel(name: str, panel: PanelSource) -> None:
    """Show your app's panel on the control room (the admin's first screen), after the
    engine's. ``panel(request, orgs)`` gets the organisations' ids the signed-in staff member
    sees (every one's, for a superuser) and returns a ``Panel`` of ``Line``s, or None when
    the person may not see what it shows (check their permissions). Read only those
    organisations' rows, with a few bounded queries whatever your tables hold (count up to a
    cap: ``capped``); the same name again replaces it."""
    CONTROL_PANELS[name] = panel
