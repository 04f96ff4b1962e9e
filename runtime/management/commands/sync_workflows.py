"""Store the definitions of every workflow declared in Python (CAIRN_WORKFLOW_MODULES)."""

from django.core.management.base import BaseCommand, CommandError

from runtime.registry import workflows_sync


class Command(BaseCommand):
    help = (
        "Register every workflow declared in code (the modules in CAIRN_WORKFLOW_MODULES) so "
        "the API lists it and runs can start. Safe to repeat; fails when a declared "
        "definition differs from the stored one under the same version."
    )

    def handle(self, *args, **options):
        conflicts = 0
        for workflow, outcome in workflows_sync():
            if outcome in {"created", "unchanged"}:
                self.stdout.write(f"{workflow.workflow_type}@{workflow.version}: {outcome}")
            else:
                conflicts += 1
                self.stderr.write(f"{workflow.workflow_type}@{workflow.version}: {outcome}")
        if conflicts:
            raise CommandError(
                f"{conflicts} workflow(s) differ from their stored definition; give changed "
                "workflows a new version."
            )
