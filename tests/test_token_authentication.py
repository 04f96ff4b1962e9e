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
from tests.factories import UserFactory

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
