"""What an app's admin pages share with Waymark's own: scoping to the organisations the staff
member belongs to (``OrgScopedMixin``, ``OrgScopedRelatedFilter``, ``scoped``, ``in_scope``),
the JSON field that refuses what PostgreSQL cannot store, and JSON shown readably."""

from __future__ import annotations

from ..admin.display import pretty_json
from ..admin.fields import SafeJSONField
from ..admin.scoping import (
    OrgScopedMixin,
    OrgScopedRelatedFilter,
    in_scope,
    may_change_here,
    scoped,
)

__all__ = [
    "OrgScopedMixin",
    "OrgScopedRelatedFilter",
    "SafeJSONField",
    "in_scope",
    "may_change_here",
    "pretty_json",
    "scoped",
]
