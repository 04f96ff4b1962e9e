"""Starting runs: a run is born with its genesis checkpoint in one transaction."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from cairn.errors import InvalidRequest, PayloadTooLarge, SecretInEnvelope, UnknownWorkflow
from checkpoints.envelope import canonical_json, find_secret
from checkpoints.models import Execution, Run, RunStatus, WorkflowDefinition
from checkpoints.services import outbox
from checkpoints.services.budgets import BUDGET_LIMIT_MAX
from checkpoints.services.checkpoints import checkpoint_build, checkpoint_insert, envelope_prepare
from checkpoints.services.workflows import workflow_resolve
from runtime.registry import workflow_ensure_registered
from telemetry.logs import transition_log
from telemetry.tracing import run_trace_start
from tenants.models import Tenant
from tenants.services import Actor

BUDGET_KEYS = ("max_attempts", "max_tokens", "max_cost", "deadline")


def budget_normalize(raw: dict[str, Any] | None) -> dict[str, Any]:
    """Validated budget limits; absent ones are unlimited (None)."""
    raw = raw or {}
    unknown = set(raw) - set(BUDGET_KEYS)
    if unknown:
        raise InvalidRequest(
            "Unknown budget fields.", fields={k: "not a budget field" for k in sorted(unknown)}
        )
    limits: dict[str, Any] = {key: raw.get(key) for key in BUDGET_KEYS}
    problems = {}
    for key in ("max_attempts", "max_tokens"):
        value = limits[key]
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            problems[key] = "a whole number of at least 1"
        elif value is not None and value > BUDGET_LIMIT_MAX:
            problems[key] = f"at most {BUDGET_LIMIT_MAX}"
    cost = limits["max_cost"]
    if cost is not None and (
        not isinstance(cost, int | float) or isinstance(cost, bool) or not 0 <= cost
    ):
        problems["max_cost"] = "a number of at least 0"
    elif cost is not None and not cost <= BUDGET_LIMIT_MAX:
        problems["max_cost"] = f"at most {BUDGET_LIMIT_MAX}"
    deadline = limits["deadline"]
    if deadline is not None:
        if isinstance(deadline, datetime):
            limits["deadline"] = deadline.isoformat()
        elif not isinstance(deadline, str):
            problems["deadline"] = "an RFC 3339 timestamp"
        else:
            try:
                parsed = datetime.fromisoformat(deadline.replace("Z", "+00:00"))
                if parsed.tzinfo is None:
                    raise ValueError
                limits["deadline"] = parsed.isoformat()
            except ValueError:
                problems["deadline"] = "an RFC 3339 timestamp with a time zone"
    if problems:
        raise InvalidRequest(
            "The budget is not valid.", fields={f"budget.{k}": v for k, v in problems.items()}
        )
    return limits


def budget_with_defaults(budget: dict[str, Any] | None) -> dict[str, Any]:
    """The budget a run created over the API or the console starts with: without
    ``max_attempts`` it gets CAIRN_DEFAULT_MAX_ATTEMPTS, so a failing step cannot retry
    without end. An explicit ``"max_attempts": null`` keeps attempts unlimited."""
    from django.conf import settings

    budget = dict(budget or {})
    budget.setdefault("max_attempts", settings.CAIRN_DEFAULT_MAX_ATTEMPTS)
    return budget


def _workflow_for_run(
    *, tenant: Tenant, workflow_type: str, version: str | None
) -> WorkflowDefinition:
    """The stored definition; a workflow declared in Python but not synced yet is stored on
    first use (the store knows definitions, the engine knows which code declares them)."""
    try:
        return workflow_resolve(tenant=tenant, workflow_type=workflow_type, version=version)
    except UnknownWorkflow:
        if not workflow_ensure_registered(workflow_type, version):
            raise
    return workflow_resolve(tenant=tenant, workflow_type=workflow_type, version=version)


def run_create(
    *,
    tenant: Tenant,
    workflow_type: str,
    workflow_version: str | None = None,
    inputs: dict[str, Any] | None = None,
    objective_ref: str = "",
    budget: dict[str, Any] | None = None,
    execution: str | None = None,
    actor: Actor,
) -> Run:
    """Create a run in its workflow's initial state with checkpoint 1 (its inputs).

    Atomic: the run, its genesis checkpoint and (for worker runs) the first ``run.resume``
    command are written together. Raises UnknownWorkflow, InvalidRequest, SecretInEnvelope
    or PayloadTooLarge.
    """
    workflow = _workflow_for_run(
        tenant=tenant, workflow_type=workflow_type, version=workflow_version
    )
    if execution is None:
        execution = Execution.WORKER if workflow.has_code else Execution.EXTERNAL
    if execution not in Execution.values:
        raise InvalidRequest(
            "execution must be 'worker' or 'external'.", fields={"execution": execution}
        )
    if execution == Execution.WORKER and not workflow.has_code:
        raise InvalidRequest(
            f"Workflow {workflow} has no Python steps, so Cairn workers cannot run it; "
            "use execution 'external'."
        )
    limits = budget_normalize(budget)
    inputs_group = {"objective_ref": objective_ref or None, "values": inputs or {}}
    found = find_secret(inputs_group, "inputs")
    if found:
        raise SecretInEnvelope(
            f"{found[0]} looks like a credential ({found[1]}); pass a reference such as env:NAME.",
            fields={found[0]: found[1]},
        )
    from django.conf import settings

    if len(canonical_json(inputs_group)) > settings.CAIRN_MAX_ENVELOPE_BYTES:
        raise PayloadTooLarge(
            "The inputs are larger than the envelope limit; store them as an artifact."
        )
    definition = workflow.definition
    initial = definition["initial"]
    with transaction.atomic():
        run = Run(
            tenant=tenant,
            workflow=workflow,
            workflow_type=workflow.workflow_type,
            workflow_version=workflow.version,
            execution=execution,
            objective_ref=objective_ref[:500],
            state=initial,
            step="",
            status=RunStatus.RUNNING,
            version=1,
            checkpoint_sequence=1,
            budget_limits=limits,
            budget_used={},
        )
        genesis(run=run, inputs_group=inputs_group, actor=actor)
        if execution == Execution.WORKER:
            outbox.outbox_enqueue(
                run=run, kind="run.resume", payload={"run_id": str(run.id), "expected_version": 1}
            )
    return run


def genesis(
    *,
    run: Run,
    inputs_group: dict[str, Any],
    actor: Actor,
    groups: dict[str, Any] | None = None,
    parent: tuple[uuid.UUID | None, str] = (None, ""),
) -> None:
    """Insert a new run (built, not yet saved) with its checkpoint 1, the run already
    pointing at it (inside the caller's transaction): two inserts. A fork passes the source
    checkpoint as ``parent`` and its groups."""
    checkpoint_id = uuid.uuid4()
    envelope = checkpoint_build(
        run=run,
        checkpoint_id=checkpoint_id,
        sequence=1,
        parent=parent,
        state=run.state,
        step=run.step,
        groups={**(groups or {}), "inputs": inputs_group},
    )
    prepared = envelope_prepare(envelope)
    run.latest_checkpoint_id = checkpoint_id
    run.latest_checkpoint_sha256 = prepared.sha256
    run.latest_checkpoint_at = timezone.now()  # the checkpoint's, written just after
    run.budget_used = {
        k: envelope["budgets"][k]
        for k in ("attempts_used", "tokens_used", "cost_used", "elapsed_seconds")
    }
    # Kept for the run's whole life: its commands carry it to every worker (the outbox).
    run.trace_context = run_trace_start(
        run_id=run.id,
        tenant=run.tenant.slug,
        workflow_type=run.workflow_type,
        workflow_version=run.workflow_version,
    )
    run.save(force_insert=True)
    checkpoint_insert(
        run=run, checkpoint_id=checkpoint_id, prepared=prepared, actor=actor, is_evidence=True
    )
    transition_log(
        event="run started",
        run_id=run.id,
        tenant=run.tenant.slug,
        sequence=1,
        state=run.state,
        step=run.step,
        status=run.status,
    )
