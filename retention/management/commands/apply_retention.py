"""Enforce the retention policies now: ``manage.py apply_retention [--dry-run]``."""

import os
import time

from django.core.management.base import BaseCommand, CommandError

from retention.services import retention_apply
from tenants.models import Tenant

# Test-only: seconds to sleep inside each batch's transaction, so a test can kill the job
# mid-batch. Unset in production.
PAUSE_ENV = "CAIRN_RETENTION_TEST_PAUSE"


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
        pause = float(os.environ.get(PAUSE_ENV) or 0)

        def progress(message: str) -> None:
            self.stdout.write(message)
            self.stdout.flush()

        report = retention_apply(
            dry_run=dry_run,
            tenant=selected,
            batch_size=batch_size,
            progress=progress,
            on_batch=(lambda: time.sleep(pause)) if pause else None,
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
