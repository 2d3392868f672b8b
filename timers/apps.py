from django.apps import AppConfig


class TimersConfig(AppConfig):
    name = "timers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from workflows.plugins import (
            register_metrics_collector,
            register_step_renamer,
            register_sweep_service,
            register_sweep_task,
        )
        from workflows.plugins.erasure import register_eraser
        from workflows.plugins.testing import register_time_skip

        from . import control_room, health, waits
        from .erasure import erase_timers
        from .metrics import timer_gauges
        from .renames import rename_timer
        from .schedules import fire_due_schedules
        from .steptypes import register_step_types
        from .sweep import TimerFiring
        from .testing import skip_run_timers

        register_step_types()
        waits.register()  # what its parked steps wait on, in words (the run page, the API)
        health.register()
        control_room.register()  # its panel on the admin's first screen
        register_metrics_collector("timers", timer_gauges)
        register_sweep_service("timers.due", TimerFiring)
        register_sweep_task("timers.schedules", fire_due_schedules, each_tick=True)
        register_step_renamer("timers", rename_timer)
        register_eraser("timers", erase_timers)
        register_time_skip("timers", skip_run_timers)  # the test helper's skip_time only
