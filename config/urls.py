from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("workflows.api.urls")),
    path("healthz", healthz),
]

handler400 = "workflows.api.errors.bad_request"
handler404 = "workflows.api.errors.not_found"
handler500 = "workflows.api.errors.server_error"
