"""A timer follows its step when a migration between versions renames it (the door's
``register_step_renamer``, registered from TimersConfig.ready)."""

from __future__ import annotations

from typing import Any

from workflows.plugins import StepRename

from . import sql


def rename_timer(cursor: Any, rename: StepRename) -> None:
    cursor.execute(sql.RENAME_TIMER, rename.params())
