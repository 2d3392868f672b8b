from django.apps import AppConfig


class EffectsConfig(AppConfig):
    name = "effects"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from workflows.plugins import (
            register_metrics_collector,
            register_settled_effects,
            register_step_renamer,
            register_sweep_task,
        )
        from workflows.plugins.erasure import register_eraser

        from . import control_room, health, waits
        from .egress import tenant_ceiling
        from .erasure import erase_effects
        from .metrics import effect_gauges
        from .renames import rename_effects
        from .reruns import settled_effects
        from .resolve import park_orphaned_calls, reconcile_budgets
        from .steptypes import register_step_types

        tenant_ceiling()  # a bad WAYMARK_EGRESS_ALLOWABLE stops the process now, naming it
        register_step_types()
        waits.register()  # what its parked steps wait on, in words (the run page, the API)
        health.register()
        control_room.register()  # its panel on the admin's first screen
        register_metrics_collector("effects", effect_gauges)
        register_sweep_task("effects.reconcile_budgets", reconcile_budgets)
        register_sweep_task("effects.park_orphaned_calls", park_orphaned_calls)
        register_step_renamer("effects", rename_effects)
        register_settled_effects("effects", settled_effects)
        register_eraser("effects", erase_effects)
