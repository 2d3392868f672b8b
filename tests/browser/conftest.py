"""Browser tests: Playwright driving the system Chromium against pytest-django's live server.

Playwright's own browser download is never used (there is none to fetch): ``./waymark test``
installs the distribution's Chromium when it is missing. Without Chromium these tests fail,
saying how to get it; they never skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connections
from playwright.sync_api import Browser, Page, expect, sync_playwright

CHROMIUM = os.environ.get("WAYMARK_CHROMIUM", "/usr/bin/chromium")
PASSWORD = "browser-test-password"
TIMEOUT_MS = 15_000  # generous: a loaded CI machine is slow, and a passing wait returns at once

expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(
            f"The browser tests need Chromium at {CHROMIUM}. Run ./waymark test (it installs it "
            "with apt-get), or apt-get install -y chromium, or set WAYMARK_CHROMIUM.",
            pytrace=False,
        )
    return CHROMIUM


@pytest.fixture
def browser(chromium_path: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    # Playwright's sync API keeps an asyncio loop registered on this thread while it runs,
    # so Django would take the test's own ORM calls for calls from async code and refuse them.
    # Nothing here is async: the live server answers from its own thread.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()
            # Under that loop Django keeps the test's connections apart from the thread's
            # usual ones; close them here, or they outlive the test (and block dropping the
            # test database at the end of the session).
            connections.close_all()


def logged_in_page(
    browser: Browser, base_url: str, username: str, password: str = PASSWORD
) -> Page:
    """A fresh browser context, logged in through the admin's login form."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto("/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")
    return page


def make_user(username: str, *, is_superuser: bool = False) -> User:
    return User.objects.create_user(
        username, password=PASSWORD, is_staff=True, is_superuser=is_superuser
    )
