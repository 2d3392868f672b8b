"""The settings the manuals document are the settings the code reads, both ways.

Every ``WAYMARK_*`` name in the site's pages (``docs/**/*.md``) and ``README.md`` is read
somewhere (a documented setting nothing reads tells an operator a knob exists that does
nothing), and every name the code reads is documented (a setting nobody can find is one
nobody sets on purpose).

What counts as read: a string constant that is exactly a ``WAYMARK_*`` name in the apps'
and waymark_config's Python (``env.int("WAYMARK_X", …)``, ``os.environ.get("WAYMARK_X")``), the
names built at run time from the lane settings (``WAYMARK_<LANE>_<NAME>``), the variables
the ``./waymark`` script expands, and the variables tests and benchmarks read from their
environment (``os.environ.get``: ``WAYMARK_GENERATED_EXAMPLES``, ``WAYMARK_CHROMIUM``). The
docs' ``WAYMARK_<LANE>_<NAME>`` forms are expanded from the lanes and their settings, and
the lanes table of docs/reference/settings.md must list every lane and setting with its default.

Also: the docs name nothing outside the repository (a relative path they give exists in it).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from .processes import ROOT

DOCUMENTS = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
CODE_DIRS = ["waymark_config", "workflows", "effects", "timers", "approvals", "webhooks"]
ENV_READERS = ["tests", "benchmarks"]  # only what they read from their environment counts
NAME = re.compile(r"WAYMARK_[A-Z0-9_]+")
# A name as the docs write it, placeholders included: WAYMARK_<LANE>_<NAME>.
DOCUMENTED = re.compile(r"WAYMARK_(?:[A-Z0-9_]|<[A-Z]+>)+")

# Named in the docs, read by no Waymark process, on purpose.
NOT_SETTINGS = {
    "WAYMARK_URL": "docs/how-to/call-the-api.md: the calling service's environment (Waymark's URL)",
    "WAYMARK_KEY": "docs/how-to/call-the-api.md: the calling service's environment (its API key)",
    "WAYMARK_WEB": "docs/how-to/embed-in-django.md: a Django settings object a host imports",
}
# Read, and deliberately not in the manuals.
UNDOCUMENTED = {
    "WAYMARK_GENERATED_REPORT": "plumbing: benchmarks/generated_automations.py sets it for "
    "each pytest pass it starts, to collect that pass's counts; nobody sets it by hand",
}


def lanes() -> dict[str, dict[str, float | int]]:
    return dict(settings.LANE_DEFAULTS)


def lane_names() -> set[str]:
    return {f"WAYMARK_{lane.upper()}_{name.upper()}" for lane, s in lanes().items() for name in s}


def python_files(*dirs: str) -> Iterator[Path]:
    for name in dirs:
        yield from sorted((ROOT / name).rglob("*.py"))


def names_in_code() -> set[str]:
    """Every WAYMARK_* string constant of the apps and waymark_config, the lane names expanded."""
    found: set[str] = set()
    for path in python_files(*CODE_DIRS):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if NAME.fullmatch(node.value):
                    found.add(node.value)
            elif isinstance(node, ast.JoinedStr) and _built_name(node):
                # Only the lane settings build names at run time; another must be taught here.
                assert path == ROOT / "waymark_config" / "defaults.py", f"{path}:{node.lineno}"
                found |= lane_names()
    return found


def _built_name(node: ast.JoinedStr) -> bool:
    first = node.values[0] if node.values else None
    return isinstance(first, ast.Constant) and str(first.value).startswith("WAYMARK_")


def names_read_from_environment() -> set[str]:
    """The WAYMARK_* names tests and benchmarks read from their environment."""
    found: set[str] = set()
    for path in python_files(*ENV_READERS):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and _reads_environment(node.func) and node.args:
                key = node.args[0]
                if isinstance(key, ast.Constant) and NAME.fullmatch(str(key.value)):
                    found.add(str(key.value))
    return found


def _reads_environment(func: ast.expr) -> bool:
    """``os.environ.get(…)`` or ``os.getenv(…)``."""
    if not isinstance(func, ast.Attribute):
        return False
    owner = func.value
    if func.attr == "get":
        return isinstance(owner, ast.Attribute) and owner.attr == "environ"
    return func.attr == "getenv" and isinstance(owner, ast.Name) and owner.id == "os"


def names_in_script() -> set[str]:
    """The variables ``./waymark`` expands (``$NAME``, ``${NAME:-default}``)."""
    return set(re.findall(r"\$\{?(WAYMARK_[A-Z0-9_]+)", (ROOT / "waymark").read_text()))


def names_read() -> set[str]:
    return names_in_code() | names_read_from_environment() | names_in_script()


def documented() -> dict[str, set[str]]:
    """Every name the docs give, expanded, with the documents that give it."""
    where: dict[str, set[str]] = {}
    for document in DOCUMENTS:
        for written in DOCUMENTED.findall(document.read_text()):
            for name in expand(written.rstrip("_")):
                where.setdefault(name, set()).add(document.name)
    return where


def expand(written: str) -> set[str]:
    """``WAYMARK_<LANE>_<NAME>`` → every lane's every setting; ``<LANE>`` alone → every lane."""
    names = {written}
    for placeholder, values in (
        ("<LANE>", [lane.upper() for lane in lanes()]),
        ("<NAME>", sorted({name.upper() for s in lanes().values() for name in s})),
    ):
        names = {n.replace(placeholder, v) for n in names for v in values}
    assert not any("<" in n for n in names), f"an unknown placeholder in {written}"
    return names


def test_every_documented_setting_is_read() -> None:
    read = names_read()
    dead = {
        name: sorted(docs)
        for name, docs in documented().items()
        if name not in read and name not in NOT_SETTINGS
    }
    assert dead == {}, f"documented, but nothing reads them: {dead}"


def test_every_setting_read_is_documented() -> None:
    missing = names_read() - set(documented()) - set(UNDOCUMENTED)
    assert missing == set(), f"read, but no manual names them: {sorted(missing)}"


def test_the_exceptions_are_still_needed() -> None:
    """An exception that no longer applies is removed, not left to excuse the next one."""
    read, docs = names_read(), set(documented())
    assert {name for name in NOT_SETTINGS if name not in docs or name in read} == set()
    assert {name for name in UNDOCUMENTED if name in docs or name not in read} == set()


def test_the_lanes_table_lists_every_lane_and_setting_with_its_default() -> None:
    text = (ROOT / "docs" / "reference" / "settings.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| lane |"))
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    rows = {
        cells[0]: cells[1:]
        for line in text.splitlines()
        if (cells := [cell.strip() for cell in line.strip("|").split("|")])[0] in lanes()
        and len(cells) == len(columns)
    }
    assert set(rows) == set(lanes())
    for lane, defaults in lanes().items():
        assert columns[1:] == list(defaults), "the table's columns are the lane settings"
        shown = {name: float(value) for name, value in zip(columns[1:], rows[lane], strict=True)}
        assert shown == {name: float(value) for name, value in defaults.items()}, lane


def test_the_docs_name_nothing_outside_the_repository() -> None:
    for document in DOCUMENTS:
        text = document.read_text()
        assert "/work/" not in text, document.name
        for relative in re.findall(r"(?:\.\./)+[\w./-]*", text):
            target = (document.parent / relative).resolve()
            assert target.is_relative_to(ROOT.resolve()) and target.exists(), (
                f"{document.name} names {relative}, which is not in the repository"
            )
