from .automations import Automation, AutomationVersion
from .runs import Outbox, Run, RunEvent, Step
from .tenancy import ApiKey, Organisation

__all__ = [
    "ApiKey",
    "Automation",
    "AutomationVersion",
    "Organisation",
    "Outbox",
    "Run",
    "RunEvent",
    "Step",
]
