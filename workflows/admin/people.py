"""Users and groups in the admin: superusers only.

Whoever may change users may make themselves a superuser, or a member of any organisation's
groups: so only superusers see these pages, whatever permissions a staff member was given.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.http import HttpRequest


class SuperusersOnly:
    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.has_module_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)


class PeopleUserAdmin(SuperusersOnly, UserAdmin):
    pass


class PeopleGroupAdmin(SuperusersOnly, GroupAdmin):
    pass


admin.site.unregister(User)
admin.site.unregister(Group)
admin.site.register(User, PeopleUserAdmin)
admin.site.register(Group, PeopleGroupAdmin)
