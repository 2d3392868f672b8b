"""The demo set-up behind ``./waymark run``: idempotent, safe to run on every start.

The admin user and the demo API key are made once. Their secrets are printed when they are
made, and kept in ``.data/demo-credentials.json`` (git-ignored, mode 600) for this machine's
convenience; later starts only say where they are. An existing user is never changed: a
password changed in the admin keeps working, and a superuser demoted stays demoted.
A given WAYMARK_ADMIN_PASSWORD must pass the password validators.

Production (``WAYMARK_PRODUCTION=1``) refuses it (``demo_refused_in_production``) before it
creates anything: a superuser whose password is printed and kept in a file, and an API key
kept beside it, have no place there.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from ..errors import WaymarkError
from ..models import ApiKey, AutomationVersion
from ..production import in_production
from ..services.automations import automation_publish_definition
from ..services.tenancy import api_key_create, organisation_ensure

DEMO_ORG = "demo"
DEMO_AUTOMATION = "follow-up"
DEFINITION_FILE = Path(__file__).with_name("follow-up.json")


@dataclass
class DemoSetup:
    admin_user: str
    admin_password: str | None  # None: not made by this call (see credentials_file)
    api_key: str | None  # None: not made by this call
    version: AutomationVersion
    credentials_file: Path
    password_kept: bool = True  # the file holds the user's password (made by an earlier call)


class DemoPasswordRejected(WaymarkError):
    code = "invalid_admin_password"
    default_detail = "WAYMARK_ADMIN_PASSWORD is refused: {reasons}"


class DemoRefusedInProduction(WaymarkError):
    code = "demo_refused_in_production"
    default_detail = (
        "WAYMARK_PRODUCTION is set: the demo (a superuser with a printed password, an API key "
        "kept in a file) is not created in production. Create accounts with `manage.py "
        "createsuperuser`, API keys with `manage.py create_api_key --org SLUG`, and run the "
        'engine with `manage.py runengine` (docs/how-to/production.md, "Production").'
    )


class DemoDataDirMissing(WaymarkError):
    code = "missing_setting"
    default_detail = (
        "settings.DATA_DIR is not set: the demo keeps its credentials there "
        "(DATA_DIR / demo-credentials.json; docs/how-to/embed-in-django.md)."
    )


def _credentials_file() -> Path:
    data_dir = getattr(settings, "DATA_DIR", None)
    if not data_dir:
        raise DemoDataDirMissing()
    return Path(data_dir) / "demo-credentials.json"


def _load() -> dict[str, str]:
    path = _credentials_file()
    return json.loads(path.read_text()) if path.exists() else {}


def _save(data: dict[str, str]) -> None:
    path = _credentials_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    path.chmod(0o600)


def _key_still_valid(raw: str | None) -> bool:
    if not raw:
        return False
    prefix = raw.split("_")[1] if raw.count("_") >= 2 else ""
    key = ApiKey.objects.filter(prefix=prefix, org__slug=DEMO_ORG).first()
    return key is not None and key.revoked_at is None and key.matches(raw)


def bootstrap_demo(*, admin_user: str = "admin", admin_password: str | None = None) -> DemoSetup:
    if in_production():
        raise DemoRefusedInProduction()
    saved = _load()
    with transaction.atomic():
        org = organisation_ensure(slug=DEMO_ORG, name="Demo organisation")
        password = _make_admin(admin_user, admin_password)
        raw_key = None
        if not _key_still_valid(saved.get("api_key")):
            _, raw_key = api_key_create(org=org, name="demo")
    version = automation_publish_definition(
        org=org,
        slug=DEMO_AUTOMATION,
        definition=json.loads(DEFINITION_FILE.read_text()),
        name="Demo follow-up",
    )
    if password is not None or raw_key is not None:
        made = {"admin_user": admin_user, "admin_password": password, "api_key": raw_key}
        _save({**saved, **{name: value for name, value in made.items() if value is not None}})
    kept = password is not None or (saved.get("admin_user", admin_user) == admin_user
                                    and "admin_password" in saved)  # fmt: skip
    return DemoSetup(admin_user, password, raw_key, version, _credentials_file(), kept)


def _make_admin(username: str, given: str | None) -> str | None:
    """Create the demo superuser with the given (validated) or a generated password, and
    return that password; None when the user exists already (it is left as it is)."""
    users = get_user_model()
    if users.objects.filter(username=username).exists():
        return None
    user = users(username=username, is_staff=True, is_superuser=True)
    password = given or secrets.token_urlsafe(12)
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise DemoPasswordRejected(reasons=" ".join(exc.messages)) from exc
    user.set_password(password)
    user.save()
    return password
