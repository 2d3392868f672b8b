from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from workflows.plugins import register_step_renamer, register_sweep_task
        from workflows.plugins.erasure import register_eraser
        from workflows.plugins.testing import register_decider, register_time_skip

        from . import control_room, sweep, waits
        from .erasure import erase_approvals
        from .renames import rename_requests
        from .steptypes import register_step_types
        from .testing import decide_as, expire_run_requests

        register_step_types()
        control_room.register()  # its panel on the admin's first screen
        waits.register()  # what its parked steps wait on, in words (the run page, the API)
        # Here, not in steptypes: the sweep's tasks use steptypes (reminders), so steptypes
        # importing the sweep would close a cycle.
        register_sweep_task("approvals.slack_clicks", sweep.slack_clicks)
        register_sweep_task("approvals.wake_decided", sweep.wake_decided)
        register_sweep_task("approvals.reminders", sweep.send_reminders)
        register_sweep_task("approvals.slack_updates", sweep.update_slack)
        register_step_renamer("approvals", rename_requests)
        register_eraser("approvals", erase_approvals)
        register_decider("approvals", decide_as)  # the test helper's decide only
        register_time_skip("approvals", expire_run_requests)  # and its skip_time
