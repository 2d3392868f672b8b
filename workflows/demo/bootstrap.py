"""The demo set-up behind ``./waymark run``: idempotent, safe to run on every start.

Credentials for the demo live in ``.data/demo-credentials.json`` (git-ignored, mode 600) so a
second run prints the same admin password and API key instead of minting new ones. This is a
local convenience: real API keys are shown once and only their hash is stored.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from ..models import ApiKey, AutomationVersion
from ..services.automations import automation_publish_definition
from ..services.tenancy import api_key_create, organisation_ensure

DEMO_ORG = "demo"
DEMO_AUTOMATION = "follow-up"
DEFINITION_FILE = Path(__file__).with_name("follow-up.json")


@dataclass
class DemoSetup:
    admin_user: str
    admin_password: str
    api_key: str
    version: AutomationVersion


def _credentials_file() -> Path:
    return Path(settings.DATA_DIR) / "demo-credentials.json"


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
    saved = _load()
    with transaction.atomic():
        org = organisation_ensure(slug=DEMO_ORG, name="Demo organisation")
        password = admin_password or saved.get("admin_password") or secrets.token_urlsafe(12)
        user, created = get_user_model().objects.get_or_create(
            username=admin_user, defaults={"is_staff": True, "is_superuser": True}
        )
        if created or admin_password or not user.check_password(password):
            user.is_staff = user.is_superuser = True
            user.set_password(password)
            user.save()
        raw_key = saved.get("api_key")
        if not _key_still_valid(raw_key):
            _, raw_key = api_key_create(org=org, name="demo")
        assert raw_key is not None
    version = automation_publish_definition(
        org=org,
        slug=DEMO_AUTOMATION,
        definition=json.loads(DEFINITION_FILE.read_text()),
        name="Demo follow-up",
    )
    _save({"admin_user": admin_user, "admin_password": password, "api_key": raw_key})
    return DemoSetup(admin_user, password, raw_key, version)
