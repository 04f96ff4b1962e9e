"""The protocol every writer's commit is held to, checked against the run's stored workflow
definition: one rule set for Cairn's own workers and for runners in any language.

``commit_rules_check`` is called by ``checkpoint_commit`` after the run is read and the
envelope is built, before anything is written. It reads nothing the commit has not read
already, except the run's approval requests when (and only when) the commit leaves an
approval state, and writes nothing. A refusal raises, and nothing is written. When the
commit leaves under an approved request, ``commit_approval_consume`` consumes it inside
the commit's transaction, so it is used if and only if the run moves. Both approval steps
are the approvals app's, asked through the store's approvals port
(``checkpoints.approvals_port``): approvals sit above the store.

The rules, in order:

1. A status that ends the run well (``succeeded``) only at a terminal state, and a commit
   into a terminal state ends the run (``succeeded`` or ``failed``). (422
   ``illegal_transition``.)
2. Usage over a limit is refused (409 ``budget_exhausted``): attempts, tokens or cost
   above what the run's limits allow, including every operator grant (``grant_budget``
   raises the limits, so granted budget is allowed). A commit that fails the run may
   record the usage that exhausted it.
3. Leaving an approval state needs a valid approval: a request bound to the run's current
   version for an artifact the committed evidence still names, approved and unexpired. It
   is consumed here, once (409 ``approval_required``, ``approval_expired``,
   ``approval_stale``, ``artifact_hash_mismatch``, ``approval_closed``). An approval the
   worker's gate consumed for this same version counts (the same one use). A commit that
   fails the run may leave without one (nothing runs after it; a rejection leaves so).

Recorded operator actions (``operator_override``: retry) are exempt from rule 3: the
operator's action is the decision. So is the LangGraph store's resume of an interrupted
thread (``checkpoint_commit(answers_interrupt=True)``): the application's
``Command(resume=…)`` carries the person's answer.
"""

from __future__ import annotations

from typing import Any, Protocol
from uuid import UUID

from cairn.errors import BudgetExhausted, IllegalTransition
from checkpoints.approvals_port import ApprovalUse, approvals_port
from checkpoints.models import RunStatus
from checkpoints.services.budgets import LIMIT_FOR_USED
from tenants.services import Actor


class RunFacts(Protocol):
    """What the rules read of the run, as the commit read it (a Run or the commit's head)."""

    id: UUID
    tenant_id: UUID
    state: str
    version: int
    workflow_type: str
    budget_limits: dict[str, Any]


def _check_status(
    run: RunFacts, definition: dict[str, Any], state: str, status: str, override: bool
) -> None:
    terminal = state in definition.get("terminal", [])
    if status == RunStatus.SUCCEEDED and not terminal:
        raise IllegalTransition(
            f"A run succeeds only at a terminal state of workflow {run.workflow_type} "
            f"({', '.join(definition.get('terminal', [])) or 'none declared'}); "
            f"'{state}' is not one.",
            fields={"status": status, "state": state},
        )
    if terminal and status not in (RunStatus.SUCCEEDED, RunStatus.FAILED):
        raise IllegalTransition(
            f"'{state}' is a terminal state: a commit into it ends the run (succeeded or "
            f"failed), not '{status}'.",
            fields={"status": status, "state": state},
        )


def _check_budgets(run: RunFacts, budgets: dict[str, Any], status: str) -> None:
    if status == RunStatus.FAILED:
        return  # the commit that ends the run records what exhausted it
    limits = run.budget_limits or {}
    over = {
        used_key: (budgets.get(used_key), limits[limit_key])
        for used_key, limit_key in LIMIT_FOR_USED.items()
        if limits.get(limit_key) is not None
        and isinstance(budgets.get(used_key), int | float)
        and budgets[used_key] > limits[limit_key]
    }
    if over:
        named = "; ".join(
            f"{key.removesuffix('_used')} used {used} of {limit}"
            for key, (used, limit) in over.items()
        )
        raise BudgetExhausted(
            f"budget exhausted: {named}. Nothing was written; only an operator's grant "
            "(POST /runs/{id}/actions/grant_budget) adds budget.",
            fields={f"budgets.{key}": f"at most {limit}" for key, (_, limit) in over.items()},
        )


def commit_rules_check(
    *,
    run: RunFacts,
    definition: dict[str, Any],
    state: str,
    status: str,
    budgets: dict[str, Any],
    evidence: dict[str, Any],
    control: dict[str, Any],
    operator_override: bool = False,
) -> ApprovalUse | None:
    """Check one commit against the run's workflow ``definition`` (see the module
    docstring), with the run as the commit read it (its state and version are the ones
    being left). Writes nothing. Raises IllegalTransition, BudgetExhausted,
    ApprovalRequired or an approval code. Returns the approval the commit must consume in
    its transaction (``commit_approval_consume``) when it leaves an approval state under an
    approved request, else None."""
    _check_status(run, definition, state, status, operator_override)
    _check_budgets(run, budgets, status)
    leaves_approval = run.state in definition.get("approval_states", []) and state != run.state
    # Giving up (failing the run) needs no approval: nothing runs after it.
    if leaves_approval and not operator_override and status != RunStatus.FAILED:
        return approvals_port().commit_approval_check(
            run=run, state=state, evidence=evidence, control=control
        )
    return None


def commit_approval_consume(*, use: ApprovalUse, run: RunFacts, actor: Actor) -> None:
    """Consume ``use`` for the run at the version being left: call it inside the commit's
    transaction, so the approval is used if and only if the run moves. Raises the approval
    codes (expired, stale, closed) when it cannot be used any more."""
    approvals_port().commit_approval_consume(use=use, run=run, actor=actor)
