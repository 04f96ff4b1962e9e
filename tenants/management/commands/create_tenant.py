from django.core.management.base import BaseCommand, CommandError
from django.utils.text import slugify

from cairn.errors import InvalidRequest
from tenants.members import member_password_link
from tenants.services import Actor, tenant_create
from tenants.usernames import account_find


class Command(BaseCommand):
    help = (
        "Create a tenant (if missing) and make USERNAME, created if missing, its admin. An "
        "owner without a password gets a one-time set-password link, printed."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--owner", required=True, help="username of the tenant's admin")
        parser.add_argument("--name", default="", help="display name (defaults to the slug)")
        parser.add_argument(
            "--base-url",
            default="http://127.0.0.1:8000",
            help="where the console is served, for the set-password link",
        )

    def handle(self, *args, slug, owner, name, base_url, **options):
        if slugify(slug) != slug:
            raise CommandError(f"'{slug}' is not a valid slug: use lowercase letters, digits and -")
        tenant, created = tenant_create(slug=slug, name=name, owner_username=owner)
        verb = "Created" if created else "Found"
        self.stdout.write(f"{verb} tenant {tenant.slug} ({tenant.id}); {owner} is its admin.")
        user = account_find(owner)
        if user.has_usable_password():
            self.stdout.write(f"{owner} has a password and signs in at {base_url}/login/.")
            return
        try:
            path = member_password_link(
                tenant=tenant, user=user, actor=Actor.system("create_tenant")
            )
        except InvalidRequest as exc:
            self.stdout.write(exc.detail)
            return
        self.stdout.write(
            f"{owner} has no password yet. Open this link once to set it, then sign in "
            f"(it expires; run this command again for a new one):\n  {base_url.rstrip('/')}{path}"
        )
