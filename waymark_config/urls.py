from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from .health import healthz, livez

# The admin's "View site": where Waymark's own pages are, the API's browsable schema. (A host
# project that embeds Waymark keeps its own site_url.)
admin.site.site_url = "/api/v1/docs/"

urlpatterns = [
    # The root is the control room: the admin (its login page first, for someone signed out).
    path("", RedirectView.as_view(pattern_name="admin:index", permanent=False), name="root"),
    path("admin/", admin.site.urls),
    path("", include("workflows.api.root_urls")),  # /api/v1, without its slash
    path("api/v1/", include("workflows.api.urls")),
    path("api/v1/", include("effects.urls")),  # connections, suppressions, effects
    path("api/v1/", include("timers.urls")),  # schedules
    path("api/v1/", include("webhooks.urls")),  # webhook subscriptions and deliveries
    path("", include("approvals.urls")),  # /slack/interactions, /api/v1/approvals, /tasks
    path("", include("workflows.health.urls")),  # /readyz: the absence monitors
    path("", include("workflows.monitoring")),  # /metrics (with WAYMARK_METRICS_TOKEN)
    path("healthz", healthz),
    path("livez", livez),
]

handler400 = "workflows.api.errors.bad_request"
handler404 = "workflows.api.errors.not_found"
handler500 = "workflows.api.errors.server_error"
