"""OpenAPI details drf-spectacular cannot infer: the API-key scheme, what a strict request
body refuses, and the errors every operation can answer. The schema says what validation
does: tests/test_api_schema_truth.py holds the two equal."""

from __future__ import annotations

from typing import Any

from django import forms
from drf_spectacular.contrib.django_filters import DjangoFilterExtension
from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension
from rest_framework import serializers


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "workflows.api.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An organisation's API key: `Authorization: Bearer wmk_…`.",
        }


class StrictInputSchema(OpenApiSerializerExtension):
    """A StrictInput body refuses fields it does not take (``additionalProperties: false``)
    and blank text where its field does not allow it (``minLength: 1``; drf-spectacular says
    so only with COMPONENT_SPLIT_REQUEST)."""

    target_class = "workflows.api.serializers.StrictInput"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_serializer(
            self.target, direction, bypass_extensions=True
        )
        schema["additionalProperties"] = False
        properties = schema.get("properties", {})
        for name, field in self.target.fields.items():
            if name in properties:
                _non_blank(field, properties[name])
        return schema


def _non_blank(field: serializers.Field, schema: dict[str, Any]) -> None:
    if isinstance(field, serializers.CharField) and not field.allow_blank:
        if schema.get("type") == "string":
            schema.setdefault("minLength", 1)
    elif isinstance(field, serializers.ListField) and isinstance(schema.get("items"), dict):
        _non_blank(field.child, schema["items"])
    elif isinstance(field, serializers.DictField):
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            _non_blank(field.child, values)


class StrictFiltersSchema(DjangoFilterExtension):
    """A filter's bounds in its parameter's schema: its length, its range, a slug's pattern.
    An empty value is no filter (django-filter skips it), so a bound on the length leaves it
    allowed."""

    target_class = "workflows.api.filters.StrictFilterBackend"
    priority = 1

    def resolve_filter_field(
        self, auto_schema: Any, model: Any, filterset_class: Any, field_name: str, filter_field: Any
    ) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super().resolve_filter_field(
            auto_schema, model, filterset_class, field_name, filter_field
        )
        field = filter_field.field  # the form field that validates the value
        for parameter in parameters:
            schema = parameter.get("schema", {})
            if schema.get("type") == "string" and "enum" not in schema:
                _text_bounds(field, schema)
            elif schema.get("type") == "integer":
                for bound, keyword in (("min_value", "minimum"), ("max_value", "maximum")):
                    if getattr(field, bound, None) is not None:
                        schema[keyword] = getattr(field, bound)
        return parameters


def _text_bounds(field: forms.Field, schema: dict[str, Any]) -> None:
    if isinstance(field, forms.SlugField):
        schema["pattern"] = r"^[-a-zA-Z0-9_]*$"
    min_length = getattr(field, "min_length", None)
    if min_length and "pattern" not in schema:  # empty (no filter), or at least min_length
        schema["pattern"] = rf"^(|[\s\S]{{{min_length},}})$"
    max_length = getattr(field, "max_length", None)
    if max_length is not None:
        schema["maxLength"] = max_length


ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "Stable, machine-readable error code."},
        "detail": {"type": "string", "description": "What went wrong, for people."},
        "errors": {"description": "Per-field or per-step problems, when there are several."},
    },
    "required": ["code", "detail"],
}
COMMON_ERRORS = {
    "400": "Malformed or invalid request (`malformed_request`, `invalid_input`, "
    "`invalid_query`, …).",
    "401": "No, unknown or revoked API key (`not_authenticated`, `invalid_api_key`, …).",
    "404": "Nothing with that id in this organisation (`not_found`, `unknown_…`).",
    "429": "Too many requests for this key, or failed authentications from this address "
    "(`throttled`, with `Retry-After`).",
    "503": "The database is unavailable or busy (`database_unavailable`, `database_busy`, with "
    "`Retry-After`).",
}
# What every operation that changes something can answer besides.
WRITE_ERRORS = {
    "403": "The key is read-only (`read_only_key`) or lacks a scope (`scope_required`).",
    "413": "The request body is too large (`payload_too_large`).",
}
WRITES = {"post", "put", "patch", "delete"}


def add_error_responses(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Every operation can fail with the JSON error body; say so in the schema."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    reference = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        if path.endswith("/schema/") or path == "/api/v1/":  # public, nothing to refuse
            continue
        for method, operation in operations.items():
            errors = {**COMMON_ERRORS, **(WRITE_ERRORS if method in WRITES else {})}
            responses = operation.setdefault("responses", {})
            for status, description in errors.items():
                responses.setdefault(status, {"description": description, "content": reference})
    return result
