"""The two places where other parts of Cairn decide whether a restored run may go on.

Both are plain functions the executor calls during every restore; the approvals app and
the side-effects code replace their bodies (no signals, no registration magic).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from checkpoints.models import ExternalOperation, OperationStatus, Run

if TYPE_CHECKING:
    from .definition import ApprovalSpec


@dataclass(frozen=True)
class ApprovalOutcome:
    """``wait`` keeps the run in ``waiting_approval``; ``approved`` moves it to the approval
    spec's ``next`` state, ``rejected`` to its ``rejected`` state (or fails it). ``evidence``
    is merged into the committed checkpoint: ``validators`` (list) and ``control`` (dict,
    e.g. ``approval_request_id``)."""

    decision: str  # "wait" | "approved" | "rejected"
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def wait(cls, reason: str = "") -> ApprovalOutcome:
        return cls("wait", reason)


def approval_gate(*, run: Run, spec: ApprovalSpec, envelope: dict[str, Any]) -> ApprovalOutcome:
    """The run is at an approval state: may it continue?

    Called with the run leased and its latest envelope restored (evidence artifacts by
    name: ``spec.artifact`` names the one under review). This is also where approval expiry
    is re-evaluated on every restore. Until the approvals app plugs in here, every run at an
    approval state waits.
    """
    return ApprovalOutcome.wait("waiting for a reviewer's decision")


UNSETTLED = (OperationStatus.PENDING, OperationStatus.UNKNOWN)


def operations_reconcile(*, run: Run, envelope: dict[str, Any]) -> str | None:
    """Settle every external operation of the run whose outcome is not known, before any
    new write. Returns None when the run may go on, or a reason to pause it for review.

    Until provider reconciliation plugs in here, any pending or unknown operation pauses
    the run: Cairn never calls a provider blindly a second time.
    """
    unsettled = list(
        ExternalOperation.objects.filter(run=run, status__in=UNSETTLED).values_list(
            "idempotency_key", "status"
        )[:5]
    )
    if not unsettled:
        return None
    named = ", ".join(f"{key} ({status})" for key, status in unsettled)
    return (
        f"external operation(s) {named} have no confirmed outcome; reconcile them before the "
        "run continues"
    )
