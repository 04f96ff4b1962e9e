"""Editing retention policies and legal holds (admins, through the console)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from uuid import UUID

from django.db import transaction

from cairn.errors import InvalidRequest, NotFound
from checkpoints.models import CompactionRecord, Run
from checkpoints.services.workflows import workflows_visible
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


def policy_scopes(*, tenant: Tenant) -> list[str]:
    """The workflow types the retention page offers: those with a definition visible to
    ``tenant`` (its own or registered in code), and any that already has a saved policy (so
    it can be looked at and removed, even if its definition is gone)."""
    registered = workflows_visible(tenant=tenant).values_list("workflow_type", flat=True)
    saved = (
        RetentionPolicy.objects.filter(tenant=tenant)
        .exclude(workflow_type="")
        .values_list("workflow_type", flat=True)
    )
    return sorted(set(registered) | set(saved))


def policy_scope_check(*, tenant: Tenant, workflow_type: str) -> None:
    """Raise InvalidRequest unless ``workflow_type`` is blank (the default) or a workflow
    type with a definition visible to ``tenant``."""
    if workflow_type and not (
        workflows_visible(tenant=tenant).filter(workflow_type=workflow_type).exists()
    ):
        sentence = (
            f"There is no workflow of type \u201c{workflow_type[:100]}\u201d in this tenant: "
            "a policy can only apply to a registered workflow type, or to all of them."
        )
        raise InvalidRequest(sentence, fields={"workflow_type": sentence})


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

    Atomic with its audit event. Raises InvalidRequest when the periods are not valid or
    ``data.workflow_type`` is not a workflow type of the tenant (``policy_scope_check``).
    """
    policy_validate(data)
    with transaction.atomic():
        policy_scope_check(tenant=tenant, workflow_type=data.workflow_type)
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
    """Remove a policy (its runs fall back to the default). Atomic with its audit event.

    The compaction records it wrote keep its label and lose its id: the store's model holds
    ``policy_id`` as a plain column, so the database's foreign key would refuse the delete.
    """
    with transaction.atomic():
        policies = RetentionPolicy.objects.filter(tenant=tenant, workflow_type=workflow_type)
        CompactionRecord.objects.filter(tenant=tenant, policy_id__in=policies.values("pk")).update(
            policy_id=None
        )
        deleted, _ = policies.delete()
        if deleted:
            audit_record(
                tenant=tenant,
                actor=actor,
                action="retention.policy_removed",
                target=workflow_type or "default",
            )
    return bool(deleted)


def run_id_parse(run_id: UUID | str) -> UUID:
    """A run id as typed, or InvalidRequest (with ``fields["run_id"]``) saying what is wrong.

    A blank id is refused: it never stands for "no run", let alone for the whole tenant.
    """
    if isinstance(run_id, UUID):
        return run_id
    raw = str(run_id).strip()
    if not raw:
        raise InvalidRequest("Enter a run id.", fields={"run_id": "Enter a run id."})
    try:
        return UUID(raw)
    except ValueError:
        sentence = (
            f"\u201c{raw[:40]}\u201d is not a run id: paste the full id shown on the run's "
            "page (36 characters)."
        )
        raise InvalidRequest(sentence, fields={"run_id": sentence}) from None


RUN_PREFIX_MIN = 8


def run_id_resolve(*, tenant: Tenant, run_id: UUID | str) -> UUID:
    """The tenant's run named by its full id or by a prefix of at least 8 characters (the
    console shows 8). InvalidRequest (``fields["run_id"]``) for a blank, malformed, too
    short or ambiguous prefix; NotFound when no run of the tenant starts with it."""
    if isinstance(run_id, UUID):
        return run_id
    raw = str(run_id).strip().lower()
    try:
        return run_id_parse(raw)
    except InvalidRequest:
        if not re.fullmatch(r"[0-9a-f][0-9a-f-]{0,35}", raw):
            raise
    if len(raw.replace("-", "")) < RUN_PREFIX_MIN:
        raise InvalidRequest("Enter at least 8 characters of the run id.", fields={"run_id": raw})
    # The first 8 characters hold no dash: they match SQLite's hex and PostgreSQL's text alike.
    matches = list(
        Run.objects.filter(tenant=tenant, pk__startswith=raw[:8]).values_list("pk", flat=True)
    )
    matches = [pk for pk in matches if str(pk).startswith(raw) or pk.hex.startswith(raw)][:20]
    if not matches:
        raise NotFound(f"No run of this tenant starts with \u201c{raw[:40]}\u201d.")
    if len(matches) > 1:
        sentence = f"\u201c{raw[:40]}\u201d starts {len(matches)} runs' ids; type more of the id."
        raise InvalidRequest(sentence, fields={"run_id": sentence})
    return matches[0]


def legal_hold_set(
    *, tenant: Tenant, on: bool, actor: Actor, run_id: UUID | str | None = None, reason: str = ""
) -> None:
    """Put the whole tenant (``run_id`` None), or one of its runs, on legal hold (or release it).

    Only None means the tenant: a blank or malformed ``run_id`` is refused (InvalidRequest),
    and a run that is not the tenant's is NotFound, the same whether it exists elsewhere or
    not at all. While held nothing of it is deleted; a retention batch already running
    finishes. Atomic with its audit event.
    """
    run_uuid = None if run_id is None else run_id_parse(run_id)
    with transaction.atomic():
        if run_uuid is None:
            Tenant.objects.filter(pk=tenant.pk).update(legal_hold=on)
            tenant.legal_hold = on
        elif not Run.objects.filter(tenant=tenant, pk=run_uuid).update(legal_hold=on):
            raise NotFound("No such run in this tenant.")
        audit_record(
            tenant=tenant,
            actor=actor,
            action="retention.legal_hold_on" if on else "retention.legal_hold_off",
            run_id=run_uuid,
            target="tenant" if run_uuid is None else f"run {run_uuid}",
            reason=reason,
        )
