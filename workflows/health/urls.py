"""Included at the root by a project's URLconf: ``path("", include("workflows.health.urls"))``."""

from django.urls import path

from .views import readyz

urlpatterns = [path("readyz", readyz, name="readyz")]
