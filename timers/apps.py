from django.apps import AppConfig


class TimersConfig(AppConfig):
    name = "timers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .steptypes import register_step_types

        register_step_types()
