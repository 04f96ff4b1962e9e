"""The set-up commands of docs/api.md."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from tenants.models import Tenant
from tenants.services import permissions_of

pytestmark = pytest.mark.django_db


def run_command(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_tenant_makes_the_owner_its_admin(django_user_model):
    run_command("create_tenant", "initech", "--owner", "peter")
    tenant = Tenant.objects.get(slug="initech")
    peter = django_user_model.objects.get(username="peter")
    assert permissions_of(user=peter, tenant=tenant) == {
        "review_tenant",
        "operate_tenant",
        "admin_tenant",
    }
    with pytest.raises(CommandError):
        run_command("create_tenant", "Not A Slug", "--owner", "peter")


def test_issue_token_prints_a_working_token_as_its_last_line():
    run_command("create_tenant", "initech", "--owner", "peter")
    token = run_command("issue_token", "milton", "--tenant", "initech", "--role", "operator")
    secret = token.strip().splitlines()[-1]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/runs").status_code == 200
    reviewer = run_command("issue_token", "lumbergh", "--tenant", "initech", "--role", "reviewer")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {reviewer.strip().splitlines()[-1]}")
    assert client.get("/api/v1/runs").status_code == 403


def test_issue_token_refuses_unknown_tenants_and_roleless_users(django_user_model):
    with pytest.raises(CommandError, match="No tenant"):
        run_command("issue_token", "peter", "--tenant", "nowhere")
    run_command("create_tenant", "initech", "--owner", "peter")
    django_user_model.objects.create(username="outsider")
    with pytest.raises(CommandError, match="holds no role"):
        run_command("issue_token", "outsider", "--tenant", "initech")


def test_deploy_checks_pass_with_production_settings(tmp_path):
    """`check --deploy` under CAIRN_ENV=production reports only the documented HSTS-preload note."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "CAIRN_ENV": "production",
        "DJANGO_SETTINGS_MODULE": "cairn.settings",
        "CAIRN_HOME": str(tmp_path),
        "DJANGO_SECRET_KEY": "x" * 10 + os.urandom(40).hex(),
        "DJANGO_ALLOWED_HOSTS": "cairn.example.org",
    }
    for inherited in ("DATABASE_URL", "DJANGO_ALLOW_ASYNC_UNSAFE"):
        env.pop(inherited, None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    output = result.stdout + result.stderr
    warnings = [
        line for line in output.splitlines() if line.startswith("?:") or "(security." in line
    ]
    assert all("security.W021" in line for line in warnings), output
