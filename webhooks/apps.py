from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from workflows.plugins import register_sweep_service, register_sweep_task
        from workflows.plugins.erasure import register_eraser
        from workflows.plugins.health import register_health_check

        from .delivery import Sender
        from .erasure import erase_deliveries
        from .health import CHECK, overdue
        from .services import purge_finished

        # Sent by the elected sweeper while it leads (threads of its own); finished
        # deliveries past retention deleted about once a minute.
        register_sweep_service("webhooks.send", Sender)
        register_sweep_task("webhooks.retention", lambda by: purge_finished())
        register_health_check(CHECK, overdue, org_scoped=True)
        register_eraser("webhooks", erase_deliveries)
