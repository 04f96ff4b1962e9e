"""The two places where other parts of Cairn decide whether a restored run may go on.

Both are plain functions the executor calls during every restore. Approvals sit above the
engine, so the approval gate asks them through the approvals port the project wires
(``checkpoints.approvals_port``, ``settings.CAIRN_APPROVALS_PORT``); the reconciler is the
engine's own. No signals, no registration magic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from checkpoints.approvals_port import ApprovalOutcome, approvals_port
from checkpoints.models import Run

if TYPE_CHECKING:
    from .definition import ApprovalSpec


def approval_gate(*, run: Run, spec: ApprovalSpec, envelope: dict[str, Any]) -> ApprovalOutcome:
    """The run is at an approval state: may it continue?

    Called with the run leased and its latest envelope restored (evidence artifacts by
    name: ``spec.artifact`` names the one under review). This is also where approval expiry
    is re-evaluated on every restore. The approvals app decides (through the approvals
    port): it raises the hash-bound request, and lets the run go on only with a valid
    approval for the run's current version, the action the stored definition declares and
    the artifact's sha256; the commit that moves the run past the state consumes it, once.
    """
    return approvals_port().restore_approval_outcome(run=run, spec=spec, envelope=envelope)


def operations_reconcile(*, run: Run, envelope: dict[str, Any]) -> str | None:
    """Settle every external operation of the run whose outcome is not known, before any
    new write. Returns None when the run may go on, or a reason to pause it for review.

    The reconciler (``runtime.services.reconcile``) asks each provider by idempotency
    key and records confirmed and failed answers. An operation the provider has no record
    of stays pending (the effect step sends it again under the same key, which the provider
    deduplicates); one whose provider cannot tell pauses the run, naming it. A provider
    that cannot be reached leaves its operation pending: the effect step asks again and
    waits to retry. Cairn never calls a provider blindly a second time.
    """
    from runtime.services.reconcile import run_reconcile
    from telemetry import tracing
    from tenants.services import Actor

    report = run_reconcile(run=run, actor=Actor.system("reconciler"))
    asked = {
        "confirmed": report.confirmed,
        "failed": report.failed,
        "not_found": report.not_found,
        "unknown": report.unknown,
        "unavailable": report.unavailable,
    }
    if any(asked.values()):  # an event only when something was open: the keys, by answer
        tracing.event(
            tracing.RECONCILE_EVENT,
            {f"cairn.reconcile.{answer}": keys for answer, keys in asked.items() if keys},
        )
    return report.pause_reason
