from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from tenants import roles
from tenants.models import Tenant
from tenants.services import Actor, member_set_role, permissions_of, token_issue
from tenants.usernames import account_find, username_key


class Command(BaseCommand):
    help = "Issue an API token for USERNAME in a tenant; the token is the last line printed."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--role", choices=roles.ROLES, help="also give the user this role")
        parser.add_argument("--name", default="", help="a label for the token")

    def handle(self, *args, username, tenant, role, name, **options):
        tenant_row = Tenant.objects.filter(slug=tenant).first()
        if tenant_row is None:
            raise CommandError(f"No tenant '{tenant}'. Create it with create_tenant first.")
        user = account_find(username)
        if user is None:
            if role is None:
                raise CommandError(f"No user '{username}'; pass --role to create them as a member.")
            user = get_user_model().objects.create(username=username_key(username))
        actor = Actor.system("issue_token")
        if role is not None:
            member_set_role(tenant=tenant_row, user=user, role=role, actor=actor)
        if not permissions_of(user=user, tenant=tenant_row):
            raise CommandError(f"{username} holds no role in {tenant}; pass --role.")
        token, secret = token_issue(tenant=tenant_row, user=user, actor=actor, name=name)
        self.stdout.write(f"Token {token.prefix}… for {username} in {tenant} (shown once):")
        self.stdout.write(secret)
