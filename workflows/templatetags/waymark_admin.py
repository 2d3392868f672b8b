"""The control room's template tags (workflows/admin/control_room.py): the admin's index
page (``admin.site.index_template``) asks for the panels with the request it is shown for."""

from __future__ import annotations

from typing import Any

from django import template

from ..admin.control_room import ControlRoom, apps_workflows_first, control_room

register = template.Library()


@register.simple_tag(takes_context=True)
def waymark_control_room(context: dict[str, Any]) -> ControlRoom:
    return control_room(context["request"])


@register.filter
def workflows_first(app_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return apps_workflows_first(app_list)
