"""The SQL of the request path's identity: a bearer token with its member, its tenant and
the member's permissions there in one statement, and the permission rule itself.

SQL on purpose, like the commit's (``checkpoints.services.commit_sql``): every API request
asks it, and Django building and compiling the ORM's version (four EXISTS subqueries and two
joins) cost more than the database answering it (docs/performance.md). The statements are
built once from the models' metadata, and each row becomes model instances through the
database's own converters, as the ORM would make them.

The permission rule (``_held``) is written once and read by both statements: a member holds
each role permission granted on the tenant itself (guardian's object permission rows,
never global permissions or superuser status), and ``roles.REVIEW_RUN`` while they hold a
run grant there.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.db.models import Model

from tenants import roles
from tenants.models import ApiToken, RunGrant, Tenant, TenantUserObjectPermission
from tenants.prepared import model_columns, model_from_row, prepared_fetchone

# The permissions the rule knows, in the order of the statements' columns.
CODENAMES = (roles.REVIEW, roles.OPERATE, roles.ADMIN, roles.REVIEW_RUN)


def _held(user: str, tenant: str) -> str:
    """One EXISTS per codename, for the member and tenant the SQL expressions name."""
    grants = TenantUserObjectPermission._meta.db_table
    permission = Permission._meta.db_table
    role = (
        f"EXISTS (SELECT 1 FROM {grants} g JOIN {permission} p ON p.id = g.permission_id"
        f" WHERE g.user_id = {user} AND g.content_object_id = {tenant}"
        " AND p.codename = '{codename}')"
    )
    run_grant = (
        f"EXISTS (SELECT 1 FROM {RunGrant._meta.db_table} r"
        f" WHERE r.user_id = {user} AND r.tenant_id = {tenant})"
    )
    return ", ".join(
        run_grant if codename == roles.REVIEW_RUN else role.format(codename=codename)
        for codename in CODENAMES
    )


def held_set(flags: tuple[Any, ...]) -> frozenset[str]:
    return frozenset(codename for codename, on in zip(CODENAMES, flags, strict=True) if on)


def _models() -> tuple[type[Model], type[Model], type[Model]]:
    """The token's, its tenant's and its member's models, in the statement's order."""
    return ApiToken, Tenant, get_user_model()


@cache
def token_columns() -> str:
    """The token's select list: the token's, its tenant's and its member's columns, then
    the member's permissions there (``_held``), in the order ``token_from_row`` reads."""
    aliases = ("t", "n", "u")
    columns = ", ".join(model_columns(m, a) for m, a in zip(_models(), aliases, strict=True))
    return f"{columns}, {_held('t.user_id', 't.tenant_id')}"


@cache
def token_tables() -> str:
    """The token's tables, joined for ``token_columns``."""
    user = get_user_model()
    return (
        f"{ApiToken._meta.db_table} t"
        f" JOIN {Tenant._meta.db_table} n ON n.id = t.tenant_id"
        f" JOIN {user._meta.db_table} u ON u.id = t.user_id"
    )


def token_live(key: str) -> str:
    """The condition for the live token whose digest is the parameter ``key`` (SQL): not
    revoked, its member active."""
    return f"t.key_sha256 = {key} AND t.revoked_at IS NULL AND u.is_active"


@cache
def _token_sql() -> str:
    return f"SELECT {token_columns()} FROM {token_tables()} WHERE {token_live('%s')}"


@cache
def _held_sql() -> str:
    return f"SELECT {_held('%s', '%s')}"


@cache
def token_width() -> int:
    """How many columns of a row ``token_columns`` selects."""
    return sum(len(m._meta.concrete_fields) for m in _models()) + len(CODENAMES)


def token_from_row(row: Sequence[Any]) -> tuple[ApiToken, frozenset[str]]:
    """The token, its tenant and member loaded, and the member's permissions, from the
    first ``token_width()`` columns of a row that selected ``token_columns()``."""
    instances, start = [], 0
    for model in _models():
        end = start + len(model._meta.concrete_fields)
        instances.append(model_from_row(model, row[start:end]))
        start = end
    token, token.tenant, token.user = instances
    return token, held_set(row[start : token_width()])


def token_row(key_sha256: str) -> tuple[ApiToken, frozenset[str]] | None:
    """The live token with this digest (its member active), its tenant and member loaded,
    and the member's permissions in its tenant; None when there is none. One statement."""
    if connection.vendor == "postgresql":  # planned once per connection (tenants.prepared)
        row = prepared_fetchone(_token_sql(), [key_sha256])
    else:
        with connection.cursor() as cursor:
            cursor.execute(_token_sql(), [key_sha256])
            row = cursor.fetchone()
    return None if row is None else token_from_row(row)


def held_by(*, user_id: object, tenant_id: object) -> frozenset[str]:
    """The permissions the member holds in the tenant (``_held``'s rule). One statement."""
    tenant = Tenant._meta.pk.get_db_prep_value(tenant_id, connection)
    user = get_user_model()._meta.pk.get_db_prep_value(user_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(_held_sql(), [user, tenant] * (len(CODENAMES)))
        return held_set(cursor.fetchone())
