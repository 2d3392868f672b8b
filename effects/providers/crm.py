"""The ``crm_upsert`` provider: create or update a CRM record by its external id.

``PUT {base_url}/{object}/{external_id}`` with the fields as JSON. An upsert by external id
is its own idempotency: repeating it leaves one record, so an unknown outcome is simply
repeated, for ever. The lookup is a GET of the same URL.

A redirect is refused, never followed (``http.refuse_redirect``): it upserted nothing, and
following it would carry the credentials to a host nobody vetted for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from workflows.plugins import StepFailure, render

from .base import Answer, ConnectionInfo, Provider, Request
from .http import auth_headers, raise_for_status, refuse_redirect, send, summary


def record_url(conn: ConnectionInfo | None, payload: Mapping[str, Any]) -> str:
    base = (conn.base_url if conn else "").rstrip("/")
    return f"{base}/{quote(payload['object'], safe='')}/{quote(payload['external_id'], safe='')}"


class CrmUpsertProvider(Provider):
    name = "crm_upsert"
    idempotency_keys = True  # the external id is the key, and the provider never forgets it
    key_retention_seconds = None

    def prepare(
        self, step: Mapping[str, Any], context: Mapping[str, Any], conn: ConnectionInfo | None
    ) -> Request:
        external_id = str(render(step["external_id"], dict(context))).strip()
        if not external_id:
            raise StepFailure("external_id rendered empty", retryable=False)
        fields = render(step.get("fields", {}), dict(context))
        payload = {"object": step["object"], "external_id": external_id, "fields": fields}
        return Request(payload=payload, summary=payload)

    def call(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer:
        url = record_url(conn, request.payload)
        headers = {**auth_headers(conn, url), "Idempotency-Key": key}
        response = send(conn, "PUT", url, json=request.payload["fields"], headers=headers)
        refuse_redirect(response, "the CRM")
        raise_for_status(response, keyed=False)
        said = summary(response)
        return Answer(result=said, response=said)

    def lookup(self, request: Request, key: str, conn: ConnectionInfo | None) -> Answer | None:
        url = record_url(conn, request.payload)
        response = send(conn, "GET", url, headers=auth_headers(conn, url))
        if response.status_code == 404:
            return None
        refuse_redirect(response, "the CRM")
        raise_for_status(response, keyed=False)
        return Answer(result={**summary(response), "reconciled": True})

    def probe(self, conn: ConnectionInfo) -> None:
        url = str(conn.options.get("health_url") or conn.base_url)
        response = send(conn, "GET", url, headers=auth_headers(conn, url))  # base_url's origin only
        refuse_redirect(response, "the CRM")
        raise_for_status(response, keyed=False)
