"""The approvals app's routes: the Slack interactions endpoint, and its API under
``/api/v1/`` (each API route with and without a trailing slash, as the other apps')."""

from django.urls import URLPattern, path
from rest_framework.views import APIView

from . import api, interactions


def route(pattern: str, view: type[APIView], name: str) -> list[URLPattern]:
    return [
        path(f"api/v1/{pattern}", view.as_view(), name=name),
        path(f"api/v1/{pattern}/", view.as_view(schema=None)),
    ]


urlpatterns = [
    path("slack/interactions", interactions.interactions, name="slack-interactions"),
    *route("approvals", api.ApprovalListView, "approvals"),
    *route("approvals/<int:approval_id>", api.ApprovalDetailView, "approval"),
    *route("approvals/<int:approval_id>/decide", api.ApprovalDecideView, "approval-decide"),
    *route("tasks", api.TaskListView, "tasks"),
    *route("tasks/<int:task_id>/submit", api.TaskSubmitView, "task-submit"),
]
