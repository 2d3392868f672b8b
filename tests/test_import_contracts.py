"""The door contract (pyproject.toml, [tool.importlinter]) names the modules of workflows the
apps may not import, since import-linter has no "all but": a module added to workflows must
be added to that list, or to the door, or apps could import it unnoticed."""

import pkgutil
import tomllib
from pathlib import Path

import workflows

ROOT = Path(__file__).resolve().parents[1]
DOOR = {"plugins", "models", "errors"}


def test_every_module_of_workflows_is_either_the_door_or_forbidden_to_the_apps() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (door,) = [c for c in config["contracts"] if c["id"] == "door"]
    forbidden = {name.removeprefix("workflows.") for name in door["forbidden_modules"]}
    modules = {m.name for m in pkgutil.iter_modules(workflows.__path__)}
    assert modules - DOOR == forbidden
    assert set(door["source_modules"]) == {"effects", "timers", "approvals", "webhooks"}
