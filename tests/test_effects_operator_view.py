"""What an operator sees of an effect: the key the provider was sent, and why a refused call
failed.

The ledger keys an effect by ``run/step/iteration``; providers are sent that key with a
random part (``Effect.external_key``), so the API's ``key`` and the admin show that full key,
the one to look the effect up by at the provider. A call the egress guard refused fails its
step with an error starting ``egress_refused:``, as an unsendable one starts
``invalid_request:``, and not only in the run's history.
"""

from __future__ import annotations

import re

import pytest
from django.test import Client
from rest_framework.test import APIClient

from effects.models import Effect, EgressAllow
from workflows.models import Organisation, Run, RunEvent, Step

from .effect_setup import connect, drive, one_step, post_item, start
from .stubs import ProviderStub, SmtpStub

pytestmark = pytest.mark.django_db(transaction=True)

ADMIN = "/admin/effects/effect"


def made_effect(org: Organisation, provider_stub: ProviderStub) -> tuple[Effect, str]:
    """An http step that created an item at the stub; its effect and the key the stub got."""
    connect(org, base_url=provider_stub.url)
    run_id = start(org, one_step(post_item(provider_stub.url)))
    drive()
    assert Run.objects.get(pk=run_id).status == "succeeded"
    [item] = provider_stub.created
    return Effect.objects.get(run_id=run_id), item["key"]


def test_the_api_shows_the_key_the_provider_received(
    api: APIClient, org: Organisation, provider_stub: ProviderStub
) -> None:
    effect, received = made_effect(org, provider_stub)

    detail = api.get(f"/api/v1/effects/{effect.pk}").json()
    [listed] = api.get(f"/api/v1/effects?run={effect.run_id}").json()["results"]

    assert detail["key"] == received and listed["key"] == received
    # The ledger's key, a colon and the random part: not the ledger's key alone.
    assert re.fullmatch(rf"{effect.run_id}/send/1:[0-9a-f]{{12}}", received), received
    assert (detail["run"], detail["step_id"], detail["iteration"]) == (effect.run_id, "send", 1)


def test_the_admin_shows_and_finds_the_key_the_provider_received(
    admin_client: Client, org: Organisation, provider_stub: ProviderStub
) -> None:
    effect, received = made_effect(org, provider_stub)
    random_part = received.rpartition(":")[2]

    listed = admin_client.get(f"{ADMIN}/").content.decode()
    page = admin_client.get(f"{ADMIN}/{effect.pk}/change/").content.decode()
    found = admin_client.get(f"{ADMIN}/?q={random_part}").content.decode()
    missed = admin_client.get(f"{ADMIN}/?q=0{random_part}").content.decode()

    assert received in listed and received in page
    assert f"{ADMIN}/{effect.pk}/change/" in found
    assert f"{ADMIN}/{effect.pk}/change/" not in missed


@pytest.mark.parametrize("url", ["http://10.0.0.1/items", "http://127.0.0.1:9/items"])
def test_a_refused_address_fails_the_step_with_egress_refused(org: Organisation, url: str) -> None:
    """No allowlist: a private address and loopback are refused before anything is sent."""
    step = {"type": "http", "request": {"method": "POST", "url": url, "body": {}}}
    run_id = start(org, one_step(step))
    drive()

    failed = Step.objects.get(run_id=run_id, step_id="send")
    assert failed.status == "failed" and failed.attempt == 1  # not retried
    assert failed.error.startswith("egress_refused: "), failed.error
    assert failed.error.count("egress_refused") == 1, failed.error
    [event] = RunEvent.objects.filter(run_id=run_id, kind="effect.failed")
    assert event.detail is not None and event.detail["class"] == "egress_refused"
    assert Run.objects.get(pk=run_id).status == "failed"


def test_a_refused_mail_server_fails_the_step_with_egress_refused(
    org: Organisation, smtp_stub: SmtpStub
) -> None:
    connect(org, provider="email", name="mail",
            options={"host": smtp_stub.host, "port": smtp_stub.port})  # fmt: skip
    EgressAllow.objects.filter(org=org).delete()  # the stub listens on loopback
    email = {"type": "email", "connection": "mail", "to": "ann@example.com", "subject": "Hi",
             "body": "Hello"}  # fmt: skip
    run_id = start(org, one_step(email, output="{{ steps.send.output }}"))
    drive()

    failed = Step.objects.get(run_id=run_id, step_id="send")
    assert failed.status == "failed", (failed.status, failed.error)
    assert failed.error.startswith("egress_refused: "), failed.error
    assert smtp_stub.messages == []
