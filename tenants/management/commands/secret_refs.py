from django.core.management.base import BaseCommand, CommandError

from cairn.errors import InvalidRequest
from tenants.models import Tenant
from tenants.secret_refs import (
    tenant_secret_ref_register,
    tenant_secret_ref_remove,
    tenant_secret_refs,
)
from tenants.services import Actor


class Command(BaseCommand):
    help = (
        "Register (add), unregister (remove) or list the secret references a tenant may "
        "name, e.g. for its webhook's signing secret: secret_refs acme add env:ACME_HOOK_KEY"
    )

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("action", choices=["add", "remove", "list"])
        parser.add_argument("reference", nargs="?", default="", help="env:NAME or file:NAME")

    def handle(self, *args, tenant, action, reference, **options):
        row = Tenant.objects.filter(slug=tenant).first()
        if row is None:
            raise CommandError(f"No tenant '{tenant}'.")
        actor = Actor.system("secret_refs")
        if action == "list":
            for name in tenant_secret_refs(tenant=row):
                self.stdout.write(name)
            return
        if not reference:
            raise CommandError("Name the reference: env:NAME or file:NAME.")
        try:
            if action == "add":
                new = tenant_secret_ref_register(tenant=row, reference=reference, actor=actor)
                said = "registered" if new else "was registered already"
            else:
                gone = tenant_secret_ref_remove(tenant=row, reference=reference, actor=actor)
                said = "removed" if gone else "was not registered"
        except InvalidRequest as error:
            raise CommandError(error.detail)
        self.stdout.write(f"{reference} {said} for {tenant}.")
