"""The host's URLconf: its own admin site, with Waymark's routes included
(docs/how-to/embed-in-django.md)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("workflows.api.urls")),
    path("api/v1/", include("effects.urls")),
    path("api/v1/", include("timers.urls")),
    path("api/v1/", include("webhooks.urls")),
    path("", include("approvals.urls")),  # /slack/interactions and /api/v1/approvals, /tasks
    path("", include("workflows.health.urls")),  # /readyz
    path("", include("workflows.monitoring")),  # /metrics: off without WAYMARK_METRICS_TOKEN
]
