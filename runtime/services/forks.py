"""Forking: a new run that starts from an older checkpoint of another run.

The new run's genesis checkpoint names the chosen checkpoint as its parent (id and sha256),
so the fork's history chains onto the source's. The source run is not touched: not its
version, not its history. A fork from before a confirmed side effect may make that effect
happen again (the fork's steps run with new idempotency keys), so ``run_fork_preview`` says
which ones before the fork is made, and ``run_fork`` returns the same warnings.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction

from cairn.errors import (
    ActionNotAllowed,
    IntegrityFailure,
    InvalidRequest,
    PayloadTooLarge,
    SecretInEnvelope,
    UnknownCheckpoint,
)
from checkpoints import envelope as env
from checkpoints.models import (
    Checkpoint,
    Execution,
    ExternalOperation,
    OperationStatus,
    Run,
    RunStatus,
)
from checkpoints.services import outbox
from checkpoints.services.checkpoints import BUDGET_USED_KEYS
from checkpoints.services.integrity import checkpoint_position_verify
from checkpoints.services.reads import checkpoint_envelope, run_get
from checkpoints.services.workflows import gated_states, states_behind
from runtime.input_reads import inputs_read
from runtime.services.actions import reason_clean, run_reload, version_check
from runtime.services.runs import genesis
from tenants.models import Tenant
from tenants.services import Actor, audit_record


@dataclass(frozen=True)
class ForkResult:
    run: Run
    warnings: list[dict[str, Any]] = field(default_factory=list)
    # Changed input names no step of the workflow reads (see ``ForkPreview.unread``).
    unread_inputs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class InputChange:
    """One input value a fork changes: ``before`` is None when ``added``, ``after`` is None
    when ``removed``."""

    key: str
    before: Any
    after: Any
    added: bool = False
    removed: bool = False


@dataclass(frozen=True)
class ForkPreview:
    """What a fork would be: the effects it may repeat (``warnings``), each input value it
    changes, and the changed names no step reads. ``reads_known`` is False when Cairn cannot
    tell from the workflow's code which inputs its steps read (an external driver's
    workflow, or code that uses the inputs other than by name): ``unread`` is then empty."""

    warnings: list[dict[str, Any]]
    changes: list[InputChange]
    unread: list[str]
    reads_known: bool


def merge_patch(target: Any, patch: Any) -> Any:
    """JSON Merge Patch (RFC 7396): objects merge recursively, null removes a member,
    anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _checkpoint_at(run: Run, sequence: int) -> Checkpoint:
    checkpoint = Checkpoint.objects.filter(run=run, sequence=sequence).first()
    if checkpoint is None:
        raise UnknownCheckpoint(
            f"The run has no checkpoint {sequence}; its checkpoints are 1 to "
            f"{run.checkpoint_sequence}.",
            fields={"from_sequence": "no such checkpoint"},
        )
    return checkpoint


def _envelope_of(checkpoint: Checkpoint) -> dict[str, Any]:
    try:
        return env.migrate(checkpoint_envelope(checkpoint))
    except (env.NoMigration, env.EnvelopeTooNew) as exc:
        raise IntegrityFailure(f"Checkpoint {checkpoint.sequence} cannot be read: {exc}.")


def _warnings(run: Run, envelope: dict[str, Any], sequence: int) -> list[dict[str, Any]]:
    """Operations of the source run that are confirmed (or may have happened) now but were
    not recorded as confirmed in the chosen checkpoint: the fork may perform them again.

    Judged by the checkpoint's own side-effect record, not by time, so an effect whose
    confirmation came after the checkpoint is reported even if it was reserved before.
    """
    confirmed_then = {
        entry.get("idempotency_key")
        for entry in envelope.get("side_effects") or []
        if entry.get("status") == OperationStatus.CONFIRMED
    }
    operations = (
        ExternalOperation.objects.filter(
            run=run, status__in=(OperationStatus.CONFIRMED, OperationStatus.UNKNOWN)
        )
        .exclude(idempotency_key__in=confirmed_then)
        .order_by("created_at", "id")
    )
    warnings = []
    for op in operations:
        if op.status == OperationStatus.CONFIRMED:
            sentence = (
                f"{op.action} on {op.target} was confirmed after checkpoint {sequence} "
                f"(key {op.idempotency_key}); the fork may perform it again."
            )
        else:
            sentence = (
                f"{op.action} on {op.target} has an unknown outcome (key "
                f"{op.idempotency_key}); it may have happened, and the fork may perform it "
                "again."
            )
        warnings.append(
            {
                "idempotency_key": op.idempotency_key,
                "action": op.action,
                "target": op.target,
                "status": op.status,
                "provider_operation_id": op.provider_operation_id or None,
                "detail": sentence,
            }
        )
    return warnings


@dataclass(frozen=True)
class _ForkPlan:
    checkpoint: Checkpoint
    envelope: dict[str, Any]
    inputs: dict[str, Any]
    warnings: list[dict[str, Any]]
    changes: list[InputChange]


def fork_gate_refusal(source: Run, state: str) -> str:
    """Why a fork may not start at ``state`` because of an approval, or "". A fork is a new
    run: an approval the source run used (consumed once, for the source's version) is not
    its approval, so it may not start past an approval state; from the approval state or
    earlier it asks for its own."""
    gates = [
        g for g, stretch in states_behind(source.workflow.definition).items() if state in stretch
    ]
    if not gates:
        return ""
    return (
        f"is at state {state}, past the approval state {', '.join(gates) or 'of the workflow'}: "
        "a fork is a new run and the source's approval does not carry over, so it would "
        "continue without one. Fork from the approval state or earlier; the fork then asks "
        "for its own approval."
    )


def forkable_sequences(run: Run, rows: list[tuple[int, str]]) -> list[int]:
    """Of ``(sequence, state)`` rows, the sequences a fork may start from (not a terminal
    state, not past an approval state)."""
    definition = run.workflow.definition
    terminal = set(definition.get("terminal") or ())
    gated = gated_states(definition)
    return [seq for seq, state in rows if state not in terminal and state not in gated]


def _fork_plan(source: Run, from_sequence: int, inputs_patch: dict[str, Any] | None) -> _ForkPlan:
    """What a fork from ``from_sequence`` starts from, or why it cannot be made."""
    if inputs_patch is not None and not isinstance(inputs_patch, dict):
        raise InvalidRequest(
            "inputs_patch must be a JSON object (a JSON Merge Patch of the inputs).",
            fields={"inputs_patch": "an object"},
        )
    checkpoint = _checkpoint_at(source, from_sequence)
    envelope = _envelope_of(checkpoint)
    # The fork starts at the checkpoint's row position: it must be the sealed one.
    checkpoint_position_verify(checkpoint, envelope)
    if checkpoint.state in source.workflow.definition.get("terminal", []):
        raise ActionNotAllowed(
            f"Checkpoint {from_sequence} is in the terminal state {checkpoint.state}; a "
            "fork from it would have nothing to do. Choose an earlier checkpoint."
        )
    gate = fork_gate_refusal(source, checkpoint.state)
    if gate:
        raise ActionNotAllowed(f"Checkpoint {from_sequence} {gate}")
    before = (envelope.get("inputs") or {}).get("values") or {}
    inputs = _fork_inputs(envelope, inputs_patch, from_sequence)
    return _ForkPlan(
        checkpoint,
        envelope,
        inputs,
        _warnings(source, envelope, from_sequence),
        input_changes(before, inputs.get("values") or {}),
    )


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON. Not ``canonical_json``: that refuses what a poisoned checkpoint holds
    (an integer beyond 2^53), and a fork is how such a value is replaced."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def input_changes(before: dict[str, Any], after: dict[str, Any]) -> list[InputChange]:
    """Each input value that differs between ``before`` and ``after``, by name."""
    changes = []
    for key in sorted(set(before) | set(after)):
        if key not in after:
            changes.append(InputChange(key, before[key], None, removed=True))
        elif key not in before:
            changes.append(InputChange(key, None, after[key], added=True))
        elif not _same(before[key], after[key]):
            changes.append(InputChange(key, before[key], after[key]))
    return changes


def inputs_patch_between(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The JSON Merge Patch that turns the input values ``before`` into ``after`` (what the
    console's editor sends: the operator edits the values, the fork takes a patch)."""
    return {
        c.key: None if c.removed else copy.deepcopy(c.after) for c in input_changes(before, after)
    }


def unread_inputs(run: Run, changes: list[InputChange]) -> tuple[list[str], bool]:
    """The changed input names no step of the run's workflow reads, and whether that could
    be told at all (``runtime.input_reads``)."""
    read = inputs_read(run.workflow_type, run.workflow_version)
    if read is None:
        return [], False
    return [c.key for c in changes if not c.removed and c.key not in read], True


def fork_input_values(*, tenant: Tenant, run_id: UUID | str, from_sequence: int) -> dict[str, Any]:
    """The input values (``inputs.values``, what a step reads as ``ctx.inputs``) recorded
    in checkpoint ``from_sequence``: what a fork from it starts with. Reads only; raises
    NotFound, UnknownCheckpoint or IntegrityFailure."""
    run = run_get(tenant=tenant, run_id=run_id)
    envelope = _envelope_of(_checkpoint_at(run, from_sequence))
    return copy.deepcopy((envelope.get("inputs") or {}).get("values") or {})


def run_fork_review(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    from_sequence: int,
    inputs_patch: dict[str, Any] | None = None,
) -> ForkPreview:
    """What a fork from ``from_sequence`` with ``inputs_patch`` would be (``ForkPreview``),
    after the same checks as ``run_fork``, so a preview never promises a fork that would be
    refused. Reads only; raises what ``run_fork_preview`` raises."""
    run = run_get(tenant=tenant, run_id=run_id)
    plan = _fork_plan(run, from_sequence, inputs_patch)
    unread, known = unread_inputs(run, plan.changes)
    return ForkPreview(plan.warnings, plan.changes, unread, known)


def run_fork_preview(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    from_sequence: int,
    inputs_patch: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """What a fork from ``from_sequence`` would repeat: the warnings ``run_fork`` returns,
    after the same checks, so a preview never promises a fork that would be refused.

    Reads only. Raises NotFound, UnknownCheckpoint, IntegrityFailure, InvalidRequest,
    ActionNotAllowed (a checkpoint in a terminal state), SecretInEnvelope or
    PayloadTooLarge, as ``run_fork`` would.
    """
    run = run_get(tenant=tenant, run_id=run_id)
    return _fork_plan(run, from_sequence, inputs_patch).warnings


def _fork_inputs(
    envelope: dict[str, Any], inputs_patch: dict[str, Any] | None, sequence: int
) -> dict[str, Any]:
    """The checkpoint's inputs group with the patch applied to its ``values`` (the inputs a
    run was started with).

    The patch is of the values themselves. One shaped like the whole inputs group, as the
    checkpoint page shows it (``{"values": {...}}``), would add an input named "values" that
    no step reads and change nothing else: it is refused, unless the run has an input named
    "values". A non-empty patch that changes nothing is refused too: the fork would redo the
    same work (and ask a reviewer to approve the same draft again) while the operator
    believes something changed. No patch (or ``{}``) forks with the same inputs on purpose.
    """
    inputs = dict(envelope.get("inputs") or {})
    values = inputs.get("values") or {}
    if inputs_patch:
        wrapped = inputs_patch.get("values")
        if isinstance(wrapped, dict) and "values" not in values:
            raise InvalidRequest(
                "inputs_patch is a patch of the input values themselves, not of the inputs "
                'group: write {"lang": "de"}, not {"values": {"lang": "de"}} (the run has no '
                'input named "values").',
                fields={"inputs_patch": "a patch of the input values, without a values wrapper"},
            )
        inputs["values"] = merge_patch(values, inputs_patch)
        if _same(inputs["values"], values):
            raise InvalidRequest(
                f"The patch changes nothing: every input it names already has that value at "
                f"checkpoint {sequence}. Change a value, or send no patch to fork with the "
                "same inputs on purpose.",
                fields={"inputs_patch": "changes nothing"},
            )
    found = env.find_secret(inputs, "inputs")
    if found:
        raise SecretInEnvelope(
            f"{found[0]} looks like a credential ({found[1]}); pass a reference such as env:NAME.",
            fields={found[0]: found[1]},
        )
    if len(env.canonical_json(inputs)) > settings.CAIRN_MAX_ENVELOPE_BYTES:
        raise PayloadTooLarge("The patched inputs are larger than the envelope limit.")
    return inputs


def run_fork(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    from_sequence: int,
    reason: str,
    inputs_patch: dict[str, Any] | None = None,
    expected_version: int | None = None,
    actor: Actor,
) -> ForkResult:
    """Start a new run from checkpoint ``from_sequence`` of another run.

    The new run copies that checkpoint's position, evidence, side-effect record and budget
    usage, the source run's current limits, and its inputs with ``inputs_patch`` applied
    (JSON Merge Patch on the input values). Its genesis checkpoint's parent is the chosen
    checkpoint; ``forked_from_run`` and ``forked_from_checkpoint`` are set. One transaction:
    the new run, its genesis checkpoint, its first ``run.resume`` (worker runs) and the audit
    events on both runs. The source run is not modified; ``expected_version`` (optional) only
    makes sure the caller decided on what the source looks like now.

    A fork never starts past an approval state (``fork_gate_refusal``): the source's
    approval was bound to the source's version and used once.

    Raises NotFound, InvalidRequest, ConcurrentCheckpointWrite, UnknownCheckpoint,
    IntegrityFailure (the checkpoint's row is not its sealed envelope), ActionNotAllowed (a
    checkpoint in a terminal state or past an approval state), SecretInEnvelope or
    PayloadTooLarge.
    """
    reason = reason_clean(reason)
    with transaction.atomic():
        source = run_get(tenant=tenant, run_id=run_id)
        version_check(source, expected_version)
        plan = _fork_plan(source, from_sequence, inputs_patch)
        checkpoint, envelope, warnings = plan.checkpoint, plan.envelope, plan.warnings
        unread, _ = unread_inputs(source, plan.changes)
        run = Run(
            tenant=tenant,
            workflow=source.workflow,
            workflow_type=source.workflow_type,
            workflow_version=source.workflow_version,
            execution=source.execution,
            objective_ref=source.objective_ref,
            state=checkpoint.state,
            step=checkpoint.step,
            # From an approval state the fork waits for its own approval (the worker's gate
            # raises the request), like a run that committed into that state.
            status=RunStatus.WAITING_APPROVAL
            if checkpoint.state in (source.workflow.definition.get("approval_states") or ())
            else RunStatus.RUNNING,
            status_reason=f"forked by {actor.name} from run {source.id} checkpoint "
            f"{from_sequence}: {reason}",
            version=1,
            checkpoint_sequence=1,
            budget_limits=dict(source.budget_limits),
            budget_used={},
            forked_from_run=source,
            forked_from_checkpoint=checkpoint,
        )
        budgets = envelope.get("budgets") or {}
        genesis(
            run=run,
            inputs_group=plan.inputs,
            actor=actor,
            groups={
                "evidence": envelope.get("evidence") or {},
                "side_effects": envelope.get("side_effects") or [],
                "budgets": {k: budgets[k] for k in BUDGET_USED_KEYS if k in budgets},
                "control": {"actor": actor.name, "reason": reason, "action": "fork"},
            },
            parent=(checkpoint.id, checkpoint.sha256),
        )
        if run.execution == Execution.WORKER:
            outbox.outbox_enqueue(
                run=run, kind="run.resume", payload={"run_id": str(run.id), "expected_version": 1}
            )
        details = {
            "source_run": str(source.id),
            "from_sequence": from_sequence,
            "from_checkpoint_sha256": checkpoint.sha256,
            "fork_run": str(run.id),
            # Key names only: input values are sealed in the envelope, the audit log is not.
            "inputs_patched": sorted(inputs_patch or {}),
            "inputs_unread": unread,
            "may_repeat": [w["idempotency_key"] for w in warnings],
        }
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.fork",
            run_id=run.id,
            target=f"from run {source.id} checkpoint {from_sequence}",
            reason=reason,
            details=details,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.forked",
            run_id=source.id,
            target=f"into run {run.id}",
            reason=reason,
            details=details,
        )
    return ForkResult(run=run_reload(run), warnings=warnings, unread_inputs=unread)
