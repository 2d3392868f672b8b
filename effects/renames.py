"""A step's effects follow it when a migration between versions renames it (the door's
``register_step_renamer``, registered from EffectsConfig.ready): a parked step (an effect
waiting for a person's review, an approval's Slack message) run again under its new id finds
its effects under its new key."""

from __future__ import annotations

from typing import Any

from workflows.plugins import StepRename

from . import sql


def rename_effects(cursor: Any, rename: StepRename) -> None:
    cursor.execute(sql.RENAME_EFFECTS, rename.params())
