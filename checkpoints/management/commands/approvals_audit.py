"""List the stored runs whose history breaks the approval invariant."""

from django.core.management.base import BaseCommand, CommandError

from checkpoints.services.approval_chain import runs_approval_violations


class Command(BaseCommand):
    help = (
        "List every run whose chain passed an approval state without a consumed approval of "
        "its declared action (docs/design.md#approvals). Exits 1 when there is one."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="Only this tenant's runs (its slug).")

    def handle(self, *args, tenant=None, **options):
        found = 0
        for run, problems in runs_approval_violations(tenant_slug=tenant):
            found += 1
            self.stdout.write(
                f"{run.tenant.slug} run {run.pk} ({run.workflow_type}@{run.workflow_version}, "
                f"{run.state}/{run.status}):"
            )
            for problem in problems:
                self.stdout.write(f"  {problem}")
        if found:
            raise CommandError(f"{found} run(s) break the approval invariant.")
        self.stdout.write("No run breaks the approval invariant.")
