"""External operations: one intended side effect each, identified by an idempotency key.

The status machine is ``reserved → pending → confirmed | failed | unknown`` and
``unknown → confirmed | failed``. A reserved operation may also be settled directly (an
API caller that marks nothing pending before calling its provider). Confirmed and failed
are final. Repeating the move that produced the current status with the same data is
answered with the record unchanged, so a retried API call is harmless; any other move
raises OperationStateConflict. Every status change writes an audit event in its
transaction, and settling the last open operation of a ``cancelling`` run finishes the
cancel (``runtime.services.cancel_finish.run_cancel_complete``) in the same transaction.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from cairn.credentials import free_text_refuse, free_text_screen
from cairn.errors import (
    ApprovalRequired,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    OperationStateConflict,
    RunNotActive,
    SecretInEnvelope,
)
from checkpoints import crypto
from checkpoints.envelope import canonical_json, find_secret
from checkpoints.models import ExternalOperation, OperationStatus, Run, RunStatus
from checkpoints.services.approval_chain import approval_effect_refusal
from checkpoints.services.reads import run_get
from runtime.services.actions import locked_run
from runtime.services.cancel_finish import run_cancel_complete
from tenants.models import Tenant
from tenants.services import Actor, audit_record

TABLE = "external_operation"
REQUEST_FIELD, RESULT_FIELD = "request", "result"
FINAL_STATUSES = frozenset({OperationStatus.CONFIRMED, OperationStatus.FAILED})
# Statuses whose outcome Cairn does not know yet: a restore reconciles them first.
OPEN_STATUSES = frozenset({OperationStatus.PENDING, OperationStatus.UNKNOWN})
LEGAL_MOVES: dict[str, frozenset[str]] = {
    OperationStatus.RESERVED: frozenset(
        {
            OperationStatus.PENDING,
            OperationStatus.CONFIRMED,
            OperationStatus.FAILED,
            OperationStatus.UNKNOWN,
        }
    ),
    OperationStatus.PENDING: frozenset(
        {OperationStatus.CONFIRMED, OperationStatus.FAILED, OperationStatus.UNKNOWN}
    ),
    OperationStatus.UNKNOWN: frozenset({OperationStatus.CONFIRMED, OperationStatus.FAILED}),
    OperationStatus.CONFIRMED: frozenset(),
    OperationStatus.FAILED: frozenset(),
}
# A key is a URL path segment of the API.
_BAD_KEY = re.compile(r"[/\s\x00-\x1f\x7f]")
LIMITS = {"idempotency_key": 200, "action": 100, "target": 500, "request_fingerprint": 128}


def request_fingerprint(*, action: str, target: str, request: Any) -> str:
    """sha256 over the canonical JSON of what is asked: the same request, the same print."""
    body = {"action": action, "target": target, "request": request}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def _scope(operation: ExternalOperation, field: str) -> dict[str, Any]:
    return {
        "tenant_id": operation.tenant_id,
        "table": TABLE,
        "row_id": operation.id,
        "field": field,
    }


def operation_result(operation: ExternalOperation) -> Any:
    """The provider's result as stored (decrypted), or None before confirmation."""
    if not operation.result_sealed:
        return None
    return json.loads(crypto.unseal(operation.result_sealed, **_scope(operation, RESULT_FIELD)))


def operation_request(operation: ExternalOperation) -> Any:
    """The request payload as reserved (decrypted), or None when none was stored."""
    if not operation.request_sealed:
        return None
    return json.loads(crypto.unseal(operation.request_sealed, **_scope(operation, REQUEST_FIELD)))


@dataclass(frozen=True)
class OperationRead:
    """One operation with what it sent and what the provider answered (decrypted)."""

    operation: ExternalOperation
    request: Any
    result: Any


def operation_read(
    *, tenant: Tenant, run_id: UUID | str, operation_id: UUID | str, actor: Actor
) -> OperationRead:
    """The run's operation with its request and the provider's result, decrypted for a
    person (the read is audited as ``operation.read`` under the run). Raises NotFound for
    anything but an operation of this tenant's run ``run_id``; crypto.MissingKeyError when
    its key is not configured."""
    try:
        ids = {"run_id": UUID(str(run_id)), "pk": UUID(str(operation_id))}
    except ValueError:
        raise NotFound("No such operation on this run.")
    operation = ExternalOperation.objects.filter(tenant=tenant, **ids).first()
    if operation is None:
        raise NotFound("No such operation on this run.")
    read = OperationRead(
        operation=operation,
        request=operation_request(operation),
        result=operation_result(operation),
    )
    audit_record(
        tenant=tenant,
        actor=actor,
        action="operation.read",
        run_id=operation.run_id,
        target=operation.idempotency_key,
        details={"status": operation.status},
    )
    return read


def _check_text(values: dict[str, str]) -> None:
    problems = {
        name: f"1-{LIMITS[name]} characters"
        for name, value in values.items()
        if not isinstance(value, str) or not 0 < len(value) <= LIMITS[name]
    }
    key = values.get("idempotency_key")
    if "idempotency_key" not in problems and isinstance(key, str) and _BAD_KEY.search(key):
        problems["idempotency_key"] = "no '/', whitespace or control characters"
    if problems:
        raise InvalidRequest("The operation is not valid.", fields=problems)


def _screened(reason: str, actor: Actor) -> str:
    """A reason fit to store in the clear: a person's is refused if it looks like a
    credential, a worker's (a provider's answer) withheld."""
    return free_text_screen({"reason": reason}, refuse=actor.user is not None)["reason"]


def _check_no_secret(value: Any, path: str) -> None:
    found = find_secret(value, path)
    if found:
        raise SecretInEnvelope(
            f"{found[0]} looks like a credential ({found[1]}); pass a reference such as "
            "env:NAME and let the provider adapter resolve it when it calls.",
            fields={found[0]: found[1]},
        )


def _same_request(
    existing: ExternalOperation, *, tenant: Tenant, run: Run, action: str, target: str, fp: str
) -> ExternalOperation:
    if existing.run_id != run.pk:
        # Keys are unique per tenant: this is another run of the caller's own tenant.
        raise IdempotencyKeyReused(
            f"The idempotency key '{existing.idempotency_key}' is already used for an "
            "operation of another run; choose a key unique to this request."
        )
    if (existing.request_fingerprint, existing.action, existing.target) != (fp, action, target):
        raise IdempotencyKeyReused(
            f"The idempotency key '{existing.idempotency_key}' was reserved for "
            f"{existing.action} on {existing.target} with request fingerprint "
            f"{existing.request_fingerprint[:16]}…; a key names exactly one request."
        )
    return existing


def operation_reserve(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    idempotency_key: str,
    action: str,
    target: str,
    request_fingerprint: str,
    actor: Actor,
    step: str = "",
    provider: str = "",
    request: Any = None,
    client_reference: str = "",
) -> tuple[ExternalOperation, bool]:
    """Reserve ``idempotency_key`` for one request of ``run_id``; return (operation, created).

    The same key with the same action, target and fingerprint answers with the existing
    record (created False), whatever its status and the run's. A new key is refused once the
    run has ended or is being cancelled; that check and the insert are one transaction under
    the run's row lock, so a cancel cannot slip in between (it waits, and then sees the
    operation and waits for it to be settled; or this waits, and then sees ``cancelling``).
    Two concurrent reservations of one key: the unique constraint lets exactly one insert
    win; the other reads the winner's row. Atomic with its audit event. ``request`` is
    stored sealed, never in clear.

    Keys are unique per tenant: another tenant's keys are neither seen nor squatted.

    At a state past an approval state a new operation must be the action the approval
    allowed, on the artifact it approved, under an approval the run's history consumed
    (``approval_effect_refusal``): else ApprovalRequired, and nothing is reserved.

    Raises NotFound, RunNotActive, InvalidRequest, SecretInEnvelope (a credential in the
    request), ApprovalRequired or IdempotencyKeyReused (the key belongs to another request
    or run).
    """
    _check_text(
        {
            "idempotency_key": idempotency_key,
            "action": action,
            "target": target,
            "request_fingerprint": request_fingerprint,
        }
    )
    if len(step) > 100 or len(provider) > 100 or len(client_reference) > 200:
        raise InvalidRequest(
            "step and provider are at most 100 characters, client_reference at most 200."
        )
    _check_no_secret(request, "request")
    # Stored and listed in the clear, so none may carry a credential either.
    free_text_refuse(
        {
            "idempotency_key": idempotency_key,
            "action": action,
            "target": target,
            "request_fingerprint": request_fingerprint,
            "step": step,
            "client_reference": client_reference,
        }
    )
    with transaction.atomic():
        run = locked_run(tenant=tenant, run_id=run_id)
        facts = {"tenant": tenant, "run": run, "action": action, "target": target}
        existing = ExternalOperation.objects.filter(
            tenant=tenant, idempotency_key=idempotency_key
        ).first()
        if existing is not None:
            return _same_request(existing, fp=request_fingerprint, **facts), False
        if run.is_terminal:
            raise RunNotActive(f"The run is {run.status}; it reserves no new operations.")
        if run.status == RunStatus.CANCELLING:
            raise RunNotActive("The run is being cancelled; it reserves no new operations.")
        # Past an approval state an effect is the one the approval allowed, on the approved
        # artifact, under an approval the run's history consumed (approval_chain).
        refusal = approval_effect_refusal(run, action=action)
        if refusal:
            raise ApprovalRequired(refusal, fields={"action": action})
        operation = ExternalOperation(
            id=uuid.uuid4(),
            tenant=tenant,
            run=run,
            step=step,
            idempotency_key=idempotency_key,
            action=action,
            target=target,
            request_fingerprint=request_fingerprint,
            provider=provider,
            client_reference=client_reference,
            status=OperationStatus.RESERVED,
        )
        if request is not None:
            operation.request_sealed = crypto.seal(
                canonical_json(request), **_scope(operation, REQUEST_FIELD)
            )
        try:
            with transaction.atomic():  # a savepoint: the race below is answered, not raised
                operation.save(force_insert=True)
                _audit(operation, actor, "operation.reserved", from_status="")
        except IntegrityError:
            # A concurrent reservation of the same key (for another run: one of this run
            # waits for the row lock) committed first: answer with its row.
            winner = ExternalOperation.objects.filter(
                tenant=tenant, idempotency_key=idempotency_key
            ).first()
            if winner is None:
                raise
            return _same_request(winner, fp=request_fingerprint, **facts), False
    return operation, True


def operation_envelope_entry(
    operation: ExternalOperation, *, status: str | None = None
) -> dict[str, Any]:
    """The operation as a checkpoint's ``side_effects`` group lists it (``status`` overrides
    the row's, for the pending checkpoint written in the same transaction as the move)."""
    return {
        "idempotency_key": operation.idempotency_key,
        "action": operation.action,
        "target": operation.target[:500],
        "provider_operation_id": operation.provider_operation_id or None,
        "status": status or operation.status,
    }


def operations_envelope_entries(
    *, run_id: UUID | str, entries: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``entries`` (a side-effects group) with each of the run's operations as the
    operations table has it now, in the same order. An entry with no row of this run (a
    fork's inherited entries name the source run's operations) is kept as it is. One query.
    """
    keys = [e.get("idempotency_key") for e in entries]
    current = {
        op.idempotency_key: op
        for op in ExternalOperation.objects.filter(run_id=run_id, idempotency_key__in=keys)
    }
    return [
        operation_envelope_entry(current[e["idempotency_key"]])
        if e.get("idempotency_key") in current
        else dict(e)
        for e in entries
    ]


def operation_get(*, tenant: Tenant, run_id: UUID | str, idempotency_key: str) -> ExternalOperation:
    """The run's operation with this key, or NotFound (also for another tenant's)."""
    run = run_get(tenant=tenant, run_id=run_id)
    operation = ExternalOperation.objects.filter(
        tenant=tenant, run=run, idempotency_key=idempotency_key
    ).first()
    if operation is None:
        raise NotFound(f"The run has no operation with the idempotency key '{idempotency_key}'.")
    return operation


def operations_for_run(*, tenant: Tenant, run_id: UUID | str) -> QuerySet[ExternalOperation]:
    run = run_get(tenant=tenant, run_id=run_id)
    return ExternalOperation.objects.filter(tenant=tenant, run=run).order_by("created_at", "id")


_OPEN_EXIST = (
    f"SELECT 1 FROM {ExternalOperation._meta.db_table} WHERE run_id = %s AND status IN (%s, %s)"
    " LIMIT 1"
)


def operations_open_exist(*, run_id: UUID) -> bool:
    """Whether the run has an operation whose outcome is not known yet. One plain statement:
    every take-over asks, and most runs have none (building the ORM query cost more)."""
    run_key = Run._meta.pk.get_db_prep_value(run_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(_OPEN_EXIST, [run_key, *sorted(OPEN_STATUSES)])
        return cursor.fetchone() is not None


def operations_open(*, run: Run) -> QuerySet[ExternalOperation]:
    """The run's operations whose outcome is not known yet (pending or unknown)."""
    return ExternalOperation.objects.filter(run=run, status__in=OPEN_STATUSES).order_by(
        "created_at", "id"
    )


def operations_stalled(
    *, tenant: Tenant | None = None, older_than: timedelta | None = None
) -> QuerySet[ExternalOperation]:
    """Operations pending longer than ``older_than`` (CAIRN_STALLED_OPERATION_SECONDS by
    default) since their first attempt, oldest first: an effect that was started and never
    settled (retries do not reset the clock)."""
    if older_than is None:
        older_than = timedelta(seconds=settings.CAIRN_STALLED_OPERATION_SECONDS)
    stalled = ExternalOperation.objects.filter(
        status=OperationStatus.PENDING, created_at__lt=timezone.now() - older_than
    )
    if tenant is not None:
        stalled = stalled.filter(tenant=tenant)
    return stalled.select_related("run").order_by("created_at", "id")


def _audit(
    operation: ExternalOperation, actor: Actor, action: str, *, from_status: str, reason: str = ""
) -> None:
    audit_record(
        tenant=operation.tenant,
        actor=actor,
        action=action,
        run_id=operation.run_id,
        target=f"operation {operation.idempotency_key}",
        reason=reason,
        details={
            "idempotency_key": operation.idempotency_key,
            "action": operation.action,
            "from": from_status,
            "to": operation.status,
            "provider_operation_id": operation.provider_operation_id,
        },
    )


def _locked(operation_id: UUID) -> ExternalOperation:
    return (
        ExternalOperation.objects.select_for_update().select_related("tenant").get(pk=operation_id)
    )


def _move(
    operation: ExternalOperation,
    to: str,
    *,
    actor: Actor,
    audit_action: str,
    reason: str = "",
    same: bool = False,
    changes: dict[str, Any] | None = None,
) -> ExternalOperation:
    """Apply one legal move to the locked row, with its audit event. ``same`` says whether a
    repeat of the move that produced the current status carries the same data."""
    if operation.status == to and same:
        return operation
    if to not in LEGAL_MOVES[operation.status]:
        raise OperationStateConflict(
            f"Operation '{operation.idempotency_key}' is {operation.status}; it cannot become "
            f"{to}." + (" Its outcome is final." if operation.status in FINAL_STATUSES else "")
        )
    from_status = operation.status
    operation.status = to
    for name, value in (changes or {}).items():
        setattr(operation, name, value)
    if reason:
        operation.reason = reason[:2000]
    operation.save(update_fields=["status", "reason", "updated_at", *(changes or {})])
    if from_status == OperationStatus.UNKNOWN:
        # Settling an ambiguity is an outcome decision whoever makes it.
        audit_action = "operation.outcome_recorded"
    _audit(operation, actor, audit_action, from_status=from_status, reason=reason)
    return operation


def _finish_cancel_if_settled(operation: ExternalOperation, actor: Actor) -> None:
    """A run being cancelled waits for its open operations; settling the last one ends it."""
    if Run.objects.filter(pk=operation.run_id, status=RunStatus.CANCELLING).exists():
        run_cancel_complete(tenant=operation.tenant, run_id=operation.run_id, actor=actor)


def operation_mark_pending(*, operation_id: UUID, actor: Actor) -> ExternalOperation:
    """reserved → pending: the provider is about to be called. Atomic; audited.

    Raises OperationStateConflict from any other status than reserved or pending.
    """
    with transaction.atomic():
        operation = _locked(operation_id)
        return _move(
            operation,
            OperationStatus.PENDING,
            actor=actor,
            audit_action="operation.pending",
            same=True,
        )


def operation_attempt(*, operation_id: UUID, note: str = "") -> ExternalOperation:
    """Count one call to the provider, durably, before it is made; the status is unchanged.

    Raises OperationStateConflict unless the operation is pending.
    """
    with transaction.atomic():
        operation = _locked(operation_id)
        if operation.status != OperationStatus.PENDING:
            raise OperationStateConflict(
                f"Operation '{operation.idempotency_key}' is {operation.status}; only a pending "
                "operation is sent to its provider."
            )
        ExternalOperation.objects.filter(pk=operation.pk).update(
            attempts=F("attempts") + 1,
            reason=free_text_screen({"note": note[:2000]}, refuse=False)["note"],
            updated_at=timezone.now(),
        )
        operation.refresh_from_db()
        return operation


def operation_note(*, operation_id: UUID, note: str) -> None:
    """Record what was last learnt about an open operation (e.g. "the provider was
    unreachable"); the status is unchanged."""
    ExternalOperation.objects.filter(pk=operation_id).update(
        reason=free_text_screen({"note": note[:2000]}, refuse=False)["note"],
        updated_at=timezone.now(),
    )


def operation_record_job(*, operation_id: UUID, job_id: str, actor: Actor) -> ExternalOperation:
    """Record the provider's job id of a long-running operation, before anyone polls it.

    A reserved operation becomes pending (the job was submitted); a pending or unknown one
    keeps its status. Recording the same job id again answers the record unchanged, so a
    retried call is harmless. Atomic with its audit event (``operation.job_recorded``).

    Raises InvalidRequest (an empty job id, over 200 characters or with control characters)
    or OperationStateConflict (the operation already has another job id, or its outcome is
    final: confirmed or failed).
    """
    if not isinstance(job_id, str) or not job_id.strip() or len(job_id) > 200:
        raise InvalidRequest(
            "job_id is the provider's job id: 1-200 characters.",
            fields={"job_id": "1-200 characters"},
        )
    if re.search(r"[\x00-\x1f\x7f]", job_id):
        raise InvalidRequest(
            "job_id may not contain control characters.", fields={"job_id": "control character"}
        )
    free_text_refuse({"job_id": job_id})
    with transaction.atomic():
        operation = _locked(operation_id)
        if operation.provider_job_id == job_id:
            return operation
        if operation.status in FINAL_STATUSES:
            raise OperationStateConflict(
                f"Operation '{operation.idempotency_key}' is {operation.status}; its outcome is "
                "final and it takes no job id."
            )
        if operation.provider_job_id:
            raise OperationStateConflict(
                f"Operation '{operation.idempotency_key}' already observes job "
                f"'{operation.provider_job_id}'; a second job would be a second submission."
            )
        from_status = operation.status
        operation.provider_job_id = job_id
        if operation.status == OperationStatus.RESERVED:
            operation.status = OperationStatus.PENDING
        operation.save(update_fields=["provider_job_id", "status", "updated_at"])
        _audit(
            operation,
            actor,
            "operation.job_recorded",
            from_status=from_status,
            reason=f"provider job {job_id}",
        )
        return operation


def operation_confirm(
    *,
    operation_id: UUID,
    provider_operation_id: str,
    result: Any,
    actor: Actor,
    reason: str = "",
    audit_action: str = "operation.confirmed",
) -> ExternalOperation:
    """→ confirmed with the provider's operation id and result (sealed). Atomic; audited.

    Confirming again with the same provider id answers the record unchanged. Raises
    InvalidRequest (no provider id) or OperationStateConflict (failed, or confirmed with
    another provider id).
    """
    if not isinstance(provider_operation_id, str) or not 0 < len(provider_operation_id) <= 200:
        raise InvalidRequest(
            "A confirmation names the provider's operation id (1-200 characters).",
            fields={"provider_operation_id": "required"},
        )
    _check_no_secret(result, "result")
    free_text_refuse({"provider_operation_id": provider_operation_id})
    reason = _screened(reason, actor)
    with transaction.atomic():
        operation = _locked(operation_id)
        operation = _move(
            operation,
            OperationStatus.CONFIRMED,
            actor=actor,
            audit_action=audit_action,
            reason=reason,
            same=operation.provider_operation_id == provider_operation_id,
            changes={
                "provider_operation_id": provider_operation_id,
                "result_sealed": crypto.seal(
                    canonical_json(result), **_scope(operation, RESULT_FIELD)
                ),
            },
        )
        _finish_cancel_if_settled(operation, actor)
    return operation


def operation_fail(
    *,
    operation_id: UUID,
    reason: str,
    actor: Actor,
    audit_action: str = "operation.failed",
) -> ExternalOperation:
    """→ failed: the provider did not and will not perform it. Atomic; audited.

    Raises InvalidRequest (no reason) or OperationStateConflict (already confirmed).
    """
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidRequest("Say why the operation failed.", fields={"reason": "required"})
    reason = _screened(reason, actor)
    with transaction.atomic():
        operation = _locked(operation_id)
        operation = _move(
            operation,
            OperationStatus.FAILED,
            actor=actor,
            audit_action=audit_action,
            reason=reason,
            same=True,
        )
        _finish_cancel_if_settled(operation, actor)
    return operation


def operation_mark_unknown(
    *, operation_id: UUID, actor: Actor, reason: str = ""
) -> ExternalOperation:
    """→ unknown: the outcome cannot be told; a reconcile or an operator settles it later.

    Atomic; audited. Raises OperationStateConflict from confirmed or failed.
    """
    reason = _screened(reason, actor)
    with transaction.atomic():
        operation = _locked(operation_id)
        return _move(
            operation,
            OperationStatus.UNKNOWN,
            actor=actor,
            audit_action="operation.unknown",
            reason=reason or "the outcome is not known",
            same=True,
        )


def operation_record_outcome(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    idempotency_key: str,
    outcome: str,
    reason: str,
    actor: Actor,
    provider_operation_id: str = "",
    result: Any = None,
) -> ExternalOperation:
    """An operator settles an operation whose outcome Cairn does not know: ``outcome`` is
    "confirmed" (with the provider id they found) or "failed". Unknown and pending ones are
    ambiguous; a reserved one may not have been sent, or may have been by an API caller that
    marks nothing pending (and a cancelling run waits for it, whether or not its provider
    can be asked). The reason is required and audited as ``operation.outcome_recorded``
    (with the status it was recorded from). Atomic.

    Raises NotFound, InvalidRequest or OperationStateConflict (the outcome is already known).
    """
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidRequest("Say how the outcome was established.", fields={"reason": "required"})
    if outcome not in (OperationStatus.CONFIRMED, OperationStatus.FAILED):
        raise InvalidRequest(
            "The outcome is 'confirmed' or 'failed'.", fields={"outcome": "confirmed|failed"}
        )
    operation = operation_get(tenant=tenant, run_id=run_id, idempotency_key=idempotency_key)
    if operation.status in FINAL_STATUSES:
        raise OperationStateConflict(
            f"Operation '{idempotency_key}' is {operation.status}; only a reserved, pending or "
            "unknown operation needs its outcome recorded."
        )
    with transaction.atomic():
        if outcome == OperationStatus.CONFIRMED:
            settled = operation_confirm(
                operation_id=operation.id,
                provider_operation_id=provider_operation_id,
                result=result if result is not None else {},
                actor=actor,
                reason=reason,
                audit_action="operation.outcome_recorded",
            )
        else:
            settled = operation_fail(
                operation_id=operation.id,
                reason=reason,
                actor=actor,
                audit_action="operation.outcome_recorded",
            )
        _run_reason_after_outcome(settled, outcome=outcome, actor=actor)
        return settled


def _run_reason_after_outcome(operation: ExternalOperation, *, outcome: str, actor: Actor) -> None:
    """Say on the run that the outcome is known now: a reason that still asks for it would
    send the next operator to do it again. The version does not move (nothing else changed);
    a run that finished meanwhile (a cancel completed by this outcome) keeps its reason."""
    still_open = (
        ExternalOperation.objects.filter(run_id=operation.run_id)
        .exclude(status__in=FINAL_STATUSES)
        .count()
    )
    reason = f"outcome of {operation.idempotency_key} recorded as {outcome} by {actor.name}; " + (
        f"{still_open} operation(s) still without a known outcome"
        if still_open
        else "no operation is left without a known outcome"
    )
    Run.objects.filter(pk=operation.run_id).exclude(
        status__in=(RunStatus.CANCELLED, RunStatus.SUCCEEDED)
    ).update(status_reason=reason)
