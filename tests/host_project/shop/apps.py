# shop/apps.py
from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"

    def ready(self) -> None:
        from . import workflows  # noqa: F401  (registers the shop's @workflow functions)
