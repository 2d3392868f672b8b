"""The admin is a control room, not an editor: one module per concern, registered on import."""

from django.contrib import admin

from . import audit, automations, erasures, migrations, people, runs, signals, tenancy

admin.site.site_header = "Waymark"
admin.site.site_title = "Waymark admin"
admin.site.index_title = "Control room"
# The first screen: what is failing or stuck, then the apps, Workflows first (control_room.py).
admin.site.index_template = "admin/workflows/control_room.html"

__all__ = ["audit", "automations", "erasures", "migrations", "people", "runs", "signals", "tenancy"]
