"""What other apps may use of effects (approvals posts and updates its Slack messages through
it): an outside call through the effect ledger (``run_effect`` with a ``Call``: keyed, leased,
recorded, never sent twice), a step's connection (``load_connection``), the provider types,
and Slack's provider and Web API call. The rest of effects is private: the import contracts
in pyproject.toml ([tool.importlinter]) refuse an app that imports it directly.
"""

from __future__ import annotations

from .ledger import Call, run_effect
from .perform import load_connection
from .providers.base import Ambiguous, Answer, ConnectionInfo, Request
from .providers.slack import EVENT_TYPE, SlackMessageProvider, slack_call, vet_base_url

__all__ = [
    "EVENT_TYPE",
    "Ambiguous",
    "Answer",
    "Call",
    "ConnectionInfo",
    "Request",
    "SlackMessageProvider",
    "load_connection",
    "run_effect",
    "slack_call",
    "vet_base_url",
]
