"""Secret references a deployment admin registered for a tenant.

A tenant may name a secret only by a reference registered for it here (``manage.py
secret_refs``, on the host): a reference is resolved with the deployment's environment
and files (``cairn.secrets``), so an unregistered ``env:DJANGO_SECRET_KEY`` would let a
tenant sign with the deployment's own secret, or another tenant's.
"""

from __future__ import annotations

from django.db import transaction

from cairn.errors import InvalidRequest
from tenants.models import Tenant, TenantSecretReference
from tenants.services import Actor, audit_record

MAX_REFERENCE = 200


def _reference_check(reference: str) -> str:
    scheme, sep, name = (reference or "").strip().partition(":")
    if scheme not in ("env", "file") or not sep or not name or len(reference) > MAX_REFERENCE:
        raise InvalidRequest(
            "A secret reference is env:NAME or file:NAME (at most 200 characters).",
            fields={"reference": "env:NAME or file:NAME"},
        )
    return f"{scheme}:{name}"


def tenant_secret_ref_allowed(*, tenant: Tenant, reference: str) -> bool:
    """Whether a deployment admin registered ``reference`` for ``tenant``."""
    return TenantSecretReference.objects.filter(tenant=tenant, reference=reference).exists()


def tenant_secret_ref_register(*, tenant: Tenant, reference: str, actor: Actor) -> bool:
    """Let ``tenant`` name ``reference``; returns whether it was new. Atomic; audited."""
    reference = _reference_check(reference)
    with transaction.atomic():
        _, created = TenantSecretReference.objects.get_or_create(tenant=tenant, reference=reference)
        if created:
            audit_record(
                tenant=tenant, actor=actor, action="secret_ref.registered", target=reference
            )
    return created


def tenant_secret_ref_remove(*, tenant: Tenant, reference: str, actor: Actor) -> bool:
    """Stop ``tenant`` naming ``reference`` (a webhook signed with it stops delivering
    until another secret is chosen). Returns whether it was registered. Atomic; audited."""
    with transaction.atomic():
        removed, _ = TenantSecretReference.objects.filter(
            tenant=tenant, reference=reference
        ).delete()
        if removed:
            audit_record(tenant=tenant, actor=actor, action="secret_ref.removed", target=reference)
    return bool(removed)


def tenant_secret_refs(*, tenant: Tenant) -> list[str]:
    return list(
        TenantSecretReference.objects.filter(tenant=tenant).values_list("reference", flat=True)
    )
