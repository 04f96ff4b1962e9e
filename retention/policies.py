"""Editing retention policies and legal holds (admins, through the console)."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.db import transaction

from checkpoints.errors import InvalidRequest, NotFound
from checkpoints.models import Run
from retention.models import RetentionPolicy
from tenants.models import Tenant
from tenants.services import Actor, audit_record

PERIODS = ("intermediate_days", "model_context_days", "failed_run_days", "run_expiry_days")
MAX_DAYS = 36500


@dataclass(frozen=True)
class PolicyInput:
    workflow_type: str = ""
    intermediate_days: int | None = None
    model_context_days: int | None = None
    failed_run_days: int | None = None
    run_expiry_days: int | None = None


def policy_validate(data: PolicyInput) -> None:
    """Raise InvalidRequest (with ``fields``) when the periods contradict each other."""
    fields: dict[str, str] = {}
    for name in PERIODS:
        value = getattr(data, name)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DAYS
        ):
            fields[name] = f"a whole number of days from 1 to {MAX_DAYS}, or empty for forever"
    if len(data.workflow_type) > 100:
        fields["workflow_type"] = "at most 100 characters"
    if fields:
        raise InvalidRequest("The retention policy is not valid.", fields=fields)
    keep, failed, expiry = data.intermediate_days, data.failed_run_days, data.run_expiry_days
    if failed is not None and (keep is None or failed < keep):
        fields["failed_run_days"] = (
            "failed runs can only be kept longer than the others (at least the intermediate "
            "period); leave it empty to treat them alike"
        )
    if expiry is not None and (
        keep is None or keep > expiry or (failed is not None and failed > expiry)
    ):
        fields["run_expiry_days"] = (
            "a run cannot expire before its intermediate checkpoints' period ends; "
            "set every period to at most the expiry"
        )
    if fields:
        raise InvalidRequest("The retention periods contradict each other.", fields=fields)


def policy_build(*, tenant: Tenant, data: PolicyInput) -> RetentionPolicy:
    """An unsaved policy with ``data`` applied: the saved one of that scope, or a new one."""
    policy = RetentionPolicy.objects.filter(
        tenant=tenant, workflow_type=data.workflow_type
    ).first() or RetentionPolicy(tenant=tenant, workflow_type=data.workflow_type)
    for name in PERIODS:
        setattr(policy, name, getattr(data, name))
    return policy


def retention_policy_save(*, tenant: Tenant, data: PolicyInput, actor: Actor) -> RetentionPolicy:
    """Create or replace the tenant's policy for ``data.workflow_type`` (blank: default).

    Atomic with its audit event. Raises InvalidRequest when the periods are not valid.
    """
    policy_validate(data)
    with transaction.atomic():
        saved = RetentionPolicy.objects.filter(tenant=tenant, workflow_type=data.workflow_type)
        before = saved.values(*PERIODS).first()
        policy = policy_build(tenant=tenant, data=data)
        policy.updated_by = actor.name[:200]
        policy.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="retention.policy_set",
            target=policy.workflow_type or "default",
            details={"before": before, "after": {n: getattr(policy, n) for n in PERIODS}},
        )
    return policy


def retention_policy_delete(*, tenant: Tenant, workflow_type: str, actor: Actor) -> bool:
    """Remove a policy (its runs fall back to the default). Atomic with its audit event."""
    with transaction.atomic():
        deleted, _ = RetentionPolicy.objects.filter(
            tenant=tenant, workflow_type=workflow_type
        ).delete()
        if deleted:
            audit_record(
                tenant=tenant,
                actor=actor,
                action="retention.policy_removed",
                target=workflow_type or "default",
            )
    return bool(deleted)


def legal_hold_set(
    *, tenant: Tenant, on: bool, actor: Actor, run_id: UUID | str | None = None, reason: str = ""
) -> None:
    """Put the whole tenant, or one of its runs, on legal hold (or release it).

    While held nothing of it is deleted; a retention batch already running finishes.
    Atomic with its audit event. Raises NotFound for a run outside the tenant.
    """
    with transaction.atomic():
        if run_id is None:
            Tenant.objects.filter(pk=tenant.pk).update(legal_hold=on)
            tenant.legal_hold = on
        else:
            try:
                updated = Run.objects.filter(tenant=tenant, pk=run_id).update(legal_hold=on)
            except (ValueError, TypeError):
                updated = 0
            if not updated:
                raise NotFound("No such run.")
        audit_record(
            tenant=tenant,
            actor=actor,
            action="retention.legal_hold_on" if on else "retention.legal_hold_off",
            run_id=None if run_id is None else UUID(str(run_id)),
            target="tenant" if run_id is None else f"run {run_id}",
            reason=reason,
        )
