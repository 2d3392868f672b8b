from typing import Any

from django.core.management.base import CommandError, CommandParser

from workflows.code.publish import publish_code_workflow
from workflows.code.registry import CodeWorkflowError
from workflows.errors import WaymarkError
from workflows.management.base import MigratedCommand
from workflows.selectors import organisation_get
from workflows.services.audit import Actor


class Command(MigratedCommand):
    help = (
        "Publish a code workflow (registered with @workflow in this process: an app's module, "
        "or one named in WAYMARK_EXTRA_STEP_MODULES) for an organisation, as its automation "
        "NAME."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # --version names the workflow's version here, not Django's: ours replaces its option.
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organisation slug")
        parser.add_argument("--name", required=True, help="the workflow's name in @workflow")
        parser.add_argument(
            "--version", required=True, type=int, dest="workflow_version", metavar="VERSION"
        )

    def handle(
        self, *args: Any, org: str, name: str, workflow_version: int, **options: Any
    ) -> None:
        try:
            version = publish_code_workflow(
                org=organisation_get(slug=org), name=name, version=workflow_version,
                actor=Actor.command(),
            )  # fmt: skip
        except (CodeWorkflowError, WaymarkError) as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        self.stdout.write(
            f"{name} version {workflow_version} published for {org} "
            f"(automation {name} v{version.number})"
        )
