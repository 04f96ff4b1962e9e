from django.core.management.base import BaseCommand, CommandError
from django.utils.text import slugify

from tenants.services import tenant_create


class Command(BaseCommand):
    help = "Create a tenant (if missing) and make USERNAME, created if missing, its admin."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--owner", required=True, help="username of the tenant's admin")
        parser.add_argument("--name", default="", help="display name (defaults to the slug)")

    def handle(self, *args, slug, owner, name, **options):
        if slugify(slug) != slug:
            raise CommandError(f"'{slug}' is not a valid slug: use lowercase letters, digits and -")
        tenant, created = tenant_create(slug=slug, name=name, owner_username=owner)
        verb = "Created" if created else "Found"
        self.stdout.write(f"{verb} tenant {tenant.slug} ({tenant.id}); {owner} is its admin.")
