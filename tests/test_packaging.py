"""Waymark as an installable Django app: its wheel, installed into a fresh virtual environment
beside a host project of its own (tests/host_project/), has what the host needs.

The wheel is built from a copy of the sources; the virtual environment gets it and its
dependencies through pip, as a host's would. The host project (its own settings, URLconf and
database on the tests' PostgreSQL server) migrates, starts a run through Waymark's API, runs
the engine with ``manage.py runengine --no-web`` and sees the run finish, then renders the
admin pages and a Slack message: every template and data file must come from site-packages.
The import of Waymark's settings objects that docs/how-to/embed-in-django.md shows a host reads the
environment and writes nothing.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg import sql
from psycopg.conninfo import make_conninfo

from .processes import kill_tree

pytestmark = pytest.mark.long_running

ROOT = Path(__file__).resolve().parent.parent
HOST_PROJECT = Path(__file__).resolve().parent / "host_project"
EMBEDDING = ROOT / "docs" / "how-to" / "embed-in-django.md"
PACKAGES = ["waymark_config", "workflows", "timers", "effects", "approvals", "webhooks"]
# Each file that is not a module, by where it lands in site-packages.
PACKAGE_DATA = [
    "workflows/templates/admin/locked_out.html",
    "workflows/templates/admin/workflows/run/change_form.html",
    "workflows/templates/admin/workflows/run/steps.html",
    "workflows/templates/admin/workflows/run/timeline.html",
    "workflows/templates/admin/workflows/run/paging.html",
    "workflows/templates/admin/workflows/run/confirm_action.html",
    "workflows/templates/admin/workflows/apikey/created.html",
    "workflows/demo/follow-up.json",
    "effects/templates/admin/effects/connection/change_form.html",
    "effects/templates/admin/effects/effect/change_form.html",
    "effects/templates/admin/effects/effect/resolve.html",
    "approvals/templates/admin/approvals/inbox.html",
    "approvals/templates/admin/approvals/review.html",
    "approvals/templates/approvals/slack_request.json",
    "approvals/templates/approvals/slack_task.json",
    "webhooks/templates/admin/webhooks/subscription/secret.html",
    "workflows/migrations/0001_initial.py",
    *(f"{package}/py.typed" for package in PACKAGES),
]
# Bounds, not budgets: pip may fetch from the package index; the run takes about 2 s.
INSTALL_SECONDS = 900
COMMAND_SECONDS = 300
RUN_SECONDS = 120


# What importing the settings objects may load: a host's settings import them before Django
# is set up. Waymark's own settings module (a secret key, .env) and a database driver may not.
IMPORT_PROBE = """
import json, sys
from {module} import {names}
from django.conf import settings
print(json.dumps({{"modules": sorted(sys.modules), "configured": settings.configured}}))
"""


def _documented_import() -> tuple[str, list[str]]:
    """The module the embedding guide tells a host to import the settings objects from, and
    the names it imports."""
    found = re.search(r"^from ([\w.]+) import \(\n((?:    \w+,\n)+)\)", EMBEDDING.read_text(), re.M)
    assert found, "docs/how-to/embed-in-django.md shows no import of the settings objects"
    return found[1], re.findall(r"\w+", found[2])


def test_a_hosts_import_of_the_settings_objects_writes_nothing(tmp_path: Path) -> None:
    """The import the embedding guide shows, run as a host's settings run it: before Django is
    set up, with only a host's environment. It reads that environment and does nothing else:
    no file written (Waymark's own project keeps a secret key under WAYMARK_DATA_DIR), none of
    Waymark's own settings evaluated, no database driver loaded."""
    module, names = _documented_import()
    host_settings = (HOST_PROJECT / "config" / "settings.py").read_text()
    assert f"from {module} import (" in host_settings, "the host project imports elsewhere"
    cwd, data = tmp_path / "cwd", tmp_path / "data"
    cwd.mkdir()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "WAYMARK_DATA_DIR": str(data)}
    code = IMPORT_PROBE.format(module=module, names=", ".join(names))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert not data.exists() and not any(cwd.iterdir()), "importing the settings objects wrote"
    assert "waymark_config.settings" not in loaded["modules"]
    assert not any(m == "psycopg" or m.startswith("django.db") for m in loaded["modules"])
    assert not loaded["configured"]


@dataclass
class Host:
    wheel: Path
    python: Path
    site_packages: Path
    project: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = COMMAND_SECONDS) -> str:
        """A command of the host project's (its manage.py or hostcheck.py), its output."""
        done = subprocess.run(
            [str(self.python), *args],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def check(self, *args: str) -> Any:
        return json.loads(self.run("hostcheck.py", *args).strip().splitlines()[-1])


def _call(args: list[str], **kwargs: Any) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=INSTALL_SECONDS, **kwargs)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"


def _build_wheel(into: Path) -> Path:
    """Waymark's wheel, built from a copy of what it is made of (the build writes build/ and
    *.egg-info beside its sources; the worktree is left alone)."""
    source = into / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    dist = into / "dist"
    pip_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _call([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(source)],
          env=pip_env)  # fmt: skip
    (wheel,) = dist.glob("waymark-*.whl")
    return wheel


def _install(wheel: Path, venv: Path) -> tuple[Path, Path]:
    """A fresh virtual environment holding the wheel and its dependencies, nothing else."""
    pip_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _call([sys.executable, "-m", "venv", str(venv)], env=pip_env)
    python = venv / "bin" / "python"
    _call([str(python), "-m", "pip", "install", "--quiet", str(wheel)], env=pip_env)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, env=pip_env,
    ).stdout.strip()  # fmt: skip
    return python, Path(purelib)


def _server() -> dict[str, str]:
    """Where the tests' PostgreSQL server is (the embedded one, or DATABASE_URL's)."""
    params = connection.get_connection_params()  # starts the embedded server if need be
    return {k: str(params[k]) for k in ("host", "port", "user", "password") if params.get(k)}


def _recreate(conninfo: str, name: str, *, again: bool) -> None:
    """Drop the database ``name`` (a previous run's, or this run's at the end); create it
    ``again`` or not."""
    with psycopg.connect(conninfo, autocommit=True) as admin:
        database = sql.Identifier(name)
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(database))
        if again:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(database))


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    work = tmp_path_factory.mktemp("packaging")
    wheel = _build_wheel(work)
    python, site_packages = _install(wheel, work / "venv")
    project = work / "host_project"
    shutil.copytree(HOST_PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    # Only what a host's shell would have: no PYTHONPATH (the worktree must not be importable),
    # none of the suite's WAYMARK_* or DATABASE_URL.
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(work)),
        "LANG": "C.UTF-8",
        "HOST_SECRET_KEY": secrets.token_urlsafe(40),
        # The engine polls often, and walks one inline step per transaction: the rest of a
        # run continues on a worker, so the run needs the host's relay, worker and sweep.
        "WAYMARK_WORKER_POLL_SECONDS": "0.2",
        "WAYMARK_SWEEP_SECONDS": "0.2",
        "WAYMARK_WALK_INLINE_STEPS": "1",
    }
    # A database of its own on the tests' server, given as the host's HOST_DB_* settings.
    server, name = _server(), f"{connection.settings_dict['NAME']}_packaging_host"[:63]
    admin = make_conninfo(**server, dbname="postgres")
    _recreate(admin, name, again=True)
    env.update({f"HOST_DB_{k.upper()}": v for k, v in {**server, "name": name}.items()})
    try:
        yield Host(wheel, python, site_packages, project, env)
    finally:
        _recreate(admin, name, again=False)


def test_the_wheel_carries_templates_data_and_migrations(host: Host) -> None:
    with zipfile.ZipFile(host.wheel) as wheel:
        names = set(wheel.namelist())
    missing = [name for name in PACKAGE_DATA if name not in names]
    assert not missing, f"not in the wheel: {missing}"
    for name in PACKAGE_DATA:
        assert (host.site_packages / name).is_file(), f"not installed: {name}"
    # Nothing of the sources' own tree: templates live in their apps, not in the project.
    assert not any(name.startswith("templates/") for name in names)


def test_the_host_finds_waymark_and_its_templates_in_site_packages(host: Host) -> None:
    found = host.check("origins")
    for module, path in found["modules"].items():
        assert Path(path).is_relative_to(host.site_packages), (module, path)
    for template, path in found["templates"].items():
        assert Path(path).is_relative_to(host.site_packages), (template, path)
    assert Path(found["demo_definition"]).is_relative_to(host.site_packages)
    assert found["demo_steps"] > 0
    assert not Path(sysconfig.get_path("purelib")).is_relative_to(host.site_packages)


def test_the_host_apps_config_is_the_pages() -> None:
    # The page's shop/apps.py, which registers the host's code workflow, is the host's own.
    shown = re.search(r"```python\n(# shop/apps.py\n.*?)```", EMBEDDING.read_text(), re.S)
    assert shown, "docs/how-to/embed-in-django.md shows no shop/apps.py"
    assert shown[1] == (HOST_PROJECT / "shop" / "apps.py").read_text()


def test_a_host_project_migrates_starts_a_run_and_its_engine_finishes_it(host: Host) -> None:
    host.run("manage.py", "migrate", "--no-input")
    # The demo reads its definition from the installed package (workflows/demo/).
    assert "automation: follow-up v1" in host.run("manage.py", "bootstrap_demo")
    host.run("manage.py", "create_organisation", "host")
    key = host.run("manage.py", "create_api_key", "--org", "host").strip().splitlines()[-1]
    host.run("manage.py", "publish_automation", "--org", "host", "--slug", "hello",
             "--file", "automation.json")  # fmt: skip
    started = host.check("start", key)
    assert started["status_code"] == 201, started
    # The host app's code workflow, registered from its AppConfig.ready() (the page's
    # apps.py), published with the page's command, started through the API.
    assert "greet-customer version 1 published for host" in host.run(
        "manage.py", "publish_code_workflow", "--org", "host", "--name", "greet-customer",
        "--version", "1",
    )  # fmt: skip
    coded = host.check("start", key, "greet-customer")
    assert coded["status_code"] == 201, coded

    log = (host.project / "runengine.log").open("wb")
    engine = subprocess.Popen(
        [str(host.python), "manage.py", "runengine", "--no-web", "--grace", "2"],
        cwd=host.project,
        env=host.env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        detail = host.check("wait", key, str(started["id"]), str(RUN_SECONDS))
        coded_detail = host.check("wait", key, str(coded["id"]), str(RUN_SECONDS))
        engine.send_signal(signal.SIGTERM)
        stopped = engine.wait(timeout=60)
    finally:
        kill_tree(engine)
        log.close()
    output = (host.project / "runengine.log").read_text(errors="replace")
    assert detail["status"] == "succeeded", f"{detail}\nrunengine:\n{output}"
    assert detail["output"] == {"message": "Hello host"}, detail
    steps = {step["step_id"]: step for step in detail["steps"]}
    assert all(steps[s]["status"] == "done" for s in ("greet", "pause", "record", "done")), steps
    # Past the first inline step the walk continued on the io lane, and the wait needed the
    # sweep: the host's own engine processes moved the run.
    assert steps["record"]["lane"] == "io" and steps["~continue"]["status"] == "done", steps
    # The workers took the code run's decide turns: the host's ready() ran in them too.
    assert coded_detail["status"] == "succeeded", f"{coded_detail}\nrunengine:\n{output}"
    assert coded_detail["output"] == {"message": "Hello host, from code"}, coded_detail
    assert stopped == 0, output
    # The absence monitors run in the host too, and find nothing broken (exit 0).
    assert "healthy: every invariant holds" in host.run("manage.py", "doctor")
    # The host's settings evaluated none of Waymark's own: no secret key of its kept anywhere.
    assert not (host.site_packages / ".data").exists()
    assert not list(host.project.rglob("secret_key"))

    pages = host.check("pages", str(started["id"]))
    run_page, inbox, connection_page = pages["run"], pages["inbox"], pages["connection"]
    assert run_page["status"] == 200
    assert 'id="timeline"' in run_page["html"]  # admin/workflows/run/timeline.html
    assert "step.started" in run_page["html"] or "run.started" in run_page["html"]
    assert inbox["status"] == 200 and "Waiting for you" in inbox["html"]
    assert connection_page["status"] == 200
    # /metrics is there, answered by Waymark's view (off: the host set no token).
    assert pages["metrics"]["status"] == 404 and "WAYMARK_METRICS_TOKEN" in pages["metrics"]["html"]
    header, *_, actions = pages["slack"]
    assert header["text"]["text"] == "Approval requested"
    assert [b["value"] for b in actions["elements"]] == ["yes-token", "no-token"]


# A host's settings module beside its own, made by the tests: the host's settings with one
# thing wrong, as a newcomer's first try has it.
SETTINGS_VARIANT = """
import config.settings as host

globals().update({{k: v for k, v in vars(host).items() if k.isupper() and k not in {drop!r}}})
{extra}
"""


def _variant(host: Host, name: str, *, drop: tuple[str, ...] = (), extra: str = "") -> str:
    (host.project / "config" / f"{name}.py").write_text(
        SETTINGS_VARIANT.format(drop=drop, extra=extra)
    )
    return f"config.{name}"


def _failing(host: Host, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(host.python), *args], cwd=host.project, env=host.env,
                          capture_output=True, text=True, timeout=COMMAND_SECONDS)  # fmt: skip
    assert done.returncode != 0, f"{args} passed:\n{done.stdout}"
    return done


def test_a_host_without_the_settings_objects_is_told_which_and_how_at_start_up(
    host: Host,
) -> None:
    """Settings that lack some of Waymark's settings objects stop every command with their
    code, naming what is missing and the import that gives it (they failed with an
    AttributeError from an app's ready())."""
    settings = _variant(host, "settings_without", drop=("EFFECTS", "WEBHOOKS"))
    done = _failing(host, "manage.py", "check", "--settings", settings)
    last = done.stderr.strip().splitlines()[-1]
    assert "waymark_settings_missing: the settings have no EFFECTS, WEBHOOKS" in last, done.stderr
    assert "from waymark_config.defaults import CACHES, EFFECTS" in last
    assert "AttributeError" not in done.stderr


def test_a_host_on_sqlite_is_refused_before_the_first_migration(host: Host) -> None:
    """Django's SQLite default, left in a new project's settings: `check` says Waymark runs
    on PostgreSQL only, and `migrate` stops on the same error before migrating anything
    (it failed in the second migration, the first one kept)."""
    database = host.project / "sqlite.db"
    settings = _variant(host, "settings_sqlite", extra=(
        f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(database)!r}}}}}"
    ))  # fmt: skip
    for command in (["check"], ["migrate", "--no-input"]):
        done = _failing(host, "manage.py", *command, "--settings", settings)
        assert "(waymark.E001) Waymark runs on PostgreSQL only" in done.stderr, done.stderr
        assert "DATABASES['default'] is sqlite" in done.stderr
    assert not database.exists() or database.stat().st_size == 0
    # A host's other database is its own: only the default one, Waymark's, is checked.
    beside = _variant(host, "settings_beside", extra=(
        f"DATABASES = {{**DATABASES, 'legacy': {{'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(database)!r}}}}}"
    ))  # fmt: skip
    assert "no issues" in host.run("manage.py", "check", "--settings", beside)


def test_a_host_s_mypy_reads_waymark_s_type_hints(host: Host) -> None:
    """The wheel is typed (py.typed): the host's own workflow module passes mypy with
    Waymark installed, and a call that does not match Context's hints is caught (without
    the marker, mypy refused the import: 'missing library stubs or py.typed marker')."""
    shop = host.project / "shop"
    (shop / "typo.py").write_text(
        "from workflows.plugins.code import Context\n\n\n"
        "def wrong(ctx: Context) -> None:\n"
        "    ctx.sleep(3)\n"
    )
    mypy = [sys.executable, "-m", "mypy", "--python-executable", str(host.python),
            "--no-incremental", "--ignore-missing-imports",
            "--follow-imports", "silent"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    good = subprocess.run([*mypy, "shop/workflows.py"], cwd=host.project, env=env,
                          capture_output=True, text=True, timeout=COMMAND_SECONDS)  # fmt: skip
    assert good.returncode == 0, good.stdout + good.stderr
    bad = subprocess.run([*mypy, "shop/typo.py"], cwd=host.project, env=env,
                         capture_output=True, text=True, timeout=COMMAND_SECONDS)  # fmt: skip
    assert bad.returncode == 1 and 'argument 1 to "sleep"' in bad.stdout.lower(), bad.stdout
