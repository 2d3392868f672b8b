"""Production settings and secrets: `check --deploy` is clean with the documented variables,
production refuses to start without a secret key, and new API keys are shown once, never in a
cookie."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from importlib.util import find_spec
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from workflows.models import ApiKey, Membership, Organisation

from .processes import ROOT

# What docs/how-to/production.md, "Production", tells an operator to set.
PRODUCTION_ENV = {
    "WAYMARK_PRODUCTION": "1",
    "WAYMARK_SECRET_KEY": secrets.token_urlsafe(50),
    "WAYMARK_ALLOWED_HOSTS": "waymark.example.com",
    "WAYMARK_CSRF_TRUSTED_ORIGINS": "https://waymark.example.com",
    "WAYMARK_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    "WAYMARK_EFFECTS_SECRET_KEYS": Fernet.generate_key().decode(),
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # The machine's environment without any WAYMARK_ setting but where the data lives.
    base = {key: value for key, value in os.environ.items()
            if not key.startswith("WAYMARK_") or key == "WAYMARK_DATA_DIR"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_check_deploy_is_clean_with_the_production_variables() -> None:
    clean = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION_ENV)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no issues" in clean.stdout
    # Without them the same check warns (the test would otherwise prove nothing).
    local = manage("check", "--deploy", "--fail-level", "WARNING")
    assert local.returncode != 0
    assert "security.W004" in local.stderr + local.stdout  # no HSTS


def test_production_refuses_to_start_without_a_secret_key() -> None:
    env = {**PRODUCTION_ENV}
    del env["WAYMARK_SECRET_KEY"]
    refused = manage("check", **env)
    assert refused.returncode != 0
    assert "WAYMARK_SECRET_KEY is not" in refused.stderr


def test_production_refuses_to_start_without_keys_for_connection_secrets() -> None:
    """Not a key derived from the secret key: production's keys are given, and rotated."""
    from workflows.engine.supervisor import EXIT_CONFIG

    env = {**PRODUCTION_ENV}
    del env["WAYMARK_EFFECTS_SECRET_KEYS"]
    refused = manage("check", **env)
    assert refused.returncode == EXIT_CONFIG, refused.stderr
    assert refused.stderr.startswith(
        "missing_setting: WAYMARK_PRODUCTION is set but WAYMARK_EFFECTS_SECRET_KEYS is not: "
    )
    assert refused.stderr.count("\n") == 1  # one line, no traceback
    not_a_key = manage("check", **{**PRODUCTION_ENV, "WAYMARK_EFFECTS_SECRET_KEYS": "hunter2"})
    assert not_a_key.returncode == EXIT_CONFIG
    assert not_a_key.stderr.startswith("invalid_setting: WAYMARK_EFFECTS_SECRET_KEYS must be")
    assert "hunter2" not in not_a_key.stderr


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("WAYMARK_WORKER_NICE", "ten", "must be a whole number"),
        ("WAYMARK_IO_LEASE_SECONDS", "soon", "must be a number"),
        ("WAYMARK_MAX_REQUEST_BYTES", "1e6", "must be a whole number"),
    ],
)
def test_a_setting_that_does_not_parse_is_one_clear_line_and_exit_78(
    variable: str, value: str, expected: str
) -> None:
    """A management command (runengine, worker, …) with a setting that does not parse says
    which variable and what it expects, with a stable code, in one line (no traceback), and
    exits with 78 (EX_CONFIG), on which runengine's supervisor stops instead of restarting."""
    from workflows.engine.supervisor import EXIT_CONFIG

    refused = manage("check", **{variable: value})
    assert refused.returncode == EXIT_CONFIG, refused.stderr
    assert refused.stderr == f"invalid_setting: {variable} {expected}; unset it for the default\n"
    # The same variable, valid, passes.
    assert manage("check", **{variable: "3"}).returncode == 0


@pytest.mark.parametrize("value", ["nan", "0", "-5", "100000"])
def test_a_settle_patience_out_of_range_is_refused_at_start(value: str) -> None:
    """NaN would make a settle retry for ever, 0 or less give up at the first try."""
    from workflows.engine.supervisor import EXIT_CONFIG

    refused = manage("check", WAYMARK_SETTLE_PATIENCE_SECONDS=value)
    assert refused.returncode == EXIT_CONFIG, refused.stderr
    assert refused.stderr.startswith("invalid_setting: WAYMARK_SETTLE_PATIENCE_SECONDS must")
    assert manage("check", WAYMARK_SETTLE_PATIENCE_SECONDS="300").returncode == 0


def test_a_redis_cache_without_its_package_is_refused_at_start() -> None:
    """WAYMARK_CACHE_URL=redis://… needs the redis package (the `redis` extra): said at
    start-up, not as a 500 at every API request. Where it is installed, the check passes."""
    checked = manage("check", WAYMARK_CACHE_URL="redis://127.0.0.1:6379/1")
    if find_spec("redis") is None:
        assert checked.returncode != 0
        assert "pip install 'waymark[redis]'" in checked.stderr
    else:
        assert checked.returncode == 0, checked.stderr


@pytest.mark.django_db
def test_an_admin_created_key_is_shown_once_on_a_page_not_in_a_cookie() -> None:
    org = Organisation.objects.create(slug="acme", name="Acme")
    boss = User.objects.create_superuser("boss", "boss@example.com", "x-Pass-1234")
    browser = Client()
    browser.force_login(boss)
    page = browser.post(
        "/admin/workflows/apikey/add/",
        {"org": org.pk, "name": "ci", "read_only": "on", "expires_at_0": "", "expires_at_1": ""},
    )
    assert page.status_code == 200, page.content[:500]
    assert "no-store" in page["Cache-Control"]
    key = ApiKey.objects.get(org=org, name="ci")
    raw = page.context["raw_key"]
    assert raw.startswith(f"wmk_{key.prefix}_") and raw.encode() in page.content
    assert key.read_only and raw not in key.key_hash
    assert "messages" not in page.cookies  # the key never travels in the messages cookie
    reader = APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert reader.get("/api/v1/runs").status_code == 200
    assert browser.get("/admin/workflows/apikey/").content.count(raw.encode()) == 0


@pytest.mark.django_db
def test_organisation_members_cannot_raise_their_own_quotas() -> None:
    org = Organisation.objects.create(slug="acme", name="Acme")
    staff = User.objects.create_user("ann", password="x-Pass-1234", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["change_organisation", "view_organisation"])
    )
    Membership.objects.create(user=staff, org=org)
    browser = Client()
    browser.force_login(staff)
    browser.post(
        f"/admin/workflows/organisation/{org.pk}/change/",
        {"slug": "acme", "name": "Acme Ltd", "quota_running_runs": "999999999"},
    )
    org.refresh_from_db()
    assert org.quota_running_runs is None


def test_create_api_key_makes_read_only_expiring_keys(db) -> None:
    Organisation.objects.create(slug="cli-org", name="Cli")
    out, err = StringIO(), StringIO()
    call_command("create_api_key", "--org", "cli-org", "--read-only", "--expires-in-days", "7",
                 stdout=out, stderr=err)  # fmt: skip
    key = ApiKey.objects.get(org__slug="cli-org")
    assert key.read_only and key.expires_at is not None
    assert out.getvalue().strip().startswith(f"wmk_{key.prefix}_")
