"""The Python examples of the code workflows' guides run as shown: the test helper's
example (docs/how-to/test-a-code-workflow.md), its workflow and its test, executed from the
page's text against the provider stub, with the fixtures the page says a host writes."""

from __future__ import annotations

import re
from typing import Any

import pytest

from workflows.code.registry import registered, unregister
from workflows.models import Organisation

from .effect_setup import connect
from .processes import ROOT
from .stubs import ProviderStub

pytestmark = pytest.mark.django_db(transaction=True)

GUIDE = ROOT / "docs" / "how-to" / "test-a-code-workflow.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_test_helpers_example_runs_as_its_page_shows(
    org: Organisation, provider_stub: ProviderStub
) -> None:
    example = python_blocks(GUIDE.read_text())[0]
    assert "def test_an_order_is_charged_once_paid(org, payments_stub)" in example
    # The page's `org` fixture: a "payments" connection at the stub, loopback allowed.
    connect(org, base_url=provider_stub.url, name="payments")
    page: dict[str, Any] = {}
    exec(compile(example, str(GUIDE), "exec"), page)  # noqa: S102 (the page's own code)
    try:
        assert registered("order-fulfilment", 2) is not None
        page["test_an_order_is_charged_once_paid"](org, provider_stub)
    finally:
        unregister("order-fulfilment", 2)
    (charged,) = provider_stub.created
    assert charged["body"] == {"amount": 12}
