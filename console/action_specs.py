"""What each console action does: its form, the sentences saying what will happen, and
the service call. The flow that uses them is in ``console.actions``."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from approvals.models import LIVE_STATUSES
from cairn.errors import CairnError
from checkpoints.models import ExternalOperation, OperationStatus, Run, RunStatus
from console import forms_actions as f
from runtime.services.actions import (
    GRANT_KEYS,
    grant_plan,
    resume_check,
    run_grant_budget,
    run_resume,
)
from runtime.services.cancel import cancel_refusal, run_cancel
from runtime.services.cancel_finish import cancel_blocking_operations
from runtime.services.forks import run_fork, run_fork_review
from runtime.services.operations import operation_record_outcome
from runtime.services.pause import pause_refusal, run_pause, run_unpause, unpause_refusal
from runtime.services.retry import retry_check, run_retry
from tenants.access import ConsoleAccess


@dataclass
class Summary:
    """What will happen, in sentences; ``blocked`` says why it cannot happen now."""

    lines: list[str] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    blocked: str = ""
    # A fork's input changes as (name, before, after), and (name, sentence) for each changed
    # name no step reads.
    changes: list[tuple[str, str, str]] = field(default_factory=list)
    unread: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Spec:
    label: str
    verb: str  # the confirm button: "Resume the run"
    form: type[f.ActionForm]
    summary: Callable[..., Summary]
    perform: Callable[..., tuple[Run, str]]  # → (run to show next, success message)


# --- what will happen -----------------------------------------------------------------------
def _resume_summary(run: Run, data: dict, access: ConsoleAccess) -> Summary:
    who = "A Cairn worker" if run.execution == "worker" else "Your external driver"
    summary = Summary(
        [
            f"The run goes from {run.get_status_display().lower()} to running, at version "
            f"{run.version + 1}.",
            f"{who} continues it from its latest checkpoint #{run.checkpoint_sequence} "
            f"(state {run.state}); nothing before it runs again.",
        ]
    )
    try:
        awaited = resume_check(run)
    except CairnError as exc:
        summary.blocked = exc.detail
        return summary
    if awaited is not None:
        return Summary(
            [
                f"Approval request {awaited.request_id} is {awaited.status}, but the command "
                "that carries the decision out was lost: the run still waits at "
                f"{run.state}, version {run.version}.",
                "Resuming sends that command again, at the same version (the approval is "
                f"bound to it); {who.lower()} then moves the run on as decided.",
            ]
        )
    unsettled = list(
        ExternalOperation.objects.filter(
            run=run, status__in=(OperationStatus.UNKNOWN, OperationStatus.PENDING)
        ).values_list("idempotency_key", "status")
    )
    if unsettled:
        # Restore settles them before any step runs (reconciliation): say so, not "continues".
        keys = ", ".join(f"{key} ({status})" for key, status in unsettled)
        summary.lines[1] = (
            f"Before anything runs, {who.lower()} settles operation(s) {keys} with the "
            "provider; if the provider cannot tell, the run waits for you to record the "
            "outcome here, and nothing is sent again blindly."
        )
        summary.lines.append(
            f"Then it continues from checkpoint #{run.checkpoint_sequence} (state {run.state})."
        )
    return summary


def _cancel_summary(run: Run, data: dict, access: ConsoleAccess) -> Summary:
    refusal = cancel_refusal(run)
    if refusal is not None:
        return Summary(blocked=refusal.detail)
    keys = list(cancel_blocking_operations(run).values_list("idempotency_key", flat=True))
    if not keys:
        summary = Summary(
            ["The run stops now and becomes cancelled. Its checkpoints and evidence are kept."]
        )
    else:
        summary = Summary(
            [
                f"{len(keys)} operation(s) may be in flight: {', '.join(keys)}.",
                "Their providers are asked first; the run stays cancelling until each one is "
                "settled (confirmed or failed), then it becomes cancelled.",
                "If a provider cannot tell, you record the outcome here on the run page.",
            ]
        )
    # run_cancel closes the run's live requests in its transaction: say so before.
    live = run.approval_requests.filter(status__in=LIVE_STATUSES).count()
    if live == 1:
        summary.lines.append(
            "Its pending approval request is closed: reviewers can no longer decide it, and "
            "it leaves the review queue."
        )
    elif live:
        summary.lines.append(
            f"Its {live} pending approval requests are closed: reviewers can no longer decide "
            "them, and they leave the review queue."
        )
    return summary


def _pause_summary(run: Run, data: dict, access: ConsoleAccess) -> Summary:
    summary = Summary(
        [
            f"The run stays {run.get_status_display().lower()} at checkpoint "
            f"#{run.checkpoint_sequence} (state {run.state}), and nothing dispatches it: no "
            "worker starts a step for it, and the commands a resume, a retry or an approval "
            "would send wait until you unpause it.",
            "Unlike a cancel, nothing ends; unlike a legal hold, retention is not affected.",
        ]
    )
    if run.lease_held():
        summary.lines.append(
            f"A worker ({run.lease_owner}) is running a step now: that step finishes and "
            "commits, then the run stops."
        )
    summary.blocked = pause_refusal(run)
    return summary


def _unpause_summary(run: Run, data: dict, access: ConsoleAccess) -> Summary:
    refusal = unpause_refusal(run)
    if refusal:
        return Summary(blocked=refusal)
    who = "a Cairn worker" if run.execution == "worker" else "your external driver"
    return Summary(
        [
            f"The hold is lifted ({run.pause_reason}).",
            f"The run goes on as {run.get_status_display().lower()}: {who} continues it "
            "from its latest checkpoint when it is due.",
        ]
    )


def _retry_summary(run: Run, data: dict, access: ConsoleAccess) -> Summary:
    try:  # the refusal the retry itself would answer (one function decides: retry_check)
        choice = retry_check(run, data["step"])
    except CairnError as refusal:
        return Summary(blocked=refusal.detail)
    summary = Summary(
        [
            f"Checkpoint #{run.checkpoint_sequence + 1} is appended: the run moves from state "
            f"{run.state} to {choice.state}, and step {choice.step} runs again.",
            "Evidence and the budget used so far are carried forward; earlier checkpoints stay "
            "as they are.",
        ]
    )
    live = run.approval_requests.filter(status__in=LIVE_STATUSES).count()
    if live:
        summary.lines.append(
            f"The run's open approval request is closed (superseded): it is bound to version "
            f"{run.version}. The run asks again when it reaches its approval state."
        )
    return summary


def _fork_summary(run: Run, data: dict, access: ConsoleAccess) -> Summary:
    sequence = data["from_sequence"]
    patch = data.get("inputs_patch")
    # Refused here (shown on the form) exactly as the fork itself would be refused.
    review = run_fork_review(
        tenant=access.tenant, run_id=run.pk, from_sequence=sequence, inputs_patch=patch
    )
    summary = Summary(
        [
            f"A new run starts from checkpoint #{sequence} of this run, with its evidence and "
            "the budget used at that point.",
            (
                f"Inputs changed: {', '.join(c.key for c in review.changes)}."
                if review.changes
                else f"No input changes: the fork starts with the same inputs as checkpoint "
                f"#{sequence}, so its steps may produce the same results again (and a "
                "reviewer may be asked to approve the same draft again)."
            ),
            "This run is not changed.",
        ]
    )
    summary.warnings = review.warnings
    summary.changes = [
        (
            c.key,
            "(none)" if c.added else _json(c.before),
            "(removed)" if c.removed else _json(c.after),
        )
        for c in review.changes
    ]
    workflow = f"{run.workflow_type}@{run.workflow_version}"
    summary.unread = [
        (key, f"No step of {workflow} reads {key!r}: the fork carries it, but nothing uses it.")
        for key in review.unread
    ]
    if review.changes and not review.reads_known:
        summary.lines.append(
            f"Cairn cannot tell from {workflow}'s code which inputs its steps read, so it "
            "cannot warn about a name no step reads: check the names."
        )
    if not summary.warnings:
        summary.lines.append(f"No confirmed side effect happened after checkpoint #{sequence}.")
    return summary


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _amount(value: float | int) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _grant_summary(run: Run, data: dict, access: ConsoleAccess) -> Summary:
    # Refused here (shown on the form) exactly as the grant itself would be refused.
    after = grant_plan(run, **{k: data.get(k) for k in (*GRANT_KEYS, "deadline")}).limits
    lines = [
        f"{name.capitalize()}: limit {_amount(run.budget_limits[key])} → {_amount(after[key])}."
        for name, key in GRANT_KEYS.items()
        if data.get(name) is not None
    ]
    if data.get("deadline"):
        lines.append(f"Deadline: {run.budget_limits.get('deadline')} → {after['deadline']}.")
    if run.status == RunStatus.FAILED:
        lines.append("The run stays failed until you resume it.")
    return Summary(lines)


def _noting_hold(summary_of: Callable[..., Summary]) -> Callable[..., Summary]:
    """A summary that also says, on a paused run, that the command waits for the unpause."""

    def summary(run: Run, data: dict, access: ConsoleAccess) -> Summary:
        said = summary_of(run, data, access)
        if run.paused and not said.blocked:
            said.lines.append("The run is paused: its command waits, unsent, until you unpause it.")
        return said

    return summary


# --- the services ---------------------------------------------------------------------------
def _resume(run: Run, data: dict, access: ConsoleAccess) -> tuple[Run, str]:
    run = run_resume(
        tenant=access.tenant,
        run_id=run.pk,
        expected_version=data["version"],
        reason=data["reason"],
        actor=access.actor,
    )
    if run.status == RunStatus.WAITING_APPROVAL:
        return run, "Its command was sent again: a worker moves the run on as decided."
    return run, "Resumed: the run is running again."


def _cancel(run: Run, data: dict, access: ConsoleAccess) -> tuple[Run, str]:
    run = run_cancel(
        tenant=access.tenant,
        run_id=run.pk,
        reason=data["reason"],
        expected_version=data["version"],
        actor=access.actor,
    )
    if run.status == RunStatus.CANCELLED:
        return run, "Cancelled."
    return run, "Cancelling: the run waits until its open operations are settled."


def _pause(run: Run, data: dict, access: ConsoleAccess) -> tuple[Run, str]:
    run = run_pause(
        tenant=access.tenant,
        run_id=run.pk,
        reason=data["reason"],
        expected_version=data["version"],
        actor=access.actor,
    )
    return run, "Paused: nothing dispatches the run until you unpause it."


def _unpause(run: Run, data: dict, access: ConsoleAccess) -> tuple[Run, str]:
    run = run_unpause(
        tenant=access.tenant,
        run_id=run.pk,
        reason=data.get("reason") or "",
        expected_version=data["version"],
        actor=access.actor,
    )
    return run, "Unpaused: the run goes on."


def _retry(run: Run, data: dict, access: ConsoleAccess) -> tuple[Run, str]:
    run = run_retry(
        tenant=access.tenant,
        run_id=run.pk,
        step=data["step"],
        reason=data["reason"],
        expected_version=data["version"],
        actor=access.actor,
    )
    return run, f"Step {run.step} will run again (checkpoint #{run.checkpoint_sequence})."


def _fork(run: Run, data: dict, access: ConsoleAccess) -> tuple[Run, str]:
    result = run_fork(
        tenant=access.tenant,
        run_id=run.pk,
        from_sequence=data["from_sequence"],
        inputs_patch=data.get("inputs_patch"),
        reason=data["reason"],
        expected_version=data["version"],
        actor=access.actor,
    )
    message = f"Forked from run {run.pk} at checkpoint #{data['from_sequence']}."
    if result.warnings:
        keys = ", ".join(w["idempotency_key"] for w in result.warnings)
        message += f" Side effects that may happen again: {keys}."
    return result.run, message


def _grant(run: Run, data: dict, access: ConsoleAccess) -> tuple[Run, str]:
    run = run_grant_budget(
        tenant=access.tenant,
        run_id=run.pk,
        reason=data["reason"],
        expected_version=data["version"],
        actor=access.actor,
        **{
            k: data[k]
            for k in ("attempts", "tokens", "cost", "deadline")
            if data.get(k) is not None
        },
    )
    return run, "Budget granted."


ACTIONS: dict[str, Spec] = {
    "resume": Spec(
        "Resume", "Resume the run", f.ResumeForm, _noting_hold(_resume_summary), _resume
    ),
    "cancel": Spec("Cancel", "Cancel the run", f.CancelForm, _cancel_summary, _cancel),
    "retry": Spec(
        "Retry a step", "Run the step again", f.RetryForm, _noting_hold(_retry_summary), _retry
    ),
    "pause": Spec("Pause", "Pause the run", f.PauseForm, _pause_summary, _pause),
    "unpause": Spec("Unpause", "Unpause the run", f.UnpauseForm, _unpause_summary, _unpause),
    "fork": Spec("Fork", "Create the fork", f.ForkForm, _fork_summary, _fork),
    "grant_budget": Spec(
        "Grant budget", "Grant the budget", f.GrantBudgetForm, _grant_summary, _grant
    ),
}


# --- recording the outcome of an ambiguous operation -----------------------------------------
def outcome_spec(operation: ExternalOperation) -> Spec:
    def summary(run: Run, data: dict, access: ConsoleAccess) -> Summary:
        happened = data["outcome"] == "confirmed"
        lines = [
            f"Operation {operation.idempotency_key} ({operation.action} on {operation.target}) "
            + (
                f"is recorded as confirmed with provider id {data['provider_operation_id']}."
                if happened
                else "is recorded as failed: it did not happen and will not."
            ),
            "An outcome is final; it cannot be changed afterwards.",
        ]
        if operation.status == OperationStatus.RESERVED:
            lines.insert(
                0,
                "It is only reserved: Cairn has no record that it was sent (a worker marks an "
                "operation pending before it calls the provider, an API caller may not).",
            )
        if run.status == RunStatus.CANCELLING:
            lines.append(
                "The run is being cancelled: if this was its last open operation, it "
                "becomes cancelled."
            )
        else:
            lines.append("The run can continue once no operation is left without an outcome.")
        return Summary(lines)

    def perform(run: Run, data: dict, access: ConsoleAccess) -> tuple[Run, str]:
        operation_record_outcome(
            tenant=access.tenant,
            run_id=run.pk,
            idempotency_key=operation.idempotency_key,
            outcome=data["outcome"],
            provider_operation_id=data.get("provider_operation_id") or "",
            reason=data["reason"],
            actor=access.actor,
        )
        return run, f"Outcome of {operation.idempotency_key} recorded: {data['outcome']}."

    return Spec(
        f"Record the outcome of {operation.action}",
        "Record the outcome",
        f.RecordOutcomeForm,
        summary,
        perform,
    )
