"""Factories for test data. Rows that have invariants are made through the services."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model
from django.db import connection

from tenants.models import Tenant


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.django.Password("correct horse battery staple")


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"tenant{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())


SIMPLE_DEFINITION = {
    "initial": "collect_sources",
    "states": ["collect_sources", "draft_answer", "review", "publish", "done", "rejected"],
    "transitions": [
        ["collect_sources", "draft_answer"],
        ["draft_answer", "review"],
        ["review", "publish"],
        ["review", "rejected"],
        ["publish", "done"],
    ],
    "terminal": ["done", "rejected"],
    "approval_states": ["review"],
    "effect_states": ["publish"],
}


def forge_checkpoint(checkpoint, **columns: object) -> None:  # noqa: ANN001
    """UPDATE a checkpoint row past the ORM's refusal (and PostgreSQL's trigger), as an
    attacker with database access would."""
    from django.db import connection

    from checkpoints.models import Checkpoint

    table = connection.ops.quote_name(Checkpoint._meta.db_table)
    assignments = ", ".join(f"{connection.ops.quote_name(c)} = %s" for c in columns)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = replica")  # triggers off
        cursor.execute(
            f"UPDATE {table} SET {assignments} WHERE id = %s",  # noqa: S608 - names are ours
            [
                *columns.values(),
                checkpoint.pk.hex if connection.vendor == "sqlite" else checkpoint.pk,
            ],
        )
        assert cursor.rowcount == 1
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = origin")


# The envelope groups of a small, valid commit (nothing in them needs a run's history).
ENVELOPE_GROUPS = {
    "inputs": {},
    "evidence": {"artifacts": [], "validators": [], "outputs": {"n": 1}},
    "side_effects": [],
    "budgets": {},
    "control": {},
}


def stored_column(model, column: str, tenant) -> str:  # noqa: ANN001
    """A column of the tenant's row as the database holds it, read without the ORM (what a
    sealed column looks like at rest)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {column} FROM {model._meta.db_table} WHERE tenant_id = %s",
            [str(tenant.pk) if connection.vendor == "postgresql" else tenant.pk.hex],
        )
        return cursor.fetchone()[0]
