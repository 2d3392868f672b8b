"""What tests/test_packaging.py asks the host project, each answer one line of JSON.

Run with the host's own Python (the fresh virtual environment holding Waymark's wheel), from
the host project's directory, so every Waymark module comes from the installed package:

    python hostcheck.py origins           where Waymark's packages and templates were found
    python hostcheck.py start KEY [AUTOMATION]  start a run (of "hello") through the API
    python hostcheck.py wait RUN SECONDS  the run's detail from the API once it has finished
    python hostcheck.py pages RUN         admin pages and a Slack message, rendered
"""

import json
import os
import sys
import time
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.template import engines  # noqa: E402
from django.template.loader import render_to_string  # noqa: E402
from django.test import Client  # noqa: E402

TEMPLATES = [
    "admin/workflows/run/change_form.html",
    "admin/workflows/run/timeline.html",
    "admin/workflows/apikey/created.html",
    "admin/locked_out.html",
    "admin/effects/connection/change_form.html",
    "admin/effects/effect/resolve.html",
    "admin/approvals/inbox.html",
    "approvals/slack_request.json",
    "approvals/slack_task.json",
    "admin/webhooks/subscription/secret.html",
]


def origins() -> Any:
    import approvals
    import effects
    import timers
    import waymark_config
    import webhooks
    import workflows
    from workflows.demo.bootstrap import DEFINITION_FILE

    modules = [approvals, effects, timers, waymark_config, webhooks, workflows]
    engine = engines["django"].engine  # type: ignore[attr-defined]
    return {
        "modules": {m.__name__: m.__file__ for m in modules},
        "templates": {name: engine.get_template(name).origin.name for name in TEMPLATES},
        "demo_definition": str(DEFINITION_FILE),
        "demo_steps": len(json.loads(DEFINITION_FILE.read_text())["steps"]),
    }


def api(key: str) -> Client:
    return Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Bearer {key}")


def start(key: str, automation: str = "hello") -> Any:
    body = {"automation": automation, "start_key": f"{automation}-1", "input": {"name": "host"}}
    response = api(key).post("/api/v1/runs", body, content_type="application/json")
    return {"status_code": response.status_code, **response.json()}


def wait(key: str, run_id: str, seconds: float) -> Any:
    """Bounded: the run's last state after ``seconds`` if it has not finished by then."""
    deadline = time.monotonic() + seconds
    while True:
        detail = api(key).get(f"/api/v1/runs/{run_id}").json()
        if detail.get("status") in ("succeeded", "failed", "cancelled"):
            return detail
        if time.monotonic() > deadline:
            return detail
        time.sleep(0.2)


def pages(run_id: str) -> Any:
    user, _ = get_user_model().objects.get_or_create(
        username="host-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    found = {}
    for name, path in [
        ("run", f"/admin/workflows/run/{run_id}/change/"),
        ("inbox", "/admin/approvals/approvalrequest/"),
        ("connection", "/admin/effects/connection/add/"),
        ("metrics", "/metrics"),
    ]:
        response = client.get(path)
        found[name] = {"status": response.status_code, "html": response.content.decode()}
    values = {
        **{"title": "Approval requested", "message": "Ship it?", "context_line": "Run 1"},
        **{"open": True, "buttons": True, "approval_id": 7, "details": "", "notice": ""},
        **{"outcome_line": "", "approve_token": "yes-token", "reject_token": "no-token"},
    }
    found["slack"] = json.loads(render_to_string("approvals/slack_request.json", values))
    return found


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "origins":
        result = origins()
    elif command == "start":
        result = start(*args)
    elif command == "wait":
        result = wait(args[0], args[1], float(args[2]))
    else:
        result = pages(args[0])
    print(json.dumps(result, default=str))
