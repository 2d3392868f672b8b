"""Field checks for step types, and the small parsers the validator shares with them.

A step type's ``validate(step, report)`` checks the fields only it knows (the generic
validator in :mod:`workflows.definitions.validator` checks id, and its
:mod:`workflows.definitions.step_checks` type, next, on_failure, name and retry). The
``check_*`` helpers here report each problem on the :class:`StepReport` with the right issue
code (``missing_field``, ``invalid_field``, ``unknown_field``, ``malformed_template``,
``unknown_step_reference``) and return the value when it is valid, so a step type reads like
a list of its fields.

This module must not import the validator: the validator imports it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from datetime import timedelta
from typing import Any

from workflows.definitions.expressions import check_template, check_templates_in
from workflows.definitions.registry import StepReport

__all__ = [
    "COMMON_STEP_FIELDS",
    "MAX_DURATION",
    "STEP_ID_RULE",
    "check_choice",
    "check_duration",
    "check_fields",
    "check_int",
    "check_number",
    "check_object",
    "check_step_id_list",
    "check_string",
    "check_template_field",
    "check_template_value",
    "is_int",
    "is_step_id",
    "parse_duration",
    "show",
    "type_label",
]

MAX_DURATION = timedelta(days=3650)
#: Fields every step may have; the generic validator checks them, step types the rest.
COMMON_STEP_FIELDS = (
    "id", "type", "next", "on_failure", "name", "retry", "compensate", "irreversible",
)  # fmt: skip

_STEP_ID_RE = re.compile(r"[a-z][a-z0-9_]{0,62}")
_DURATION_RE = re.compile(r"([0-9]{1,7})([smhd])")
_DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
#: What a valid step id looks like, for messages.
STEP_ID_RULE = "a lowercase letter, then up to 62 lowercase letters, digits or underscores"


# --- small shared parsers -------------------------------------------------------------------


def is_step_id(value: object) -> bool:
    return isinstance(value, str) and _STEP_ID_RE.fullmatch(value) is not None


def parse_duration(value: object) -> timedelta | None:
    """``"30s"``, ``"15m"``, ``"12h"``, ``"30d"`` -> timedelta; None when not a valid duration.

    A duration is a positive integer and a unit (s, m, h, d), at most 3650 days.
    """
    if not isinstance(value, str):
        return None
    match = _DURATION_RE.fullmatch(value)
    if match is None or int(match.group(1)) == 0:
        return None
    duration = timedelta(**{_DURATION_UNITS[match.group(2)]: int(match.group(1))})
    return duration if duration <= MAX_DURATION else None


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def show(value: object, limit: int = 60) -> str:
    """A value quoted for a message, shortened."""
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def type_label(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


# --- helpers for step types -----------------------------------------------------------------


def _present(
    obj: Mapping[str, Any], key: str, report: StepReport, prefix: str, required: bool
) -> bool:
    if key in obj:
        return True
    if required:
        report.issue("missing_field", f"{prefix}{key}", "is required")
    return False


def check_fields(
    obj: Mapping[str, Any],
    report: StepReport,
    allowed: Iterable[str],
    *,
    prefix: str = "",
    what: str | None = None,
) -> None:
    """Reports each key of ``obj`` that is not in ``allowed`` as ``unknown_field``.

    For a step (``prefix`` empty) the common fields (id, type, next, name, retry) are always
    allowed, and ``what`` defaults to 'a "<type>" step'; for a nested object (``prefix``
    ``"request."``) it defaults to the object's path.
    """
    allowed = tuple(allowed)
    common = _COMMON if not prefix else _NO_FIELDS
    unknown = [key for key in obj if key not in common and key not in allowed]
    if not unknown:  # (every turn of a code run checks the step it asks: kept cheap)
        return
    if what is None:
        what = f'a "{obj.get("type")}" step' if not prefix else prefix.rstrip(".")
    listing = ", ".join(allowed) if allowed else "none"
    for key in unknown:
        report.issue(
            "unknown_field",
            f"{prefix}{key}",
            f"is not a field of {what} (its fields: {listing})",
        )


_COMMON = frozenset(COMMON_STEP_FIELDS)
_NO_FIELDS: frozenset[str] = frozenset()


def check_string(
    obj: Mapping[str, Any],
    key: str,
    report: StepReport,
    *,
    required: bool = True,
    prefix: str = "",
    max_length: int = 1000,
    pattern: re.Pattern[str] | None = None,
    hint: str = "",
) -> str | None:
    """A non-empty string (matching ``pattern`` when given); returns it when valid."""
    if not _present(obj, key, report, prefix, required):
        return None
    value = obj[key]
    if not isinstance(value, str) or not value.strip() or len(value) > max_length:
        report.issue(
            "invalid_field",
            f"{prefix}{key}",
            f"must be a non-empty string of at most {max_length} characters, "
            f"not {show(value) if isinstance(value, str) else type_label(value)}",
        )
        return None
    if pattern is not None and pattern.fullmatch(value) is None:
        report.issue("invalid_field", f"{prefix}{key}", f"{show(value)} is not valid{hint}")
        return None
    return value


def check_template_field(
    obj: Mapping[str, Any], key: str, report: StepReport, *, required: bool = True, prefix: str = ""
) -> str | None:
    """A string template; returns it when it is a string (even if malformed)."""
    if not _present(obj, key, report, prefix, required):
        return None
    value = obj[key]
    if not isinstance(value, str):
        report.issue(
            "invalid_field",
            f"{prefix}{key}",
            f"must be a string (a template), not {type_label(value)}",
        )
        return None
    problem = check_template(value)
    if problem:
        report.issue("malformed_template", f"{prefix}{key}", f"is not a valid template: {problem}")
    return value


def check_template_value(
    obj: Mapping[str, Any],
    key: str,
    report: StepReport,
    *,
    required: bool = False,
    prefix: str = "",
) -> None:
    """Any JSON value; every string inside it is a template."""
    if _present(obj, key, report, prefix, required):
        check_templates_in(obj[key], f"{prefix}{key}", report)


def check_duration(
    obj: Mapping[str, Any], key: str, report: StepReport, *, required: bool = True, prefix: str = ""
) -> timedelta | None:
    if not _present(obj, key, report, prefix, required):
        return None
    duration = parse_duration(obj[key])
    if duration is None:
        report.issue(
            "invalid_field",
            f"{prefix}{key}",
            'must be a duration such as "30s", "15m", "12h" or "30d" (at most 3650d), '
            f"not {show(obj[key])}",
        )
    return duration


def check_choice(
    obj: Mapping[str, Any],
    key: str,
    report: StepReport,
    choices: Collection[str],
    *,
    required: bool = False,
    prefix: str = "",
) -> str | None:
    if not _present(obj, key, report, prefix, required):
        return None
    value = obj[key]
    if not isinstance(value, str) or value not in choices:
        report.issue(
            "invalid_field",
            f"{prefix}{key}",
            f"must be one of {', '.join(choices)}, not {show(value)}",
        )
        return None
    return value


def check_int(
    obj: Mapping[str, Any],
    key: str,
    report: StepReport,
    *,
    minimum: int,
    maximum: int,
    required: bool = False,
    prefix: str = "",
) -> int | None:
    if not _present(obj, key, report, prefix, required):
        return None
    value = obj[key]
    if not is_int(value) or not minimum <= value <= maximum:
        report.issue(
            "invalid_field",
            f"{prefix}{key}",
            f"must be a whole number from {minimum} to {maximum}, not {show(value)}",
        )
        return None
    return int(value)


def check_number(
    obj: Mapping[str, Any],
    key: str,
    report: StepReport,
    *,
    minimum: float = 0,
    required: bool = False,
    prefix: str = "",
) -> float | None:
    if not _present(obj, key, report, prefix, required):
        return None
    value = obj[key]
    valid = isinstance(value, int | float) and not isinstance(value, bool)
    if not valid or value != value or value in (float("inf"), float("-inf")) or value < minimum:
        report.issue(
            "invalid_field",
            f"{prefix}{key}",
            f"must be a number of at least {minimum}, not {show(value)}",
        )
        return None
    return float(value)


def check_object(
    obj: Mapping[str, Any], key: str, report: StepReport, *, required: bool = True, prefix: str = ""
) -> dict[str, Any] | None:
    if not _present(obj, key, report, prefix, required):
        return None
    value = obj[key]
    if not isinstance(value, dict):
        report.issue(
            "invalid_field",
            f"{prefix}{key}",
            f"must be an object, not {type_label(value)}",
        )
        return None
    return value


def check_step_id_list(
    obj: Mapping[str, Any],
    key: str,
    report: StepReport,
    *,
    min_items: int = 1,
    required: bool = True,
    check_exists: bool = False,
    prefix: str = "",
) -> list[str]:
    """A list of distinct step ids; returns the well-formed ones.

    With ``check_exists`` each id must name a step of the definition (``unknown_step_reference``);
    leave it False for fields the type also returns from ``references`` (the generic
    validator checks those).
    """
    if not _present(obj, key, report, prefix, required):
        return []
    value = obj[key]
    field = f"{prefix}{key}"
    if not isinstance(value, list) or len(value) < min_items:
        report.issue(
            "invalid_field",
            field,
            f"must be a list of at least {min_items} step id{'s' if min_items != 1 else ''}",
        )
        return []
    known = getattr(report, "step_ids", None)
    seen: set[str] = set()
    ids = []
    for position, item in enumerate(value):
        if not is_step_id(item):
            report.issue("invalid_field", f"{field}.{position}", "must be a step id")
            continue
        if item in seen:
            report.issue("invalid_field", f"{field}.{position}", f"repeats step {show(item)}")
            continue
        seen.add(item)
        ids.append(item)
        if check_exists and known is not None and item not in known:
            report.issue(
                "unknown_step_reference",
                f"{field}.{position}",
                f"refers to unknown step {show(item)}",
            )
    return ids
