"""The schedules API's routes, under ``/api/v1/`` beside the workflows API (waymark_config/urls.py).

As there, each answers with and without a trailing slash (a redirect would lose a POST
body); only the bare form is in the schema."""

from django.urls import URLPattern, path
from rest_framework.views import APIView

from . import api

app_name = "timers_api"


def route(pattern: str, view: type[APIView], name: str) -> list[URLPattern]:
    return [
        path(pattern, view.as_view(), name=name),
        path(f"{pattern}/", view.as_view(schema=None)),
    ]


urlpatterns = [
    *route("schedules", api.ScheduleListView, "schedules"),
    *route("schedules/<str:name>", api.ScheduleDetailView, "schedule"),
]
