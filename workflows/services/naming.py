"""Slugs and names of the objects people address (organisations, automations), checked as the
admin's forms check them: a command or a service call cannot make one that no URL, `--org`
or form could name, and an over-long value is ``invalid_input``, not a DataError."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db.models import Model

from ..errors import InvalidInput


def check_slug_and_name(model: type[Model], *, slug: str, name: str) -> None:
    check_length(model, "slug", slug)
    check_length(model, "name", name)
    try:
        validate_slug(slug)
    except ValidationError as error:
        raise InvalidInput(reason=f"slug: {' '.join(error.messages)}") from None


def check_length(model: type[Model], field: str, value: str, *, label: str = "") -> None:
    """``value`` fits ``model``'s column ``field``; ``label`` names it in the error (a
    command's option, say), by default the field."""
    limit = getattr(model._meta.get_field(field), "max_length", 0)
    if len(value) > limit:
        raise InvalidInput(
            reason=f"{label or field}: {len(value)} characters; the limit is {limit}"
        )
