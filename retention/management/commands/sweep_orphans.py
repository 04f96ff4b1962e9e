"""Remove artifact files no row names: ``manage.py sweep_orphans [--dry-run]``. The
retention job runs the same step; this runs it alone."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from retention.orphans import ORPHAN_MIN_AGE, sweep_orphans
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Remove artifact files older than an hour that no artifact row names."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
        parser.add_argument("--tenant", help="only this tenant's files (slug)")
        parser.add_argument(
            "--min-age-minutes",
            type=int,
            default=int(ORPHAN_MIN_AGE.total_seconds() // 60),
            help="leave younger files alone (default 60; uploads in flight are young)",
        )

    def handle(self, *args, dry_run, tenant, min_age_minutes, **options):
        selected = None
        if tenant:
            selected = Tenant.objects.filter(slug=tenant).first()
            if selected is None:
                raise CommandError(f"No tenant '{tenant}'.")
        if min_age_minutes < 1:
            raise CommandError("--min-age-minutes must be at least 1.")
        report = sweep_orphans(
            dry_run=dry_run, tenant=selected, min_age=timedelta(minutes=min_age_minutes)
        )
        for name in report.files:
            self.stdout.write(name)
        verb = "would remove" if dry_run else "removed"
        self.stdout.write(
            self.style.SUCCESS(
                f"Orphan sweep {verb} {len(report.files)} files; "
                f"{report.kept_young} younger orphans left alone."
            )
        )
