"""An organisation's egress allowlist from the command line: what its outside calls may reach
beyond public addresses.

    manage.py egress_allow --org SLUG list
    manage.py egress_allow --org SLUG add ENTRY [--note TEXT]
    manage.py egress_allow --org SLUG remove ENTRY

An entry must lie within WAYMARK_EGRESS_ALLOWABLE (the operator's ceiling) and never reach
a cloud metadata or link-local address, here as in the API and the admin (effects/allowlist).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from effects.allowlist import allow_add, allow_list, allow_remove
from effects.egress import in_force, tenant_ceiling
from workflows.errors import WaymarkError
from workflows.plugins.audit import Actor
from workflows.plugins.runs import MigratedCommand, organisation_get


class Command(MigratedCommand):
    help = "List, add or remove an organisation's egress allowlist entries."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("action", choices=["list", "add", "remove"])
        parser.add_argument("entry", nargs="?", help="host, .suffix, address or CIDR")
        parser.add_argument("--note", default="", help="why (with add)")

    def handle(
        self, *args: Any, org: str, action: str, entry: str | None, note: str, **options: Any
    ) -> None:
        if (entry is None) != (action == "list"):
            needs = "takes no entry" if action == "list" else "needs an entry"
            raise CommandError(f"invalid_input: {action} {needs}")
        try:
            organisation = organisation_get(slug=org)
            if action == "list":
                self._list(organisation)
            elif action == "add":
                assert entry is not None
                row = allow_add(organisation, entry, note, actor=Actor.command())
                self.stdout.write(f"added {row.entry} for {organisation.slug}")
            else:
                assert entry is not None
                allow_remove(organisation, entry, actor=Actor.command())
                self.stdout.write(f"removed {entry.strip()} for {organisation.slug}")
        except WaymarkError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc

    def _list(self, organisation: Any) -> None:
        ceiling = tenant_ceiling()
        for row in allow_list(organisation).order_by("entry"):
            state = "" if in_force(row.entry, ceiling) else "  (outside the ceiling: unused)"
            note = f"  # {row.note}" if row.note else ""
            self.stdout.write(f"{row.entry}{state}{note}")
