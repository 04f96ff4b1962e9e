import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from tenants.models import Tenant
from tenants.services import Actor, member_set_role

DEMO_MEMBERS = (("admin", "admin"), ("reviewer", "reviewer"), ("operator", "operator"))


class Command(BaseCommand):
    help = (
        "Create the demo tenant with an admin, a reviewer and an operator, give each a new "
        "random password (printed), and seed demo runs where the runtime provides them."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--addr",
            default=os.environ.get("CAIRN_ADDR") or "127.0.0.1:8000",
            help="The address the console is served on (cairn_up --addr), printed to sign in.",
        )

    def handle(self, *args, addr, **options):
        user_model = get_user_model()
        actor = Actor.system("seed_demo")
        passwords = {}
        with transaction.atomic():
            tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
            for username, role in DEMO_MEMBERS:
                user, _ = user_model.objects.get_or_create(username=username)
                passwords[username] = secrets.token_urlsafe(9)
                user.set_password(passwords[username])
                user.save(update_fields=["password"])
                member_set_role(tenant=tenant, user=user, role=role, actor=actor)
        try:
            from runtime.demo import demo_seed_runs
        except ImportError:
            demo_seed_runs = None
        if demo_seed_runs is not None:
            count = demo_seed_runs(tenant=tenant)
            self.stdout.write(f"Seeded {count} demo runs.")
        self.stdout.write(f"Demo tenant 'demo' — sign in at http://{addr}/ as:")
        self.stdout.write(f"  {'ROLE':9} {'USERNAME':9} PASSWORD")
        for username, role in DEMO_MEMBERS:
            self.stdout.write(f"  {role:9} {username:9} {passwords[username]}")
