from django.apps import AppConfig
from django.conf import settings


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .api import schema  # noqa: F401 (registers the OpenAPI auth extension)
        from .engine.signals import drop_old
        from .plugins import register_sweep_task
        from .steptypes import register_step_types

        register_step_types()
        register_sweep_task("workflows.drop_old_signals", lambda by: drop_old())
        if settings.WAYMARK.get("ENABLE_PROBE_STEPS"):
            from .engine.probe import register_probe

            register_probe()
