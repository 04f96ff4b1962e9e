"""What the approval-invariant tests hold every run to, written independently of the code
under test (issue 24): an oracle for the invariant on a chain of ``gated_publish`` (or of
the declarative ``research`` of tests.factories), and the rule for what reached a provider.
"""

from __future__ import annotations

from collections.abc import Iterable

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint, ExternalOperation, Run, RunStatus
from checkpoints.services.reads import checkpoint_envelope
from runtime.services.operations import operation_request

GATE = "review"
PAST = {"publish", "done", "rejected"}  # reached only through review, in both workflows
TERMINAL = {"done", "rejected"}


def invariant_breaks(run: Run) -> list[int]:
    """The sequences of the checkpoints that entered the states past ``review`` without a
    consumed approval of ``publish`` bound to the checkpoint they left (which was at
    ``review``) for an artifact they name; a terminal end is allowed unless the run
    succeeded there."""
    run.refresh_from_db()
    rows = list(Checkpoint.objects.filter(run=run).order_by("sequence"))
    consumed = list(
        ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.CONSUMED, action="publish")
    )
    broken, inside, previous = [], False, None
    for row in rows:
        if row.state not in PAST:
            inside = False
        elif not inside:
            names = {
                ref["sha256"] for ref in checkpoint_envelope(row)["evidence"].get("artifacts", [])
            }
            bound = any(
                c.checkpoint_sequence == row.sequence - 1
                and c.checkpoint_sha256 == row.parent_sha256
                and c.artifact_sha256 in names
                for c in consumed
            )
            if bound and previous is not None and previous.state == GATE:
                inside = True
            elif row.state in TERMINAL and not (
                row.sequence == run.checkpoint_sequence and run.status == RunStatus.SUCCEEDED
            ):
                pass  # an end, not a way on
            else:
                broken.append(row.sequence)
                inside = True  # one break per entry
        if row.state in TERMINAL:
            inside = False
        previous = row
    return broken


def shipped_unapproved(service, runs: Iterable[str] | None = None) -> list[str]:  # noqa: ANN001
    """Every publication the provider holds (for ``runs``, else any) that no consumed
    approval of its run binds: same action, and the draft it shipped is the approved
    artifact."""
    published = service.stats().get("ids", {})
    operations = ExternalOperation.objects.filter(idempotency_key__in=list(published))
    if runs is not None:
        operations = operations.filter(run_id__in=list(runs))
    problems = []
    if runs is None and operations.count() != len(published):
        problems.append("a publication that no operation records")
    for operation in operations:
        shipped = (operation_request(operation) or {}).get("draft_sha256")
        approved = ApprovalRequest.objects.filter(
            run_id=operation.run_id,
            status=ApprovalStatus.CONSUMED,
            action=operation.action,
            artifact_sha256=shipped,
        )
        if not approved.exists():
            problems.append(
                f"{operation.idempotency_key}: shipped {shipped} with no consumed approval "
                "binding it"
            )
    return problems
