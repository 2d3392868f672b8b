from .automations import Automation, AutomationVersion
from .runs import Outbox, Run, RunEvent, Step
from .tenancy import ApiKey, Membership, Organisation

__all__ = [
    "ApiKey",
    "Automation",
    "AutomationVersion",
    "Membership",
    "Organisation",
    "Outbox",
    "Run",
    "RunEvent",
    "Step",
]
