"""Effect step types: http, email, slack_message, model and crm_upsert.

Each does work outside the walk (lane "io", or "slow" for model) through the effect ledger
(``effects/ledger.py``) and finishes with the outcome "ok"; a step that contacts a person
(email, slack_message) finishes with "suppressed" instead when the address is on the
organisation's suppression list at send time (nothing is sent). Registered from
``EffectsConfig.ready()``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from workflows.plugins import (
    RetryPolicy,
    StepReport,
    StepType,
    check_choice,
    check_fields,
    check_int,
    check_number,
    check_object,
    check_string,
    check_template_field,
    check_template_value,
    register_step_type,
)

from .perform import executor_for_provider

EFFECT_OUTCOMES = frozenset({"ok", "failed"})
OK = frozenset({"ok"})  # the outcome that means the effect was made (a compensation counts)
CONTACT_OUTCOMES = frozenset({"ok", "failed", "suppressed"})
# Provider failures that no retry fixes: a refused request, a refused address, revoked
# credentials (those park the step instead), an unknown connection.
NOT_RETRYABLE = frozenset({"bad_request", "egress_refused", "auth", "unknown_connection"})
EFFECT_RETRY = RetryPolicy(non_retryable=NOT_RETRYABLE)
# Model calls cost money on every attempt: few retries, long backoff.
MODEL_RETRY = RetryPolicy(max_attempts=2, base_seconds=5.0, cap_seconds=300.0,
                          non_retryable=NOT_RETRYABLE)  # fmt: skip
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
CONNECTION_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
MAX_MODEL_TOKENS = 100_000
MAX_MODEL_BUDGET = 100_000


def effect_outcomes(step: Mapping[str, Any]) -> frozenset[str]:
    return EFFECT_OUTCOMES


def contact_outcomes(step: Mapping[str, Any]) -> frozenset[str]:
    return CONTACT_OUTCOMES


def _check_connection(step: Mapping[str, Any], report: StepReport) -> None:
    check_string(
        step,
        "connection",
        report,
        required=False,
        max_length=100,
        pattern=CONNECTION_NAME_RE,
        hint=": a connection name is letters, digits, _ . or -",
    )


# --- http -----------------------------------------------------------------------------------


def validate_http(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("request", "connection"))
    _check_connection(step, report)
    request = check_object(step, "request", report)
    if request is None:
        return
    check_fields(request, report, ("method", "url", "headers", "body"), prefix="request.")
    check_choice(request, "method", report, HTTP_METHODS, prefix="request.")
    url = check_template_field(request, "url", report, prefix="request.")
    if url is not None:
        starts_with_template = url.lstrip().startswith(("{{", "{%"))
        if not starts_with_template and not url.lower().startswith(("http://", "https://")):
            report.error("request.url", "must start with http:// or https://")
    headers = check_object(request, "headers", report, required=False, prefix="request.")
    if headers is not None:
        for name, value in headers.items():
            field = f"request.headers.{name}"
            if not isinstance(name, str) or HEADER_NAME_RE.fullmatch(name) is None:
                report.error(field, "is not a valid HTTP header name")
            elif not isinstance(value, str):
                report.error(field, "must be a string (a template)")
            else:
                check_template_field(headers, name, report, prefix="request.headers.")
    check_template_value(request, "body", report, prefix="request.")


HTTP = StepType(
    name="http",
    lane="io",
    validate=validate_http,
    execute=executor_for_provider("http"),
    built=True,
    outcomes=effect_outcomes,
    success_outcomes=OK,
    retry=EFFECT_RETRY,
    app="effects",
    context_on_read=True,  # its provider renders dict(context)
)


# --- email ----------------------------------------------------------------------------------


def validate_email(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("to", "subject", "body", "connection"))
    for key in ("to", "subject", "body"):
        check_template_field(step, key, report)
    _check_connection(step, report)


def validate_email_connection(step: Mapping[str, Any], report: StepReport) -> None:
    validate_email(step, report)
    if "connection" not in step:
        report.issue("missing_field", "connection", "is required (the mail server to send through)")


EMAIL = StepType(
    name="email",
    lane="io",
    validate=validate_email_connection,
    execute=executor_for_provider("email", channel="email"),
    built=True,
    outcomes=contact_outcomes,
    success_outcomes=OK,
    retry=EFFECT_RETRY,
    app="effects",
    context_on_read=True,  # its provider renders dict(context)
)


# --- slack_message --------------------------------------------------------------------------


def validate_slack_message(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("channel", "text", "connection"))
    check_template_field(step, "channel", report)
    check_template_field(step, "text", report)
    _check_connection(step, report)
    if "connection" not in step:
        report.issue("missing_field", "connection", "is required (the Slack workspace to post to)")


SLACK_MESSAGE = StepType(
    name="slack_message",
    lane="io",
    validate=validate_slack_message,
    execute=executor_for_provider("slack_message", channel="slack"),
    built=True,
    outcomes=contact_outcomes,
    success_outcomes=OK,
    retry=EFFECT_RETRY,
    app="effects",
    context_on_read=True,  # its provider renders dict(context)
)


# --- model ----------------------------------------------------------------------------------


def validate_model(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("prompt", "model", "max_tokens", "budget", "connection"))
    check_template_field(step, "prompt", report)
    check_string(step, "model", report, required=False, max_length=200)
    check_int(step, "max_tokens", report, minimum=1, maximum=MAX_MODEL_TOKENS)
    budget = check_number(step, "budget", report, minimum=0)
    if budget is not None and budget > MAX_MODEL_BUDGET:
        report.error("budget", f"must be at most {MAX_MODEL_BUDGET:,} (the most one call may cost)")
    _check_connection(step, report)
    if "prompt" in step and isinstance(step["prompt"], str) and not step["prompt"].strip():
        report.issue("invalid_field", "prompt", "must not be empty")
    if "connection" not in step:
        report.issue("missing_field", "connection", "is required (the model endpoint to ask)")


MODEL = StepType(
    name="model",
    lane="slow",
    validate=validate_model,
    execute=executor_for_provider("model"),
    built=True,
    outcomes=effect_outcomes,
    success_outcomes=OK,
    retry=MODEL_RETRY,
    app="effects",
    context_on_read=True,  # its provider renders dict(context)
)

# --- crm_upsert -----------------------------------------------------------------------------


def validate_crm_upsert(step: Mapping[str, Any], report: StepReport) -> None:
    check_fields(step, report, ("object", "external_id", "fields", "connection"))
    check_string(step, "object", report, max_length=100, pattern=CONNECTION_NAME_RE,
                 hint=": an object name is letters, digits, _ . or -")  # fmt: skip
    check_template_field(step, "external_id", report)
    check_template_value(step, "fields", report, required=False)
    if "connection" not in step:
        report.issue("missing_field", "connection", "is required (the CRM to write to)")
    _check_connection(step, report)


CRM_UPSERT = StepType(
    name="crm_upsert",
    lane="io",
    validate=validate_crm_upsert,
    execute=executor_for_provider("crm_upsert"),
    built=True,
    outcomes=effect_outcomes,
    success_outcomes=OK,
    retry=EFFECT_RETRY,
    app="effects",
    context_on_read=True,  # its provider renders dict(context)
)

STEP_TYPES = (HTTP, EMAIL, SLACK_MESSAGE, MODEL, CRM_UPSERT)


def register_step_types() -> None:
    for step_type in STEP_TYPES:
        register_step_type(step_type)
