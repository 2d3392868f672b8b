from .automations import Automation, AutomationVersion
from .tenancy import ApiKey, Organisation

__all__ = ["ApiKey", "Automation", "AutomationVersion", "Organisation"]
