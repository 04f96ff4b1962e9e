"""Committing, reading and verifying checkpoints: the one-transaction protocol.

A commit is one transaction of three writes: the run's optimistic version update, the
checkpoint insert (hash-chained to its parent) and the outbox message for the next
command. When the version check fails nothing is written and ConcurrentCheckpointWrite is
raised, so one parent checkpoint has exactly one accepted successor.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cairn import clock
from cairn.credentials import free_text_screen
from cairn.errors import (
    ArtifactHashMismatch,
    CairnError,
    ConcurrentCheckpointWrite,
    IllegalTransition,
    IntegrityFailure,
    InvalidEnvelope,
    LeaseHeld,
    NotFound,
    PayloadTooLarge,
    RunNotActive,
    SecretInEnvelope,
)
from checkpoints import crypto
from checkpoints import envelope as env
from checkpoints.approvals_port import ApprovalUse
from checkpoints.models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    Artifact,
    Checkpoint,
    Execution,
    ExternalOperation,
    OperationStatus,
    Run,
    RunStatus,
)
from checkpoints.services import changes, commit_sql, outbox
from checkpoints.services.commit_rules import commit_approval_consume, commit_rules_check
from checkpoints.services.commit_sql import RunHead
from checkpoints.services.reads import FIELD, TABLE, latest_envelope
from checkpoints.services.references import artifact_ids_of, references_record
from checkpoints.services.workflows import transition_allowed
from telemetry.latency import commit_latency_record
from telemetry.tracing import commit_traced
from tenants.models import Tenant
from tenants.services import Actor

log = logging.getLogger("cairn.checkpoints")

BUDGET_USED_KEYS = ("attempts_used", "tokens_used", "cost_used", "elapsed_seconds")
BUDGET_LIMIT_KEYS = ("max_attempts", "max_tokens", "max_cost", "deadline")
# Statuses a writer may set with a commit; the rest belong to operator actions.
COMMIT_STATUSES = frozenset(
    {
        RunStatus.RUNNING,
        RunStatus.WAITING_APPROVAL,
        RunStatus.WAITING_RETRY,
        RunStatus.RECONCILING,
        RunStatus.PAUSED_FOR_REVIEW,
        RunStatus.FAILED,
        RunStatus.SUCCEEDED,
    }
)


@dataclass(frozen=True)
class CommitResult:
    checkpoint_id: UUID
    sequence: int
    sha256: str
    parent_sha256: str
    run_version: int
    status: str  # the run's status after the commit
    # The run as this commit left it, for the caller's next commit (``head=``).
    head: RunHead | None = None
    envelope: dict[str, Any] | None = None  # the full envelope as committed
    outbox_id: int | None = None  # the run's next command (or event) in the outbox


def canonical_seal(*, tenant_id: object, checkpoint_id: object, canonical: bytes) -> str:
    """An envelope's canonical bytes sealed for its checkpoint row (compressed, then
    encrypted with the tenant, table, row and field as associated data)."""
    return crypto.seal(
        canonical,
        tenant_id=tenant_id,
        table=TABLE,
        row_id=checkpoint_id,
        field=FIELD,
        compress=True,
    )


def envelope_seal(*, tenant_id: object, checkpoint_id: object, envelope: dict[str, Any]) -> str:
    return canonical_seal(
        tenant_id=tenant_id, checkpoint_id=checkpoint_id, canonical=env.canonical_json(envelope)
    )


def budget_limits_snapshot(run: Run) -> dict[str, Any]:
    return {key: run.budget_limits.get(key) for key in BUDGET_LIMIT_KEYS}


def _check_client_groups(groups: dict[str, Any]) -> None:
    unknown = set(groups) - set(env.CLIENT_GROUPS)
    if unknown:
        raise InvalidEnvelope(
            "The envelope has groups a writer may not set.",
            fields={name: "not a writable envelope group" for name in sorted(unknown)},
        )
    shapeless = {
        name: "must be a JSON list" if name == "side_effects" else "must be a JSON object"
        for name, value in groups.items()
        if not isinstance(value, list if name == "side_effects" else dict)
    }
    if shapeless:
        raise InvalidEnvelope("The envelope's groups have the wrong shape.", fields=shapeless)
    # One serialization serves the size check and the credential scan. Compact JSON's length
    # is the canonical length to within key order.
    text = env.json_bytes(groups)
    size = len(text)
    if size > settings.CAIRN_MAX_ENVELOPE_BYTES:
        raise PayloadTooLarge(
            f"The envelope is {size} bytes; the limit is {settings.CAIRN_MAX_ENVELOPE_BYTES}. "
            "Store large content as an artifact and reference it by id and sha256."
        )
    found = env.find_secret(groups, text=text)
    if found:
        path, what = found
        raise SecretInEnvelope(
            f"{path} looks like a credential ({what}). Envelopes hold secret references "
            "such as env:NAME, never the secret itself.",
            fields={path: what},
        )


def _check_artifacts(tenant: Tenant, evidence: dict[str, Any]) -> None:
    refs = evidence.get("artifacts") or []
    if not refs:
        return
    ids = {str(ref.get("id")) for ref in refs}
    stored = {
        str(pk): digest
        for pk, digest in Artifact.objects.filter(tenant=tenant, pk__in=ids).values_list(
            "pk", "sha256"
        )
    }
    for ref in refs:
        ref_id = str(ref.get("id"))
        if ref_id not in stored:
            raise ArtifactHashMismatch(f"Artifact {ref_id} does not exist in this tenant.")
        if stored[ref_id] != ref.get("sha256"):
            raise ArtifactHashMismatch(
                f"Artifact {ref_id} is stored with sha256 {stored[ref_id]}, "
                f"not {ref.get('sha256')}."
            )


def _derive_status(run: RunHead, state: str) -> str:
    definition = run.definition
    if state in definition.get("terminal", []):
        return RunStatus.SUCCEEDED
    if state in definition.get("approval_states", []):
        return RunStatus.WAITING_APPROVAL
    return RunStatus.RUNNING


def checkpoint_build(
    *,
    run: Run,
    checkpoint_id: UUID,
    sequence: int,
    parent: tuple[UUID | None, str],
    state: str,
    step: str,
    groups: dict[str, Any],
    pending_action: str | None = None,
    code_version: str = "",
) -> dict[str, Any]:
    """Assemble a full envelope from the writer's groups and the run's identity."""
    parent_id, parent_sha = parent
    # A usage counter the writer leaves out stays where the run has it (never back to 0).
    used = run.budget_used or {}
    budgets = {**{k: used.get(k, 0) for k in BUDGET_USED_KEYS}, **groups.get("budgets", {})}
    budgets.update(budget_limits_snapshot(run))
    evidence = {"artifacts": [], "validators": [], **groups.get("evidence", {})}
    return {
        "schema_version": env.SCHEMA_VERSION,
        "identity": {
            "run_id": str(run.id),
            "workflow_type": run.workflow_type,
            "workflow_version": run.workflow_version,
            "checkpoint_id": str(checkpoint_id),
            "parent_checkpoint_id": str(parent_id) if parent_id else None,
            "sequence": sequence,
            "parent_sha256": parent_sha,
        },
        "position": {
            "state": state,
            "step": step,
            "transition_version": run.workflow_version,
            "pending_action": pending_action,
        },
        "inputs": groups.get("inputs", {}),
        "evidence": evidence,
        "side_effects": groups.get("side_effects", []),
        "budgets": budgets,
        "control": groups.get("control", {}),
        "compatibility": {
            "envelope_schema_version": env.SCHEMA_VERSION,
            "workflow_code_version": code_version,
            "serializer_version": env.SERIALIZER_VERSION,
        },
    }


@dataclass(frozen=True)
class PreparedEnvelope:
    """An envelope validated, canonicalized and hashed exactly once."""

    envelope: dict[str, Any]
    canonical: bytes
    sha256: str


def envelope_prepare(envelope: dict[str, Any]) -> PreparedEnvelope:
    """Validate against the schema, then canonicalize and hash. Raises InvalidEnvelope."""
    try:
        env.validate(envelope)
    except env.EnvelopeInvalid as exc:
        raise InvalidEnvelope("The envelope breaks its schema.", fields=exc.fields)
    canonical = env.canonical_json(envelope)
    return PreparedEnvelope(envelope, canonical, hashlib.sha256(canonical).hexdigest())


def checkpoint_insert(
    *, run: Run, checkpoint_id: UUID, prepared: PreparedEnvelope, actor: Actor, is_evidence: bool
) -> Checkpoint:
    """Seal and insert one prepared checkpoint. Call inside the commit transaction."""
    envelope = prepared.envelope
    identity, position = envelope["identity"], envelope["position"]
    checkpoint = Checkpoint.objects.create(
        id=checkpoint_id,
        tenant_id=run.tenant_id,
        run=run,
        sequence=identity["sequence"],
        parent_id=identity["parent_checkpoint_id"],
        state=position["state"],
        step=position["step"],
        schema_version=envelope["schema_version"],
        envelope_sealed=canonical_seal(
            tenant_id=run.tenant_id, checkpoint_id=checkpoint_id, canonical=prepared.canonical
        ),
        key_id=crypto.keyring().active_id,
        sha256=prepared.sha256,
        parent_sha256=identity["parent_sha256"],
        actor=actor.name[:200],
        is_evidence=is_evidence,
    )
    # Envelopes are encrypted: retention learns which artifacts a checkpoint names from here.
    references_record(checkpoint=checkpoint, envelope=envelope)
    return checkpoint


@dataclass(frozen=True)
class WorkerLoop:
    """A worker that goes on with the run in its own loop (``runtime.executor``) commits
    with this, so that it needs no write of its own between steps:

    - the ``run.resume`` of a commit that leaves the run running (or at an approval) is
      written already claimed by the lease owner until its lease expires, instead of being
      published (a crash still leaves the sweep a command to publish);
    - ``consumed_outbox_id``, its previous such command, is marked sent in the same
      statement;
    - ``charge_next_attempt`` charges the attempt of the step it runs next to the run's
      usage (not to this checkpoint) and renews the lease, so that step needs no write
      before it runs;
    - the writer's lease is released in the same statement when the commit leaves the run
      anywhere but ``running`` or ``waiting_approval`` (its task ends there).
    """

    consumed_outbox_id: int | None = None
    charge_next_attempt: bool = False


@dataclass(frozen=True)
class StepAttempt:
    """One attempt of a step, as the checkpoint that ends it records it (step history,
    ``Checkpoint.attempt``). ``outcome``: ``committed`` (the step's result was accepted),
    ``retry`` or ``failed``. A failed attempt names its exception's type (no message: the
    message is free text, screened into the checkpoint's reason) and its traceback, stored
    as an encrypted artifact that the checkpoint's evidence names."""

    number: int
    step: str
    worker: str
    started_at: datetime
    duration_ms: int
    outcome: str
    error_type: str = ""
    traceback: dict[str, str] | None = None  # {"id", "sha256"} of the artifact
    # Each model call: model, provider, input/output tokens, cost, and its prompt and
    # response as encrypted artifacts ({"id", "sha256"}).
    model_calls: tuple[dict[str, Any], ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "step": self.step[:100],
            "worker": self.worker[:200],
            "started_at": self.started_at.isoformat(),
            "duration_ms": self.duration_ms,
            "outcome": self.outcome,
            "error_type": self.error_type[:200],
            "traceback": self.traceback,
            "model_calls": list(self.model_calls),
        }


@dataclass(frozen=True)
class CommitRequest:
    """One writer's commit of the run's next checkpoint, as ``checkpoint_commit`` takes it.

    ``envelope`` holds the writer's groups (inputs, evidence, side_effects, budgets,
    control); a group left out is carried forward from the parent checkpoint.
    ``operator_override`` is only for recorded operator actions (``run_retry``, which writes
    its audit event in the same transaction): the move may go to any state of the workflow,
    also backwards, and a failed run may be reopened. Everything else is checked as usual,
    the approval invariant included (``commit_rules``). ``worker``: see ``WorkerLoop``;
    ``attempt``: see ``StepAttempt``.
    """

    expected_version: int
    state: str
    envelope: dict[str, Any]
    actor: Actor
    step: str = ""
    status: str | None = None
    status_reason: str = ""
    lease_owner: str | None = None
    pending_action: str | None = None
    next_eligible_at: datetime | None = None
    code_version: str = ""
    is_evidence: bool = False
    operator_override: bool = False
    worker: WorkerLoop | None = None
    attempt: StepAttempt | None = None


@dataclass(frozen=True)
class CommitPlan:
    """A commit decided and sealed on one head: the statement's values, the full envelope,
    the approval it consumes (when it leaves an approval state under an approved request)
    and whether its command is published as soon as it commits."""

    write: commit_sql.CommitWrite
    envelope: dict[str, Any]
    approval_use: ApprovalUse | None
    dispatch_now: bool


@commit_traced  # a span around every commit, whoever writes it; the body is not touched
def checkpoint_commit(
    *, tenant: Tenant, run_id: UUID | str, request: CommitRequest, head: RunHead | None = None
) -> CommitResult:
    """Commit the run's next checkpoint. All or nothing: on PostgreSQL one statement (one
    round trip outside a transaction), on SQLite one transaction (``commit_sql``).

    ``head`` is the run as the caller last saw it (``CommitResult.head`` of its previous
    commit, or ``RunHead.of`` its restored run); without it the commit reads it (one more
    statement). A stale head costs a re-read, never a wrong write: the statement writes only
    when the run is still at that head, and only when the head is intact: the run's row
    links to the chain the new checkpoint links to and agrees with its head checkpoint's
    row (``commit_sql``). A tampered head is refused with IntegrityFailure, whoever writes.

    Reads: check the request → plan on the head → execute the one statement → after the
    commit (wake long-polls, dispatch, log). The returned head carries the lease as the
    statement left it, read back from the write.

    Raises NotFound, IntegrityFailure, RunNotActive, ConcurrentCheckpointWrite
    (expected_version is not the run's version), LeaseHeld (another owner holds an
    unexpired lease), IllegalTransition, InvalidEnvelope, SecretInEnvelope,
    PayloadTooLarge or ArtifactHashMismatch. When it raises, nothing was written.
    """
    request = _request_checked(request)
    started = time.monotonic()
    known = _head_of(head, tenant, run_id)
    # A head the caller kept may be stale; every refusal decided on it is decided again on
    # the run as it is now, so a stale writer gets the answer a fresh read would give.
    for attempt in range(3):
        fresh = known is None
        current = known or _head_checked(commit_sql.head_read(tenant_id=tenant.id, run_id=run_id))
        # Whether another writer's lease has expired is the statement's to decide, on the
        # database's clock; deciding early here uses this process's estimate of that clock,
        # and after a refusal the database's own time, so a writer whose clock is off gets
        # ``lease_held`` rather than a lost race.
        another = current.lease_owner not in ("", request.lease_owner)
        lease_now = clock.db_now() if attempt and another else clock.now()
        try:
            plan = _commit_plan(tenant, current, request, lease_now=lease_now)
        except CairnError:
            if fresh:
                raise
            known = None
            continue
        if plan.approval_use is None:
            committed = _commit_execute(plan)
        else:
            committed = _commit_consuming(plan, current, request.actor)
        if committed is not None:
            break
        # The run left this head (a racing writer, an operator, a charge): decide again on
        # the run as it is now. A writer that lost the race is refused there.
        known = None
    else:
        raise ConcurrentCheckpointWrite(
            f"The run moved past version {request.expected_version} while this checkpoint "
            "was being written; nothing was written."
        )
    write = plan.write
    if current.execution == Execution.EXTERNAL:
        changes.run_committed(run_id=current.id)  # its runner may be long-polling
    if plan.dispatch_now and settings.CAIRN_DISPATCH_ON_COMMIT:
        outbox_id = committed.outbox_id
        transaction.on_commit(lambda: outbox.outbox_dispatch(message_ids=[outbox_id]))
    commit_latency_record(seconds=time.monotonic() - started)
    log.info(
        "checkpoint committed",
        extra={
            "run": str(current.id),
            "tenant": tenant.slug,
            "sequence": write.sequence,
            "state": write.state,
            "step": write.step,
            "status": write.status,
        },
    )
    return CommitResult(
        checkpoint_id=write.checkpoint_id,
        sequence=write.sequence,
        sha256=write.sha256,
        parent_sha256=write.parent_sha256,
        run_version=current.version + 1,
        status=write.status,
        head=current.after(write, committed),
        envelope=plan.envelope,
        outbox_id=committed.outbox_id,
    )


def _request_checked(request: CommitRequest) -> CommitRequest:
    """The request's own checks, before any read: the groups' shape, the status a writer
    may set, and its free text screened (a person's refused, a process's redacted)."""
    _check_client_groups(request.envelope)
    if request.status is not None and request.status not in COMMIT_STATUSES:
        raise InvalidEnvelope(
            f"A commit cannot set the status '{request.status}'.",
            fields={"status": request.status},
        )
    if not (request.status_reason or request.code_version or request.lease_owner):
        return request
    screened = free_text_screen(
        {
            "status_reason": request.status_reason,
            "lease_owner": request.lease_owner,
            "code_version": request.code_version,
        },
        refuse=request.actor.user is not None,
    )
    return replace(request, status_reason=screened["status_reason"])


def checkpoint_commit_by_runner(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    expected_version: int,
    state: str,
    step: str,
    envelope: dict[str, Any],
    actor: Actor,
    status: str | None = None,
    status_reason: str = "",
    lease_owner: str | None = None,
    code_version: str = "",
    head: RunHead | None = None,
) -> CommitResult:
    """A runner's commit over HTTP (``POST /runs/{id}/checkpoints``): ``checkpoint_commit``,
    on the head it reads (one statement, which the commit then uses), or on ``head`` when
    the caller read it with the runner's token (``reads.runner_read``). A run Cairn's workers
    execute (``execution: worker``) takes checkpoints only from the holder of its lease,
    named as ``lease_owner``: anyone else is refused with LeaseHeld, so an API caller
    cannot write a worker run's history behind its worker's back. Raises what
    ``checkpoint_commit`` raises (IntegrityFailure for a tampered head, as for every
    writer); a refusal writes nothing."""
    known = _head_of(head, tenant, run_id)
    run = _head_checked(known or commit_sql.head_read(tenant_id=tenant.id, run_id=run_id))
    held = run.lease_held(clock.now())
    if run.execution == Execution.WORKER and not (
        lease_owner and run.lease_owner == lease_owner and held
    ):
        holder = (
            f"{run.lease_owner} holds its lease until {run.lease_expires_at:%Y-%m-%d %H:%M:%S} UTC"
            if held
            else "nobody holds its lease now"
        )
        raise LeaseHeld(
            f"Run {run.id} is executed by Cairn's workers (execution: worker) and {holder}: "
            "only the holder of its lease writes its checkpoints. Take the lease (POST "
            f"/runs/{run.id}/lease) and name it as lease_owner, or use the run's operator "
            "actions. Nothing was written.",
            fields={"lease_owner": "must hold the run's lease"},
        )
    request = CommitRequest(
        expected_version=expected_version,
        state=state,
        step=step,
        envelope=envelope,
        status=status,
        status_reason=status_reason,
        lease_owner=lease_owner,
        code_version=code_version,
        actor=actor,
    )
    return checkpoint_commit(head=run, tenant=tenant, run_id=run_id, request=request)


class _HeadMoved(Exception):
    pass


def _commit_consuming(plan: CommitPlan, head: RunHead, actor: Actor) -> commit_sql.Committed | None:
    """A commit that leaves an approval state: the approval is consumed in the commit's
    transaction, so it is used if and only if the run moves (a head that moved meanwhile
    rolls the consumption back with the write that did not happen)."""
    try:
        with transaction.atomic():
            commit_approval_consume(use=plan.approval_use, run=head, actor=actor)
            committed = _commit_execute(plan)
            if committed is None:
                raise _HeadMoved
            return committed
    except _HeadMoved:
        return None


def _head_of(head: RunHead | None, tenant: Tenant, run_id: UUID | str) -> RunHead | None:
    """``head`` when it is this tenant's run ``run_id``; None for anything else (the run is
    read): a head from elsewhere never decides a commit."""
    if head is None or head.tenant_id != tenant.id or str(head.id) != str(run_id):
        return None
    return head


def _head_checked(head: RunHead | None) -> RunHead:
    """The run's head as read. Raises NotFound when there is none, or IntegrityFailure when
    the run's row and its head checkpoint's row disagree: no checkpoint follows a tampered
    head."""
    if head is None:
        raise NotFound("No such run.")
    if head.integrity_problem:
        raise IntegrityFailure(
            f"Integrity failure: {head.integrity_problem}; no checkpoint can follow it. "
            "Nothing was written."
        )
    return head


def _commit_plan(
    tenant: Tenant, run: RunHead, request: CommitRequest, *, lease_now: datetime
) -> CommitPlan:
    """Check the commit against ``run`` and build, validate, hash and seal its envelope.
    Reads nothing unless the writer left a group out (the parent's is carried forward)."""
    expected_version, state, operator_override = (
        request.expected_version,
        request.state,
        request.operator_override,
    )
    reopens = operator_override and run.status == RunStatus.FAILED
    if (run.status not in ACTIVE_STATUSES or run.status == RunStatus.CANCELLING) and not reopens:
        raise RunNotActive(f"The run is {run.status}; it accepts no more checkpoints.")
    if run.version != expected_version:
        raise ConcurrentCheckpointWrite(
            f"The run is at version {run.version}, not {expected_version}: another writer "
            "committed first. Reload the run and decide again."
        )
    now = timezone.now()
    if run.lease_held(lease_now) and run.lease_owner != request.lease_owner:
        raise LeaseHeld(
            f"The run is leased by {run.lease_owner} until {run.lease_expires_at.isoformat()}."
        )
    if state not in run.definition["states"] or (
        not operator_override and not transition_ok(run, state)
    ):
        raise IllegalTransition(
            f"Workflow {run.workflow_type} does not allow {run.state} → {state}."
        )
    groups = dict(request.envelope)
    missing = [g for g in env.CLIENT_GROUPS if g not in groups]
    parent_envelope = latest_envelope(run) if missing else None
    for group in missing:
        groups[group] = parent_envelope.get(group, {} if group != "side_effects" else [])
    if request.envelope.get("side_effects"):
        _check_side_effects(run, request.envelope["side_effects"], parent_envelope)
    sequence = run.checkpoint_sequence + 1
    checkpoint_id = uuid.uuid4()
    full = checkpoint_build(
        run=run,
        checkpoint_id=checkpoint_id,
        sequence=sequence,
        parent=(run.latest_checkpoint_id, run.latest_checkpoint_sha256),
        state=state,
        step=request.step,
        groups=groups,
        pending_action=request.pending_action,
        code_version=request.code_version,
    )
    prepared = envelope_prepare(full)
    _check_budget_monotonic(run, full["budgets"])
    _check_artifacts(tenant, full["evidence"])
    new_status = request.status or _derive_status(run, state)
    # The protocol, one rule set for every writer (commit_rules): it reads nothing more,
    # except the run's approval requests on a commit that leaves an approval state.
    approval_use = commit_rules_check(
        run=run,
        definition=run.definition,
        state=state,
        status=new_status,
        budgets=full["budgets"],
        evidence=full["evidence"],
        control=full["control"],
        operator_override=operator_override,
    )
    # A move out of an approval state (past it, back, or to an end) is transition evidence:
    # retention keeps it, so verify can always hold the chain to the approval it consumed.
    leaves_approval = state != run.state and run.state in run.definition.get("approval_states", ())
    used = {k: full["budgets"][k] for k in BUDGET_USED_KEYS}
    lease_seconds = None  # renewed by the statement, on the database's clock
    worker = request.worker
    if worker and worker.charge_next_attempt and new_status == RunStatus.RUNNING:
        used = {**used, "attempts_used": used["attempts_used"] + 1}
    if request.lease_owner and run.lease_owner == request.lease_owner:
        lease_seconds = settings.CAIRN_LEASE_SECONDS
    # The outbox message: a worker run's next command, or an event about an external run.
    kind = "run.resume" if run.execution == Execution.WORKER else "run.checkpointed"
    claim_seconds = sent_at = None
    dispatch_now = False
    stays = new_status in (RunStatus.RUNNING, RunStatus.WAITING_APPROVAL)
    if kind not in outbox.TASK_FOR_KIND or new_status in TERMINAL_STATUSES:
        sent_at = now  # nothing consumes it (a run.resume of an ended run is a no-op)
    elif worker and stays:
        # The caller executes it itself; until its lease would expire nobody publishes it.
        claim_seconds = settings.CAIRN_LEASE_SECONDS
    else:
        available = request.next_eligible_at
        dispatch_now = available is None or available <= now
    identity = full["identity"]
    write = commit_sql.CommitWrite(
        head=run,
        checkpoint_id=checkpoint_id,
        sequence=sequence,
        parent_id=identity["parent_checkpoint_id"],
        state=state,
        step=request.step,
        status=new_status,
        status_reason=request.status_reason,
        next_eligible_at=request.next_eligible_at,
        budget_used=used,
        lease_owner=request.lease_owner,
        lease_seconds=lease_seconds,
        lease_release=bool(worker and request.lease_owner and not stays),
        schema_version=full["schema_version"],
        envelope_sealed=canonical_seal(
            tenant_id=run.tenant_id, checkpoint_id=checkpoint_id, canonical=prepared.canonical
        ),
        key_id=crypto.keyring().active_id,
        sha256=prepared.sha256,
        parent_sha256=identity["parent_sha256"],
        actor=request.actor.name[:200],
        is_evidence=request.is_evidence or leaves_approval,
        outbox_kind=kind,
        outbox_payload={"run_id": str(run.id), "expected_version": expected_version + 1},
        outbox_available_at=request.next_eligible_at,
        outbox_claim_seconds=claim_seconds,
        outbox_sent_at=sent_at,
        consumed_outbox_id=worker.consumed_outbox_id if worker else None,
        attempt=request.attempt.as_json() if request.attempt else None,
        now=now,
    )
    return CommitPlan(
        write=write, envelope=full, approval_use=approval_use, dispatch_now=dispatch_now
    )


def _check_side_effects(
    run: RunHead, entries: list[Any], parent_envelope: dict[str, Any] | None
) -> None:
    """A writer's ``side_effects`` speak of the run's own operations: each entry names a key
    this run reserved (not a key never reserved, nor another run's or tenant's), and says
    ``confirmed`` only with the provider id the operation was confirmed with. An entry the
    parent checkpoint already carried (a fork inherits its source's entries) stays as it
    was. Reads one statement (and the parent's envelope for an entry with no row here).
    Raises InvalidEnvelope (422) naming each entry that does not hold."""
    keys = {e.get("idempotency_key") for e in entries if isinstance(e, dict)}
    rows = {
        key: (status, provider_id)
        for key, status, provider_id in ExternalOperation.objects.filter(
            tenant_id=run.tenant_id, run_id=run.id, idempotency_key__in=keys
        ).values_list("idempotency_key", "status", "provider_operation_id")
    }
    problems: dict[str, str] = {}
    inherited: list[Any] | None = None
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue  # the schema names it
        where = f"side_effects.{index}"
        row = rows.get(entry.get("idempotency_key"))
        if row is None:
            if inherited is None:
                parent = parent_envelope if parent_envelope is not None else latest_envelope(run)
                inherited = parent.get("side_effects") or []
            if entry not in inherited:
                problems[where] = "names an idempotency key this run never reserved"
            continue
        status, provider_id = row
        if entry.get("status") == OperationStatus.CONFIRMED and (
            not entry.get("provider_operation_id")
            or status != OperationStatus.CONFIRMED
            or entry.get("provider_operation_id") != provider_id
        ):
            problems[where] = "says confirmed, but the operation is " + (
                f"confirmed as {provider_id}" if status == OperationStatus.CONFIRMED else status
            )
    if problems:
        raise InvalidEnvelope(
            "The side effects must be the run's own operations as they stand (reserve a key "
            "with POST /runs/{id}/operations, confirm it with …/confirm).",
            fields=problems,
        )


def _commit_execute(plan: CommitPlan) -> commit_sql.Committed | None:
    """The write; with evidence artifacts also the reference index, in one transaction.
    Returns what the statement wrote, or None when the run left the head (nothing written)."""
    write = plan.write
    if not artifact_ids_of(plan.envelope, write.attempt):
        return commit_sql.commit_write(write)
    with transaction.atomic():
        committed = commit_sql.commit_write(write)
        if committed is not None:
            # Envelopes are encrypted: retention learns which artifacts a checkpoint names here.
            references_record(
                checkpoint=Checkpoint(id=write.checkpoint_id, tenant_id=write.head.tenant_id),
                envelope=plan.envelope,
                attempt=write.attempt,
            )
    return committed


def transition_ok(run: Run | RunHead, state: str) -> bool:
    definition = run.definition if isinstance(run, RunHead) else run.workflow.definition
    if state not in definition["states"]:
        return False
    return transition_allowed(definition, run.state, state)


def _check_budget_monotonic(run: Run, budgets: dict[str, Any]) -> None:
    lowered = {
        key: f"may not decrease (the run has used {run.budget_used.get(key, 0)})"
        for key in BUDGET_USED_KEYS
        if isinstance(budgets.get(key), int | float) and budgets[key] < run.budget_used.get(key, 0)
    }
    if lowered:
        raise InvalidEnvelope(
            "Budget usage can only grow; only an operator grant adds budget.",
            fields={f"budgets.{k}": v for k, v in lowered.items()},
        )
