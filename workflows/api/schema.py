"""OpenAPI details drf-spectacular cannot infer: the API-key scheme."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "workflows.api.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An organisation's API key: `Authorization: Bearer wmk_…`.",
        }


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
    "400": "Malformed or invalid request (`malformed_request`, `invalid_input`, …).",
    "401": "No, unknown or revoked API key (`not_authenticated`, `invalid_api_key`, …).",
    "404": "Nothing with that id in this organisation.",
}


def add_error_responses(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Every operation can fail with the JSON error body; say so in the schema."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    reference = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        if path.endswith("/schema/") or path == "/api/v1/":  # public, nothing to refuse
            continue
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for status, description in COMMON_ERRORS.items():
                responses.setdefault(status, {"description": description, "content": reference})
    return result
