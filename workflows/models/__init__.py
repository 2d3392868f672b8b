from .audit import ActorKind, AuditEntry
from .automations import Automation, AutomationVersion
from .erasure import Erasure
from .run_migrations import MigrationStatus, RunMigration
from .runs import IdleWorker, Outbox, Run, RunEvent, RunWaiter, Step, SweepLease
from .signals import Signal
from .tenancy import ApiKey, Membership, Organisation, QuotaUsage

__all__ = [
    "ActorKind",
    "ApiKey",
    "AuditEntry",
    "Automation",
    "AutomationVersion",
    "Erasure",
    "IdleWorker",
    "Membership",
    "MigrationStatus",
    "Organisation",
    "Outbox",
    "QuotaUsage",
    "Run",
    "RunEvent",
    "RunMigration",
    "RunWaiter",
    "Signal",
    "Step",
    "SweepLease",
]
