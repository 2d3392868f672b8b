from django.contrib import admin
from django.urls import include, path

from .health import healthz, livez

urlpatterns = [
    path("admin/", admin.site.urls),
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
