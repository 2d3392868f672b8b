from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from . import views

app_name = "api"


urlpatterns = [
    path(
        "schema/",
        SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]),
        name="schema",
    ),
    path("automations", views.AutomationListView.as_view(), name="automations"),
    path("automations/<slug:slug>", views.AutomationDetailView.as_view(), name="automation"),
    path("automations/<slug:slug>/versions", views.VersionListView.as_view(), name="versions"),
    path(
        "automations/<slug:slug>/versions/<int:number>",
        views.VersionDetailView.as_view(),
        name="version",
    ),
    path(
        "automations/<slug:slug>/versions/<int:number>/publish",
        views.VersionPublishView.as_view(),
        name="version-publish",
    ),
    path("runs", views.RunListView.as_view(), name="runs"),
    path("runs/<int:run_id>", views.RunDetailView.as_view(), name="run"),
    path("runs/<int:run_id>/steps", views.RunStepListView.as_view(), name="run-steps"),
    path("runs/<int:run_id>/history", views.RunHistoryView.as_view(), name="run-history"),
    # One operation per route; the view answers 404 for an action it does not know.
    path("runs/<int:run_id>/<slug:action>", views.RunActionView.as_view(), name="run-act"),
    path("runs/bulk/<slug:action>", views.RunBulkActionView.as_view(), name="runs-bulk"),
]
