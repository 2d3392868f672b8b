"""The API's root without its trailing slash, ``/api/v1``: like every other API path it
answers as it is, not with a redirect. It lies outside ``workflows.api.urls``'s prefix
(``api/v1/``), so a URLconf includes this module at its own root."""

from django.urls import path

from .views import ApiRootView

urlpatterns = [path("api/v1", ApiRootView.as_view(schema=None))]
