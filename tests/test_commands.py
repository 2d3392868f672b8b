"""Management commands: clear messages with stable codes, and an idempotent demo bootstrap."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from workflows.demo.bootstrap import DEMO_ORG, bootstrap_demo
from workflows.demo.runs import show_demo_runs
from workflows.errors import WaymarkError
from workflows.models import ApiKey, Automation, AutomationVersion, Organisation
from workflows.services.tenancy import api_key_authenticate

from .factories import linear_definition

pytestmark = pytest.mark.django_db


def _call(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_create_api_key_for_unknown_organisation() -> None:
    with pytest.raises(CommandError, match="unknown_organisation"):
        _call("create_api_key", "--org", "nope")
    assert not ApiKey.objects.exists()


def test_create_and_revoke_api_key() -> None:
    _call("create_organisation", "acme")
    raw = _call("create_api_key", "--org", "acme").strip()
    key = api_key_authenticate(raw)
    assert key.org.slug == "acme"
    assert raw not in key.key_hash and len(key.key_hash) == 64
    assert "revoked" in _call("revoke_api_key", key.prefix)
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    with pytest.raises(CommandError, match="not_found"):
        _call("revoke_api_key", "doesnotexist")


def test_publish_automation_command(tmp_path: Path) -> None:
    _call("create_organisation", "acme")
    path = tmp_path / "def.json"
    path.write_text(json.dumps(linear_definition("a")))
    assert "v1 published" in _call(
        "publish_automation", "--org", "acme", "--slug", "x", "--file", str(path)
    )
    # The same definition again is already current: no new version.
    assert "v1 published" in _call(
        "publish_automation", "--org", "acme", "--slug", "x", "--file", str(path)
    )
    path.write_text(json.dumps({"start": "a", "steps": [{"id": "a", "type": "nope"}]}))
    with pytest.raises(CommandError, match="unknown_step_type"):
        _call("publish_automation", "--org", "acme", "--slug", "x", "--file", str(path))
    path.write_text("{broken")
    with pytest.raises(CommandError, match="unreadable_definition"):
        _call("publish_automation", "--org", "acme", "--slug", "x", "--file", str(path))
    assert AutomationVersion.objects.count() == 1


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('{"start": "a", "steps": [{"id": "a", "type": "set", "values": {"x": NaN}, '
         '"next": "b"}, {"id": "b", "type": "end"}]}', "unreadable_definition"),
        ('{"start": "a", "steps": [{"id": "a", "type": "end", "output": "\\u0000"}]}',
         "invalid_definition"),
        ("[" * 100_000 + "]" * 100_000, "unreadable_definition"),
    ],
)  # fmt: skip
def test_a_definition_file_refused_leaves_nothing_behind(
    tmp_path: Path, text: str, code: str
) -> None:
    """NaN (which PostgreSQL's json refuses), nesting too deep to read, text the database
    cannot store: a CommandError with its code, and no automation created for a definition
    that was never published (one was left behind with no version)."""
    _call("create_organisation", "acme")
    path = tmp_path / "def.json"
    path.write_text(text)
    with pytest.raises(CommandError, match=f"^{code}"):
        _call("publish_automation", "--org", "acme", "--slug", "fresh", "--file", str(path))
    assert not Automation.objects.filter(slug="fresh").exists()


class _Looks:
    """A stop for show_demo_runs that lets it look ``times`` times, then stops it: no clock."""

    def __init__(self, times: int) -> None:
        self.left = times

    def is_set(self) -> bool:
        return self.left <= 0

    def wait(self, seconds: float) -> bool:
        self.left -= 1
        return self.is_set()


@pytest.mark.django_db(transaction=True)
def test_the_demo_runs_progress_is_printed_when_it_changes(settings, tmp_path: Path) -> None:
    # With no engine the runs stay where they started: one line, not one a look.
    settings.DATA_DIR = tmp_path
    bootstrap_demo()
    out = io.StringIO()
    looking = threading.Thread(target=show_demo_runs, args=(2, out, _Looks(4)))
    looking.start()
    looking.join()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("started 2 demo run(s)")
    assert [line for line in lines if line.startswith("demo runs:")] == [lines[1]], lines


def test_bootstrap_demo_is_idempotent(settings, tmp_path: Path) -> None:
    settings.DATA_DIR = tmp_path
    first = bootstrap_demo()
    second = bootstrap_demo()
    assert first.admin_password and first.api_key  # made, so shown once...
    assert (second.admin_password, second.api_key) == (None, None)  # ...and not again
    assert first.version.pk == second.version.pk
    assert Organisation.objects.filter(slug=DEMO_ORG).count() == 1
    assert ApiKey.objects.count() == 1
    assert AutomationVersion.objects.count() == 1
    user = get_user_model().objects.get(username="admin")
    assert user.is_superuser and user.check_password(first.admin_password)
    assert api_key_authenticate(first.api_key).org.slug == DEMO_ORG
    saved = json.loads((tmp_path / "demo-credentials.json").read_text())
    assert (saved["admin_password"], saved["api_key"]) == (first.admin_password, first.api_key)
    assert (tmp_path / "demo-credentials.json").stat().st_mode & 0o077 == 0


def test_bootstrap_demo_on_a_host_says_what_it_needs_and_what_it_kept(settings, tmp_path) -> None:
    """A host project (docs/how-to/embed-in-django.md): without DATA_DIR, a code instead of a
    traceback; with an admin of its own made before, the demo does not say it kept a password
    it never made."""
    del settings.DATA_DIR
    with pytest.raises(CommandError, match=r"^missing_setting: settings.DATA_DIR is not set"):
        call_command("bootstrap_demo", stdout=io.StringIO(), stderr=io.StringIO())
    settings.DATA_DIR = tmp_path
    get_user_model().objects.create_superuser("admin", password="their-own-Pw-123")
    out = io.StringIO()
    call_command("bootstrap_demo", stdout=out, stderr=io.StringIO())
    assert "password:   unchanged (the user existed already: its own password)" in out.getvalue()


def test_bootstrap_demo_refuses_in_production_and_creates_nothing(settings, tmp_path) -> None:
    """`./waymark run` runs `bootstrap_demo` before the engine (and stops when it fails): in
    production it must not make a superuser with a printed password, nor an API key."""
    settings.DATA_DIR = tmp_path
    settings.PRODUCTION = True
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"^demo_refused_in_production: WAYMARK_PRODUCTION is"):
        call_command("bootstrap_demo", stdout=out, stderr=io.StringIO())
    # A host's settings: the objects it imports carry WAYMARK_PRODUCTION (WAYMARK).
    del settings.PRODUCTION
    settings.WAYMARK = {**settings.WAYMARK, "PRODUCTION": True}
    with pytest.raises(CommandError, match=r"^demo_refused_in_production"):
        call_command("bootstrap_demo", stdout=out, stderr=io.StringIO())
    assert out.getvalue() == ""  # no password, no key printed
    assert not get_user_model().objects.exists()
    assert not Organisation.objects.filter(slug=DEMO_ORG).exists()
    assert not ApiKey.objects.exists() and not AutomationVersion.objects.exists()
    assert not (tmp_path / "demo-credentials.json").exists()


def test_bootstrap_demo_leaves_an_existing_admin_as_it_is(settings, tmp_path: Path) -> None:
    settings.DATA_DIR = tmp_path
    bootstrap_demo()
    user = get_user_model().objects.get(username="admin")
    user.set_password("changed-in-the-Admin-42")
    user.is_superuser = False
    user.save()
    again = bootstrap_demo(admin_password="another-Strong-pass-9")
    user.refresh_from_db()
    assert again.admin_password is None
    assert user.check_password("changed-in-the-Admin-42") and not user.is_superuser


def test_bootstrap_demo_validates_a_given_password(settings, tmp_path: Path, monkeypatch) -> None:
    settings.DATA_DIR = tmp_path
    with pytest.raises(WaymarkError, match="too short"):
        bootstrap_demo(admin_password="a")
    assert not get_user_model().objects.filter(username="admin").exists()
    monkeypatch.setenv("WAYMARK_ADMIN_PASSWORD", "a")
    with pytest.raises(CommandError, match="invalid_admin_password"):
        _call("bootstrap_demo")


def test_bootstrap_demo_replaces_a_revoked_key(settings, tmp_path: Path) -> None:
    settings.DATA_DIR = tmp_path
    first = bootstrap_demo()
    ApiKey.objects.update(revoked_at="2026-01-01T00:00:00Z")
    second = bootstrap_demo()
    assert second.api_key is not None and second.api_key != first.api_key
    assert api_key_authenticate(second.api_key).org.slug == DEMO_ORG


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("run_input", "message", "vip"),
    [
        ({"name": "Ada", "tier": "gold"}, "Hello Ada", True),
        ({"name": "Sam", "tier": "silver"}, "Hello Sam", False),
        # What docs/how-to/call-the-api.md's examples send: neither field. A new user's first call
        # must not end in a failed run with undefined_value.
        ({"email": "ada@example.com"}, "Hello there", False),
        ({}, "Hello there", False),
    ],
)
def test_the_demo_automation_succeeds_with_or_without_its_optional_input(
    settings, tmp_path: Path, run_input: dict, message: str, vip: bool
) -> None:
    from workflows.models import Run, Step
    from workflows.services.runs import run_start

    from .effect_setup import drive

    settings.DATA_DIR = tmp_path
    bootstrap_demo()
    org = Organisation.objects.get(slug=DEMO_ORG)
    run_id = run_start(org=org, automation_slug="follow-up", run_input=run_input).run_id
    drive()
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.error) == ("succeeded", "")
    assert run.output == {"message": message}
    assert Step.objects.filter(run_id=run_id, step_id="vip_note").exists() is vip


@pytest.mark.django_db(transaction=True)
def test_a_command_on_a_database_without_migrations_says_to_migrate_instead_of_crashing() -> None:
    """A fresh checkout's first `./waymark manage create_organisation acme`, before any
    `./waymark run`: one line with a stable code and what to run, not a ProgrammingError
    traceback."""
    import subprocess
    import sys

    from django.db import connection

    from .processes import ROOT, engine_env

    bare = f"{connection.settings_dict['NAME']}_bare"
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{bare}"')
        cursor.execute(f'CREATE DATABASE "{bare}"')
    try:
        for command in (["create_organisation", "acme"], ["create_api_key", "--org", "acme"]):
            refused = subprocess.run(
                [sys.executable, "manage.py", *command], cwd=ROOT,
                env=engine_env(WAYMARK_DB_NAME=bare), capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert refused.returncode == 1, refused.stderr
            assert "CommandError: database_not_migrated: " in refused.stderr
            assert "run `manage.py migrate` first" in refused.stderr
            assert "Traceback" not in refused.stderr
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{bare}" WITH (FORCE)')


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        (["Bad Slug!"], "slug: Enter a valid"),
        ([""], "slug: Enter a valid"),
        (["a" * 64], "slug: 64 characters; the limit is 63"),
        (["acme", "--name", "n" * 201], "name: 201 characters; the limit is 200"),
    ],
)
def test_create_organisation_refuses_what_the_admin_would(
    arguments: list[str], detail: str
) -> None:
    with pytest.raises(CommandError, match=f"^invalid_input: {detail}"):
        _call("create_organisation", *arguments)
    assert not Organisation.objects.exists()
    assert "organisation acme" in _call("create_organisation", "acme", "--name", "n" * 200)


@pytest.mark.parametrize("days", ["nan", "inf", "-1", "36501"])
def test_purge_runs_refuses_an_age_that_is_not_a_span(days: str) -> None:
    with pytest.raises(CommandError, match=r"^invalid_age: --older-than-days must be from 0"):
        _call("purge_runs", "--older-than-days", days)


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        (["--expires-in-days", "1e9"], "--expires-in-days must be more than 0 and at most"),
        (["--expires-in-days", "nan"], "--expires-in-days must be more than 0 and at most"),
        (["--expires-in-days", "0"], "--expires-in-days must be more than 0 and at most"),
        (["--name", "n" * 101], "--name: 101 characters; the limit is 100"),
    ],
)
def test_create_api_key_refuses_what_it_cannot_store(arguments: list[str], detail: str) -> None:
    _call("create_organisation", "acme")
    with pytest.raises(CommandError, match=f"^invalid_input: {detail}"):
        _call("create_api_key", "--org", "acme", *arguments)
    assert not ApiKey.objects.exists()


def test_publish_automation_refuses_a_slug_no_url_could_name(tmp_path: Path) -> None:
    _call("create_organisation", "acme")
    path = tmp_path / "def.json"
    path.write_text(json.dumps(linear_definition("a")))
    for slug, detail in (("Bad Slug", "slug: Enter a valid"), ("s" * 64, "slug: 64 characters")):
        with pytest.raises(CommandError, match=f"^invalid_input: {detail}"):
            _call("publish_automation", "--org", "acme", "--slug", slug, "--file", str(path))
    assert not AutomationVersion.objects.exists()


def test_publish_code_workflow_publishes_a_registered_workflow_once_per_version() -> None:
    from . import code_workflow_steps  # noqa: F401  (registers code-values, version 1)

    _call("create_organisation", "acme")
    out = _call("publish_code_workflow", "--org", "acme", "--name", "code-values", "--version", "1")
    assert "code-values version 1 published for acme (automation code-values v1)" in out
    version = AutomationVersion.objects.get(automation__org__slug="acme")
    assert version.definition["steps"][0]["workflow"] == "code-values"
    # Published again: the same version is current, no new one.
    _call("publish_code_workflow", "--org", "acme", "--name", "code-values", "--version", "1")
    assert AutomationVersion.objects.count() == 1


@pytest.mark.parametrize(
    ("org", "name", "code"),
    [
        ("acme", "code-values-unregistered", "workflow_version_missing"),
        ("nowhere", "code-values", "unknown_organisation"),
    ],
)
def test_publish_code_workflow_refuses_with_a_code(org: str, name: str, code: str) -> None:
    from . import code_workflow_steps  # noqa: F401

    _call("create_organisation", "acme")
    with pytest.raises(CommandError, match=code):
        _call("publish_code_workflow", "--org", org, "--name", name, "--version", "1")
    assert not AutomationVersion.objects.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ("runs", "list", "--org", "acme", "--search", "\udcff"),
        ("create_api_key", "--org", "acme", "--name", "\udcff"),
        ("revoke_api_key", "\udcff"),
        ("runs", "list", "--org", "ac\x00me"),
    ],
)
def test_an_argument_the_database_cannot_hold_is_refused_naming_it(argv: tuple[str, ...]) -> None:
    """Bytes that are not UTF-8 reach Python as lone surrogates (a NUL cannot be stored
    either): a CommandError naming the argument, not a UnicodeEncodeError traceback."""
    _call("create_organisation", "acme")
    with pytest.raises(CommandError, match=r"^invalid_input: "):
        _call(*argv)
    assert not ApiKey.objects.exists()
