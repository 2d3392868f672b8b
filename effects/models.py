"""Connections, the effect ledger, suppressions and model budgets.

An *effect* is one outside action (an email sent, a record created, a model asked) made by
one step execution. Its row is claimed under the step's effect key (``run/step/iteration``)
before the call goes out, in the same database as the run, and holds the answer afterwards:
a retry finds the first attempt's row instead of acting again. See ``effects/ledger.py``.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from .consent import stored_address
from .states import CircuitState, ConnectionStatus, EffectState


class Connection(models.Model):
    """How one organisation reaches one provider: where, with which credentials, how hard.

    The secret (a token, a password, an API key) is stored encrypted (``effects/secrets.py``)
    and is never returned, logged or shown after it is set."""

    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.CASCADE, related_name="connections"
    )
    name = models.CharField(max_length=100)
    provider = models.CharField(max_length=20)  # a key of effects.providers.PROVIDERS
    base_url = models.CharField(max_length=500, blank=True, default="")
    # Provider options that are not secret (a sender address, an SMTP port, prices per token).
    options = models.JSONField(default=dict, blank=True)
    secret_encrypted = models.TextField(blank=True, default="", editable=False)
    # Grows with every new secret: a call made with an older one cannot mark the connection
    # broken (its 401 says nothing about the new secret).
    secret_version = models.PositiveIntegerField(default=1, editable=False)
    status = models.CharField(
        max_length=16, choices=ConnectionStatus.choices, default=ConnectionStatus.OK
    )
    broken_reason = models.CharField(max_length=500, blank=True, default="")
    broken_at = models.DateTimeField(null=True, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)  # the last health probe
    # The check in flight (effects/checks.py): its holder's token and lease. A holder that
    # died leaves a lease that simply lapses; no transaction is held while it probes.
    check_token = models.CharField(max_length=32, blank=True, default="", editable=False)
    check_until = models.DateTimeField(null=True, blank=True, editable=False)
    # At most this many calls in flight at once, for all of the organisation's runs.
    max_concurrency = models.PositiveIntegerField(default=4)
    timeout_seconds = models.FloatField(default=30.0)
    # The circuit breaker: consecutive failures open it for a cool-down; then one probe.
    circuit = models.CharField(
        max_length=16, choices=CircuitState.choices, default=CircuitState.CLOSED
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    circuit_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["org", "name"]
        constraints = [
            models.UniqueConstraint(fields=["org", "name"], name="connection_org_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.provider})"

    def replace_secret(self, secret: str) -> list[str]:
        """Set a new secret (encrypted); the fields to save."""
        from .secrets import encrypt

        self.secret_encrypted = encrypt(secret)
        self.secret_version += 1
        return ["secret_encrypted", "secret_version"]


class Effect(models.Model):
    """One outside action, claimed before it is made (states: ``effects/states.py``)."""

    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.PROTECT, db_index=False, db_constraint=False
    )
    run = models.ForeignKey("workflows.Run", on_delete=models.CASCADE, related_name="effects")
    step_id = models.CharField(max_length=63)
    iteration = models.PositiveIntegerField()
    key = models.CharField(max_length=200)  # run/step/iteration: the effect, not the attempt
    # What providers are told (Idempotency-Key, metadata, Message-ID): the key and a random
    # part fixed when the effect is first claimed, so a restored database or a second
    # installation sharing a provider account never reuses another effect's key.
    external_key = models.CharField(max_length=255, default="")
    # A person's decision on a needs_review effect: done, retry or fail (effects/resolve.py).
    resolution = models.CharField(max_length=16, blank=True, default="")
    lookup_failures = models.PositiveIntegerField(default=0)  # lookups that could not tell
    provider = models.CharField(max_length=20)
    connection = models.ForeignKey(
        Connection, null=True, blank=True, on_delete=models.SET_NULL, related_name="effects"
    )
    state = models.CharField(max_length=16, choices=EffectState.choices)
    # The attempt in flight: its owner token and its own lease (not the step's).
    token = models.CharField(max_length=32, blank=True, default="")
    owner = models.CharField(max_length=100, blank=True, default="")
    step_attempt = models.PositiveIntegerField(default=0)
    lease_until = models.DateTimeField(null=True, blank=True)
    calls = models.PositiveIntegerField(default=0)  # calls begun under this key
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    request = models.JSONField(null=True, blank=True)  # what was sent, without secrets
    result = models.JSONField(null=True, blank=True)  # the provider's answer, once settled
    last_response = models.JSONField(null=True, blank=True)  # what the provider last said
    error = models.TextField(blank=True, default="")
    reserved_cost = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["org", "key"], name="effect_org_key"),
        ]
        indexes = [
            # The per-connection concurrency cap counts these.
            models.Index(
                fields=["connection", "lease_until"],
                name="effect_in_flight",
                condition=models.Q(state="in_flight"),
            ),
            models.Index(fields=["org", "state", "id"], name="effect_org_state"),
        ]

    @property
    def sent_key(self) -> str:
        """The key as providers were sent it (what to look the effect up by at the provider):
        the ledger's key, a colon and its random part. An effect stored before that part
        existed (migration 0003) has none: its ledger key is what it shows."""
        return self.external_key or self.key

    def __str__(self) -> str:
        return f"effect {self.key} ({self.state})"


class Suppression(models.Model):
    """An address that must not be contacted: checked when an effect runs, not at enrolment."""

    CHANNELS = [("email", "email"), ("slack", "slack"), ("any", "any channel")]

    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.CASCADE, related_name="suppressions"
    )
    channel = models.CharField(max_length=10, choices=CHANNELS, default="any")
    address = models.CharField(max_length=320)  # consent.stored_address: a mailbox, lowercased
    reason = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["org", "address"]
        constraints = [
            models.UniqueConstraint(
                fields=["org", "channel", "address"], name="suppression_org_channel_address"
            ),
        ]

    def save(self, *args: object, **kwargs: object) -> None:
        self.address = stored_address(self.address)
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.address} ({self.channel})"


class ModelBudget(models.Model):
    """What an organisation may spend on model calls. A model step reserves its allowed
    cost before the call and settles the real cost after; past the limit, steps park."""

    org = models.OneToOneField(
        "workflows.Organisation", on_delete=models.CASCADE, related_name="model_budget"
    )
    limit = models.DecimalField(max_digits=12, decimal_places=6)
    reserved = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    spent = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"model budget of {self.org}: {self.spent} + {self.reserved} of {self.limit}"


class EgressAllow(models.Model):
    """An internal host or network an organisation's outside calls (``http``, ``model`` and
    ``crm_upsert`` steps, its email server, its Slack base URL) may reach: by default private,
    loopback, link-local and metadata addresses are refused. An entry must lie within the
    operator's ceiling (``WAYMARK_EGRESS_ALLOWABLE``) when saved and when used
    (``effects/egress.py``); metadata and link-local addresses never open."""

    org = models.ForeignKey(
        "workflows.Organisation", on_delete=models.CASCADE, related_name="egress_allowed"
    )
    entry = models.CharField(max_length=255)  # a host name, ".suffix", an address or a CIDR
    note = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "entry"], name="egress_allow_org_entry"),
        ]

    def __str__(self) -> str:
        return self.entry
