"""What other apps may use of effects (approvals posts and updates its Slack messages through
it; webhooks sends its deliveries through the egress guard and keeps its secrets encrypted
like connections'): an outside call through the effect ledger (``run_effect`` with a
``Call``: keyed, leased, recorded, never sent twice), a step's connection
(``load_connection``), the provider types, Slack's provider and Web API call; the egress
guard (``egress_client``, ``CallDeadline``, ``Allowlist``, ``EgressRefused``, an organisation's
``allowlist_in_force``); an outside answer read capped (``read_capped``) and its Retry-After
read one way (``retry_after_of``, ``retry_after_seconds``); secrets at rest (``encrypt``,
``decrypt``, ``rotate``, ``SecretUnreadable``, under ``WAYMARK_EFFECTS_SECRET_KEYS``). The
rest of effects is private: the import contracts in pyproject.toml ([tool.importlinter])
refuse an app that imports it directly.
"""

from __future__ import annotations

from .allowlist import allowlist_in_force
from .answers import read_capped, retry_after_of, retry_after_seconds
from .egress import Allowlist, CallDeadline, EgressRefused, egress_client
from .ledger import Call, run_effect
from .perform import load_connection
from .providers.base import Ambiguous, Answer, ConnectionInfo, Request
from .providers.slack import EVENT_TYPE, SlackMessageProvider, slack_call, vet_base_url
from .secrets import SecretUnreadable, decrypt, encrypt, rotate, under_derived_key

__all__ = [
    "EVENT_TYPE",
    "Allowlist",
    "Ambiguous",
    "Answer",
    "Call",
    "CallDeadline",
    "ConnectionInfo",
    "EgressRefused",
    "Request",
    "SecretUnreadable",
    "SlackMessageProvider",
    "allowlist_in_force",
    "decrypt",
    "egress_client",
    "encrypt",
    "load_connection",
    "read_capped",
    "retry_after_of",
    "retry_after_seconds",
    "rotate",
    "run_effect",
    "slack_call",
    "under_derived_key",
    "vet_base_url",
]
