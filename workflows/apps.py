from importlib import import_module

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import host_checks

        host_checks.require_waymark_settings()  # first: every step below reads them
        from .api import schema  # noqa: F401 (registers the OpenAPI auth extension)
        from .code.health import CHECK as CODE_CHECK
        from .code.health import missing_versions
        from .code.steptypes import register_code_step_types
        from .engine.absences import ENGINE_CHECKS
        from .engine.processes import begin_from_environment
        from .engine.retention import purge_finished_runs
        from .engine.scrape import ENGINE_COLLECTOR, engine_gauges
        from .engine.signals import drop_old
        from .plugins import register_health_check, register_metrics_collector, register_sweep_task
        from .plugins.erasure import register_eraser
        from .services.audit import purge_audit
        from .services.erasure.engine_rows import erase_engine_rows
        from .steptypes import register_step_types

        register_step_types()
        register_code_step_types()
        register_metrics_collector(ENGINE_COLLECTOR, engine_gauges)
        register_sweep_task("workflows.retention", lambda by: purge_finished_runs())
        register_sweep_task("workflows.drop_old_signals", lambda by: drop_old())
        register_sweep_task("workflows.audit_retention", lambda by: purge_audit())
        register_eraser("workflows", erase_engine_rows)
        for name, check in ENGINE_CHECKS.items():  # the doctor's and /readyz's own checks
            register_health_check(name, check, org_scoped=True)  # each keeps to limits.orgs
        register_health_check(CODE_CHECK, missing_versions, org_scoped=True)
        import_extra_step_modules(settings.WAYMARK.get("EXTRA_STEP_MODULES", ()))
        # A process runengine started (its role in the environment): tracing, if configured.
        begin_from_environment()


def import_extra_step_modules(names: list[str] | tuple[str, ...]) -> None:
    """Import the modules WAYMARK_EXTRA_STEP_MODULES names: each registers its step types
    (workflows.plugins.register_step_type) as it is imported. For a process that runs with
    Waymark's own settings and has no app of its own to register them from (the engine
    processes the tests start, with the tests' `probe` type)."""
    from .code.registry import CodeWorkflowError

    for name in names:
        try:
            import_module(name)
        except (ImportError, CodeWorkflowError) as exc:
            # A workflow the module registers wrongly (its code and detail name it) is one
            # line too, as manage.py prints ImproperlyConfigured, not a traceback of imports.
            raise ImproperlyConfigured(
                f"cannot import {name!r}, named in WAYMARK_EXTRA_STEP_MODULES: {exc}"
            ) from exc
