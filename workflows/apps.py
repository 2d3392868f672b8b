from django.apps import AppConfig
from django.conf import settings


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .api import schema  # noqa: F401 (registers the OpenAPI auth extension)
        from .steptypes import register_step_types

        register_step_types()
        if settings.WAYMARK.get("ENABLE_PROBE_STEPS"):
            from .engine.probe import register_probe

            register_probe()
