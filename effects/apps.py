from django.apps import AppConfig


class EffectsConfig(AppConfig):
    name = "effects"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .steptypes import register_step_types

        register_step_types()
