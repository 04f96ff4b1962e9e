"""Enforce the retention policies now: ``manage.py apply_retention [--dry-run]``."""

from django.core.management.base import BaseCommand, CommandError

from cairn.faults import fault_point
from retention.services import retention_apply
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Apply the retention policies: compact, expire runs, delete unreferenced artifacts."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="report, delete nothing")
        parser.add_argument("--tenant", help="only this tenant (slug)")
        parser.add_argument("--batch-size", type=int, help="rows per transaction")

    def handle(self, *args, dry_run, tenant, batch_size, **options):
        selected = None
        if tenant:
            selected = Tenant.objects.filter(slug=tenant).first()
            if selected is None:
                raise CommandError(f"No tenant '{tenant}'.")
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")

        def progress(message: str) -> None:
            self.stdout.write(message)
            self.stdout.flush()

        report = retention_apply(
            dry_run=dry_run,
            tenant=selected,
            batch_size=batch_size,
            progress=progress,
            # Where a test pauses the job to kill it mid-batch (cairn/faults.py).
            on_batch=lambda: fault_point("retention.batch"),
        )
        verb = "would remove" if dry_run else "removed"
        self.stdout.write(
            self.style.SUCCESS(
                f"Retention {verb} {report.checkpoints} checkpoints, {report.artifacts} artifacts "
                f"({report.bytes} bytes); runs compacted {report.runs_compacted}, expired "
                f"{report.runs_expired}; orphan files {report.orphan_files}; "
                f"skipped {report.skipped}."
            )
        )
