"""The tests' `probe` step type lives with the tests, and reaches a process only when its
WAYMARK_EXTRA_STEP_MODULES names it: Waymark's own packages hold no step that kills workers.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from workflows.apps import import_extra_step_modules
from workflows.definitions.registry import StepType

from .processes import ROOT, engine_env

PACKAGES = ("workflows", "effects", "timers", "approvals")
# Print whether a process set up with Waymark's own settings knows the `probe` type.
KNOWS_PROBE = (
    "import django; django.setup(); "
    "from workflows.definitions.registry import registry; print('probe' in registry)"
)


def production_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if ".migrations." not in info.name:
                names.append(info.name)
    return names


def test_no_module_of_waymark_declares_the_probe_step() -> None:
    declared = {
        f"{name}.{attr}"
        for name in production_modules()
        for attr, value in vars(importlib.import_module(name)).items()
        if isinstance(value, StepType) and value.name == "probe"
    }
    assert declared == set()


def knows_probe(**env: str) -> bool:
    environment = engine_env(DJANGO_SETTINGS_MODULE="waymark_config.settings", **env)
    answer = subprocess.run(
        [sys.executable, "-c", KNOWS_PROBE], cwd=ROOT, env=environment,
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return answer.stdout.strip() == "True"


def test_a_process_gets_the_probe_only_when_its_settings_name_the_module() -> None:
    assert knows_probe(WAYMARK_EXTRA_STEP_MODULES="tests.probe_steps")
    assert not knows_probe(WAYMARK_EXTRA_STEP_MODULES="")


def test_a_module_that_cannot_be_imported_stops_start_up_naming_the_setting() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"no_such_module.*WAYMARK_EXTRA_STEP_MODULES"):
        import_extra_step_modules(["tests.no_such_module"])
