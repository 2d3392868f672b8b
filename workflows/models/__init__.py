from .automations import Automation, AutomationVersion
from .runs import IdleWorker, Outbox, Run, RunEvent, Step
from .signals import Signal
from .tenancy import ApiKey, Membership, Organisation

__all__ = [
    "ApiKey",
    "Automation",
    "AutomationVersion",
    "IdleWorker",
    "Membership",
    "Organisation",
    "Outbox",
    "Run",
    "RunEvent",
    "Signal",
    "Step",
]
