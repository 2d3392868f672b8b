"""Fixtures that start a stub before the test and stop it after. A module that uses them
imports them (`from tests.stubs.fixtures import provider_stub`) or a conftest does.

Teardown fails the test if the stub itself raised (it answers 500 then): that is a bug in the
stub or in how the test drives it, not a behaviour of the code under test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .model import ModelStub
from .provider import ProviderStub
from .slack import SlackStub
from .smtp import SmtpStub


@pytest.fixture
def provider_stub() -> Iterator[ProviderStub]:
    """Not idempotent, no lookup, no token: set `idempotent`, `lookup`, `require_token()`."""
    with ProviderStub() as stub:
        yield stub
    assert not stub.errors, stub.errors


@pytest.fixture
def model_stub() -> Iterator[ModelStub]:
    with ModelStub() as stub:
        yield stub
    assert not stub.errors, stub.errors


@pytest.fixture
def slack_stub() -> Iterator[SlackStub]:
    """Accepts the token "xoxb-stub" (see `valid_tokens`)."""
    with SlackStub() as stub:
        yield stub
    assert not stub.errors, stub.errors


@pytest.fixture
def smtp_stub() -> Iterator[SmtpStub]:
    with SmtpStub() as stub:
        yield stub
