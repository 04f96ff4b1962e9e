"""A bearer token, its tenant, its member and the member's permissions come from one query,
and the permissions it finds are exactly the ones ``permissions_of`` decides for a signed-in
member: every combination of roles and run grants, in the token's tenant and elsewhere."""

from __future__ import annotations

import itertools

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from guardian.shortcuts import assign_perm, remove_perm

from tenants import roles
from tenants.models import RunGrant
from tenants.services import Actor, permissions_of, token_authenticate, token_issue
from tests.factories import ENVELOPE_GROUPS, UserFactory

TENANT_PERMISSIONS = (roles.REVIEW, roles.OPERATE, roles.ADMIN)


def _warm(secret: str) -> None:
    # The first use of a token records it (one UPDATE at most per minute); pin the steady state.
    assert token_authenticate(secret) is not None


@pytest.mark.django_db
def test_a_token_its_tenant_member_and_permissions_are_one_query(acme, bob):
    _, secret = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
    _warm(secret)
    with CaptureQueriesContext(connection) as queries:
        token = token_authenticate(secret)
    assert len(queries) == 1, [q["sql"] for q in queries.captured_queries]
    # Loaded by that query, not lazily afterwards.
    with CaptureQueriesContext(connection) as later:
        assert (token.tenant.slug, token.user.username) == ("acme", "bob")
    assert len(later) == 0
    assert token.permissions == {roles.OPERATE}


@pytest.mark.django_db
def test_a_token_holds_exactly_the_permissions_of_its_member(acme, globex, run):
    """Every subset of the tenant roles, with and without a run grant, and with roles held
    only in another tenant (which must not count)."""
    user = UserFactory(username="dana")
    assign_perm(f"tenants.{roles.REVIEW}", user, acme)  # so a token can be issued
    _, secret = token_issue(tenant=acme, user=user, actor=Actor.system("test"))
    for perm in TENANT_PERMISSIONS:
        assign_perm(f"tenants.{perm}", user, globex)  # noise from another tenant
    cases = itertools.product(*[(False, True)] * (len(TENANT_PERMISSIONS) + 1))
    for *held, granted in cases:
        for perm, on in zip(TENANT_PERMISSIONS, held, strict=True):
            (assign_perm if on else remove_perm)(f"tenants.{perm}", user, acme)
        RunGrant.objects.filter(user=user).delete()
        if granted:
            RunGrant.objects.create(tenant=acme, run=run, user=user)
        expected = permissions_of(user=user, tenant=acme)
        token = token_authenticate(secret)
        if not expected:
            assert token is None, (held, granted)
            continue
        assert token is not None and token.permissions == expected, (held, granted)


@pytest.mark.django_db(transaction=True)
def test_an_http_commit_builds_no_orm_query(acme, bob, workflow, api_as, monkeypatch):
    """The request path's statements are written SQL (the token's, the head's, the
    commit's): compiling ORM queries cost more than the database answering them. A runner
    sends every group (a group left out is read from the parent checkpoint)."""
    from django.db.models.sql.compiler import SQLCompiler

    from runtime.services.runs import run_create

    api = api_as(bob, acme)
    run = run_create(
        tenant=acme, workflow_type="research", execution="external", actor=Actor.system("t")
    )
    url = f"/api/v1/runs/{run.pk}/checkpoints"
    body = {"expected_version": run.version, "state": "draft_answer", "step": "d"}
    assert api.post(url, {**body, "envelope": ENVELOPE_GROUPS}, format="json").status_code == 201
    compiled = []
    original = SQLCompiler.as_sql

    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        compiled.append(self.query.model.__name__ if self.query.model else "?")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SQLCompiler, "as_sql", counted)
    body = {"expected_version": run.version + 1, "state": "review", "step": "r"}
    assert api.post(url, {**body, "envelope": ENVELOPE_GROUPS}, format="json").status_code == 201
    assert compiled == []


@pytest.mark.postgres
@pytest.mark.django_db
def test_on_postgresql_the_token_statement_is_prepared_once_per_connection(acme, bob):
    # Planning the token's permission subqueries cost more than running them (about 0.8 ms
    # against 0.1 ms a request, docs/performance.md): the statement is prepared server-side,
    # like the commit's, and planned once per connection.
    _, secret = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
    _warm(secret)
    for _ in range(3):
        assert token_authenticate(secret) is not None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE %s",
            ["%FROM tenants_apitoken t%"],
        )
        prepared = cursor.fetchall()
    assert len(prepared) == 1, prepared


@pytest.mark.django_db
def test_a_runners_token_and_head_are_one_statement_and_the_head_only_its_tenants(
    acme, globex, bob, workflow
):
    """``runner_read`` finds exactly the token ``token_authenticate`` finds, in every state a
    token can be in, and the head ``head_read`` reads, only of a run in the token's own
    tenant: another tenant's run, or none, is no head."""
    from uuid import uuid4

    from checkpoints.services import commit_sql
    from checkpoints.services.reads import runner_read
    from checkpoints.services.workflows import workflow_register
    from runtime.services.runs import run_create
    from tenants.services import member_set_role, token_revoke
    from tests.factories import SIMPLE_DEFINITION

    system = Actor.system("test")
    workflow_register(
        tenant=globex, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    runs = {
        tenant.slug: run_create(
            tenant=tenant, workflow_type="research", execution="external", actor=system
        )
        for tenant in (acme, globex)
    }
    dana = UserFactory(username="dana")
    member_set_role(tenant=acme, user=dana, role="reviewer", actor=system)
    live, live_secret = token_issue(tenant=acme, user=bob, actor=system)
    revoked, revoked_secret = token_issue(tenant=acme, user=bob, actor=system)
    token_revoke(token=revoked, actor=system)
    _, inactive_secret = token_issue(tenant=acme, user=dana, actor=system)
    dana.is_active = False
    dana.save(update_fields=["is_active"])
    erin = UserFactory(username="erin")
    member_set_role(tenant=acme, user=erin, role="reviewer", actor=system)
    _, roleless_secret = token_issue(tenant=acme, user=erin, actor=system)
    remove_perm(f"tenants.{roles.REVIEW}", erin, acme)
    _, outsider_secret = token_issue(
        tenant=globex,
        user=_member_of(globex, "frank"),
        actor=system,
    )
    secrets = {
        "live": live_secret,
        "revoked": revoked_secret,
        "inactive member": inactive_secret,
        "member without a role": roleless_secret,
        "another tenant's": outsider_secret,
        "unknown": "cairn_" + "x" * 40,
        "not Cairn's": "ghp_" + "x" * 36,
    }
    for what, secret in secrets.items():
        expected = token_authenticate(secret)
        for run_id in (runs["acme"].pk, runs["globex"].pk, uuid4()):
            with CaptureQueriesContext(connection) as queries:
                read = runner_read(secret=secret, run_id=run_id)
            assert len(queries) <= 1, (what, [q["sql"] for q in queries.captured_queries])
            if expected is None:
                assert read is None, what
                continue
            assert read is not None, what
            assert (read.token.pk, read.token.permissions) == (expected.pk, expected.permissions)
            assert (read.token.tenant, read.token.user) == (expected.tenant, expected.user)
            head = commit_sql.head_read(tenant_id=expected.tenant_id, run_id=run_id)
            assert read.head == head, (what, run_id)
            ours = run_id == runs[expected.tenant.slug].pk
            assert (head is not None) == ours, (what, run_id)


def _member_of(tenant, username: str):  # noqa: ANN001, ANN202
    from tenants.services import member_set_role

    user = UserFactory(username=username)
    member_set_role(tenant=tenant, user=user, role="operator", actor=Actor.system("test"))
    return user
