"""Form fields the admin pages of every app share."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms.fields import InvalidJSONInput


class SafeJSONField(forms.JSONField):
    """Django's JSON form field, with text nested too deeply for Python's json module (a
    RecursionError, when the form is cleaned and again when it is shown) a form error, not
    a 500."""

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:
            raise ValidationError("This JSON nests too deeply.") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)
