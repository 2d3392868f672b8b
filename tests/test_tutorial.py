"""The tutorial (docs/tutorial/) is run as a reader runs it, so it cannot rot.

A copy of the repository in a temporary directory (its own `.data/`: its own embedded
PostgreSQL, demo credentials and secret key, never the developer's) takes every block in the
reader's order (tests/tutorial_blocks.py says how each kind is taken): files are written,
shell blocks run in one shell session (variables carry over), `./waymark run` and the mail
catcher start in the background and are awaited by name, and the reader's clicks in the
admin are made over HTTP with the demo's credentials. The web server and the catcher listen
on free ports instead of the tutorial's 8000 and 1025 (the blocks' text is changed so).

Then it checks what the tutorial promises: each welcome email reached the catcher once, each
run waited on its approval, the first was approved in the admin, the second by a click in
Slack (a stub standing in for slack.com: the reader's connection is pointed at it, and the
click is signed with the signing secret the reader put in `.env`) and the third through the
API, all succeeded, their run pages answer with their steps, and the reader's own test of
the code workflow passed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .processes import ROOT, wait_for
from .stubs.slack import SlackStub
from .test_approvals_setup import click_body, click_payload, slack_signature
from .tutorial_blocks import Block, tutorial_blocks

pytestmark = pytest.mark.long_running

TUTORIAL = ROOT / "docs" / "tutorial"
# The repository as a fresh clone has it; .venv is this test's own environment (nothing is
# installed into it: pyproject.toml is the same), .data is the copy's own.
LEFT_OUT = shutil.ignore_patterns(
    ".git", ".venv", ".data", ".env", "__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache",
    ".pytest_cache", "*.egg-info", "staticfiles", "build", "artifacts", "shop",
)  # fmt: skip
# What the reader's shell has; nothing of this test's own settings or database leaks in.
KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER", "TMPDIR", "PYTHON")
BLOCK_BOUND_SECONDS = 300.0  # a failure's bound, never what a passing block takes
AGAIN = "-again"
# The tutorial's placeholders for the reader's own Slack app and workspace.
SLACK_TOKEN, SLACK_TEAM, SLACK_USER = "xoxb-YOUR-BOT-TOKEN", "T0YOURTEAM", "U0YOURID"
SET_VARIABLE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=", re.MULTILINE)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Reader:
    """One reader at one copy of the repository: a terminal, other terminals, a browser."""

    def __init__(self, work: Path, slack: SlackStub) -> None:
        self.work = work
        self.slack = slack  # slack.com, for the tutorial's Slack connection
        self.web, self.smtp = free_port(), free_port()
        self.env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
        self.env.update(WAYMARK_PORT=str(self.web), PYTHONUNBUFFERED="1")
        self.state = work / ".tutorial-shell-state"
        self.state.write_text("")
        self.background: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self.url = f"http://127.0.0.1:{self.web}"

    def text(self, block: Block) -> str:
        text = block.text.replace("127.0.0.1:8000", f"127.0.0.1:{self.web}")
        # The reader's Slack connection reaches slack.com, its default base URL; this one the
        # stub standing in for it.
        text = text.replace(
            '"provider": "slack_message",',
            f'"provider": "slack_message", "base_url": "{self.slack.url}/api/",',
        )
        return re.sub(r"\b1025\b", str(self.smtp), text)

    # --- the kinds of block --------------------------------------------------------------------

    def write(self, block: Block) -> None:
        path = self.work / block.caption
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text(block))

    def shell(self, block: Block) -> str:
        names = " ".join(SET_VARIABLE.findall(block.text))
        keep = f"declare -p {names} >> {self.state}" if names else ""
        script = f"set -euo pipefail\n. {self.state}\n{self.text(block)}\n{keep}\n"
        try:
            done = subprocess.run(
                ["bash", "-c", script], cwd=self.work, env=self.env, capture_output=True,
                text=True, timeout=BLOCK_BOUND_SECONDS,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{block.where} still running after {exc.timeout:g}s") from None
        assert done.returncode == 0, (
            f"{block.where} exited {done.returncode}:\n{block.text}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
        return done.stdout

    def start(self, block: Block) -> None:
        # "<name>-again[-why]" is <name> started again in its terminal, after Ctrl-C there.
        name = block.name.split(AGAIN)[0]
        if name in self.background:
            self.interrupt(name)
        log = self.work / f".tutorial-{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                ["bash", "-c", self.text(block)], cwd=self.work, env=self.env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.background[name] = (process, log)
        READY[name](self, process, log)

    def interrupt(self, name: str) -> None:
        process, log = self.background.pop(name)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise AssertionError(f"{name} did not stop on Ctrl-C:\n{log.read_text()}") from None

    def stop_everything(self) -> None:
        for name in list(self.background):
            with contextlib.suppress(AssertionError, ProcessLookupError):
                self.interrupt(name)
        subprocess.run(
            ["./waymark", "manage", "embedded_db", "stop"], cwd=self.work, env=self.env,
            capture_output=True, timeout=120,
        )  # fmt: skip

    # --- what the test reads, as the reader would see it ----------------------------------------

    def log(self, name: str) -> str:
        return self.background[name][1].read_text(errors="replace")

    def api(self, path: str) -> Any:
        credentials = json.loads((self.work / ".data" / "demo-credentials.json").read_text())
        answer = httpx.get(
            f"{self.url}/api/v1/{path}",
            headers={"Authorization": f"Bearer {credentials['api_key']}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def runs_of(self, automation: str) -> list[dict[str, Any]]:
        listed = self.api(f"runs?automation={automation}")["results"]
        return [self.api(f"runs/{run['id']}") for run in listed]

    @contextlib.contextmanager
    def browser(self) -> Iterator[httpx.Client]:
        """A logged-in admin session, with the password the first `./waymark run` printed."""
        credentials = json.loads((self.work / ".data" / "demo-credentials.json").read_text())
        with httpx.Client(base_url=self.url, timeout=30) as client:
            yield self._logged_in(client, credentials)

    @staticmethod
    def _logged_in(client: httpx.Client, credentials: dict[str, str]) -> httpx.Client:
        page = client.get("/admin/login/")
        client.post("/admin/login/?next=/admin/", data={
            "csrfmiddlewaretoken": csrf_of(page.text), "username": credentials["admin_user"],
            "password": credentials["admin_password"], "next": "/admin/",
        })  # fmt: skip
        assert client.get("/admin/").status_code == 200, "the demo admin could not log in"
        return client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


# --- readiness of what runs in another terminal, by the block's name ----------------------------


def engine_ready(reader: Reader, process: subprocess.Popen[bytes], log: Path) -> None:
    def answers() -> bool:
        assert process.poll() is None, f"./waymark run exited:\n{log.read_text()}"
        try:
            return httpx.get(f"{reader.url}/livez", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, timeout=600, what="./waymark run to answer on /livez")


def catcher_ready(reader: Reader, process: subprocess.Popen[bytes], log: Path) -> None:
    def listens() -> bool:
        assert process.poll() is None, f"the mail catcher exited:\n{log.read_text()}"
        try:
            socket.create_connection(("127.0.0.1", reader.smtp), timeout=2).close()
        except OSError:
            return False
        return True

    wait_for(listens, what="the mail catcher to listen")


READY: dict[str, Callable[[Reader, subprocess.Popen[bytes], Path], None]] = {
    "tutorial-run-engine": engine_ready,
    "tutorial-mail-catcher": catcher_ready,
}


# --- what the reader does in the browser, and waits for, by the block's name --------------------


def decide_in_admin(reader: Reader) -> None:
    """Admin > Approval requests: open the request, press Approve."""
    with reader.browser() as browser:
        _approve_in_admin(reader, browser)


def _approve_in_admin(reader: Reader, browser: httpx.Client) -> None:
    inbox = "/admin/approvals/approvalrequest/"

    def listed() -> str | None:
        found = re.search(
            r"/admin/approvals/approvalrequest/(\d+)/review/", browser.get(inbox).text
        )
        return found.group(0) if found else None

    # The run sends its email and waits ten seconds first: a bound, not what it takes.
    review = wait_for(listed, timeout=300, what="the approval in the admin inbox")
    (run,) = reader.runs_of("welcome")
    assert run["status"] == "running"  # it waits on the person, holding no worker
    page = browser.get(review)
    assert "Send Ada a welcome gift?" in page.text
    digest = re.search(r'name="digest" value="([0-9a-f]{64})"', page.text)
    assert digest, "the review page shows no digest to decide on"
    decided = browser.post(review, data={
        "csrfmiddlewaretoken": csrf_of(page.text), "digest": digest.group(1),
        "comment": "", "decision": "approve",
    })  # fmt: skip
    assert decided.status_code == 302, decided.text


def link_slack_user(reader: Reader) -> None:
    """Admin > Memberships > Add (the admin in demo), then Admin > Slack users > Add: the
    reader's Slack user, deciding as the admin."""
    with reader.browser() as browser:
        page = browser.get("/admin/workflows/membership/add/")
        assert page.status_code == 200, page.text
        added = browser.post("/admin/workflows/membership/add/", data={
            "csrfmiddlewaretoken": csrf_of(page.text), "user": option(page.text, "user", "admin"),
            "org": option(page.text, "org", "demo"), "_save": "Save",
        })  # fmt: skip
        assert added.status_code == 302, errors_of(added.text)
        page = browser.get("/admin/approvals/slackuser/add/")
        assert page.status_code == 200, page.text
        added = browser.post("/admin/approvals/slackuser/add/", data={
            "csrfmiddlewaretoken": csrf_of(page.text), "org": option(page.text, "org", "demo"),
            "team_id": SLACK_TEAM, "slack_user_id": SLACK_USER,
            "user": option(page.text, "user", "admin"), "_save": "Save",
        })  # fmt: skip
        assert added.status_code == 302, errors_of(added.text)


def approve_in_slack(reader: Reader) -> None:
    """The request's message in the channel; the reader presses Approve, and Slack sends the
    click, signed with the app's signing secret, to /slack/interactions."""

    def posted() -> dict[str, Any] | None:
        for run in reader.runs_of("welcome"):  # a run that ended will never ask: say so
            assert run["status"] in ("running", "succeeded"), (run["status"], run["error"])
        return next((m for m in reader.slack.messages if "Linus" in json.dumps(m)), None)

    message = wait_for(posted, timeout=300, what="the request's message in Slack")
    secret = env_value(reader.work / ".env", "WAYMARK_SLACK_SIGNING_SECRET")
    body = click_body(click_payload(message, user=SLACK_USER, team=SLACK_TEAM))
    stamp = str(int(time.time()))
    answer = httpx.post(f"{reader.url}/slack/interactions", content=body, timeout=30, headers={
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": slack_signature(secret, stamp, body),
    })  # fmt: skip
    assert (answer.status_code, answer.json().get("code")) == (200, "received"), answer.text


def option(html: str, field: str, label: str) -> str:
    """The value of the <option> labelled ``label`` in the form's ``field`` select."""
    select = re.search(rf'<select name="{field}".*?</select>', html, re.S)
    assert select, f"no {field} choice on the page"
    found = re.search(rf'<option value="(\d+)"[^>]*>{re.escape(label)}</option>', select.group(0))
    assert found, f"no {label!r} among the {field} choices"
    return found.group(1)


def errors_of(html: str) -> list[str]:
    """What an admin form said was wrong."""
    return re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', html, re.S) or [html[:2000]]


def env_value(path: Path, name: str) -> str:
    found = re.search(rf"^{name}=(.*)$", path.read_text(), re.M)
    assert found, f"{name} is not in {path}"
    return found.group(1).strip()


BROWSER: dict[str, Callable[[Reader], None]] = {
    "tutorial-decide-in-admin": decide_in_admin,
    "tutorial-link-slack-user": link_slack_user,
    "tutorial-approve-in-slack": approve_in_slack,
}
# What the test does for the reader before a block (none: every block waits for what it needs
# itself, as the reader runs it).
BEFORE: dict[str, Callable[[Reader], None]] = {}


@pytest.fixture
def reader() -> Iterator[Reader]:
    # A short path: the embedded server's socket lives under it.
    work = Path(tempfile.mkdtemp(prefix="wm-tutorial-"))
    shutil.copytree(ROOT, work, ignore=LEFT_OUT, dirs_exist_ok=True)
    (work / ".venv").symlink_to(sys.prefix)  # the environment this test runs in
    with SlackStub(valid_tokens=(SLACK_TOKEN,)) as slack:
        it = Reader(work, slack)
        try:
            yield it
        finally:
            it.stop_everything()
            shutil.rmtree(work, ignore_errors=True)
        assert not slack.errors, slack.errors


def test_every_block_of_the_tutorial_runs_as_written_and_does_what_it_says(
    reader: Reader,
) -> None:
    blocks = tutorial_blocks(TUTORIAL)
    outputs: dict[str, str] = {}
    for block in blocks:
        if block.name in BEFORE:
            BEFORE[block.name](reader)
        match block.kind:
            case "file":
                reader.write(block)
            case "shell":
                outputs[block.where] = reader.shell(block)
            case "background":
                reader.start(block)
            case "browser":
                BROWSER[block.name](reader)

    # Part 1: the first run printed the admin's URL, user and password; the second, where
    # they are kept. The demo's runs are listed on the terminal.
    credentials = json.loads((reader.work / ".data" / "demo-credentials.json").read_text())
    engine = reader.log("tutorial-run-engine")
    assert f"admin:      {reader.url}/admin/" in engine, engine
    assert f"password:   {credentials['admin_password']}" in engine, engine
    assert "password:   unchanged (kept in" in engine, engine
    assert any("follow-up@1" in out for out in outputs.values()), outputs

    # Each welcome reached the catcher, once, with the key the ledger recorded it under.
    mail = reader.log("tutorial-mail-catcher")
    assert mail.count("Subject: Welcome, Ada") == 1, mail
    assert mail.count("Subject: Welcome, Linus") == 1, mail
    assert mail.count("Subject: Welcome, Grace") == 1, mail
    assert mail.count("X-Waymark-Effect-Key:") == 3, mail

    slack_run, json_run = reader.runs_of("welcome")  # newest first
    (code_run,) = reader.runs_of("welcome-code")
    runs = (json_run, slack_run, code_run)
    assert (json_run["status"], json_run["output"]) == ("succeeded", {"gift": True})
    assert (slack_run["status"], slack_run["output"]) == ("succeeded", {"gift": True})
    # Asked in Slack once (the ledger's key), decided by the click, the message updated.
    (asked,) = [m for m in reader.slack.messages if "Linus" in json.dumps(m)]
    assert asked["channel"] == "C0YOURCHANNEL"
    wait_for(lambda: bool(reader.slack.updates), what="the message updated once decided")
    assert code_run["status"] == "succeeded", code_run
    assert code_run["output"]["gift"] is True
    assert code_run["output"]["decided_by"].startswith("api_key:")
    decided = {a["run"]: a for a in reader.api("approvals?status=approved")["results"]}
    assert (decided[json_run["id"]]["decided_by"], decided[json_run["id"]]["decided_via"]) == (
        "admin",
        "admin",
    )
    assert decided[code_run["id"]]["decided_via"] == "api"
    assert (decided[slack_run["id"]]["decided_by"], decided[slack_run["id"]]["decided_via"]) == (
        "admin",
        "slack",
    )

    # The run pages answer, with the steps the tutorial names.
    with reader.browser() as browser:
        pages = [browser.get(f"/admin/workflows/run/{run['id']}/change/") for run in runs]
    for run, page in zip(runs, pages, strict=True):
        assert page.status_code == 200
        done = re.findall(r'<tr class="step step-done"[^>]*data-step="(\w+)"', page.text)
        assert {"welcome", "pause", "gift"} <= set(done), (run["id"], done)

    # The reader's own test of the code workflow ran, and passed.
    assert any("1 passed" in out for out in outputs.values()), outputs


def test_every_block_is_one_the_tutorial_test_knows_how_to_take() -> None:
    kinds = [block.kind for block in tutorial_blocks(TUTORIAL)]
    assert {"file", "shell", "background", "browser"} <= set(kinds)
    names = {b.name.split(AGAIN)[0] for b in tutorial_blocks(TUTORIAL) if b.name}
    assert names <= set(READY) | set(BROWSER) | set(BEFORE), names - set(READY)
