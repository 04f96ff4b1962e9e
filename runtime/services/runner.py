"""What an externally driven run's runner should do next, and waiting until it is due.

A runner long-polls ``GET /api/v1/runs/{id}/next?wait=30`` instead of polling in a loop:
the answer comes as soon as the run's next command is due (a decision was made, a retry
came due, an operator resumed it) or when the wait is over (``due`` false).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from uuid import UUID

from django.utils import timezone

from cairn.errors import InvalidRequest
from checkpoints.approvals_port import approvals_port
from checkpoints.models import TERMINAL_STATUSES, Run, RunStatus
from checkpoints.services.reads import run_get
from tenants.models import Tenant

MAX_WAIT_SECONDS = 30
POLL_SECONDS = 0.2


@dataclass(frozen=True)
class NextCommand:
    """``command`` is one of: ``step`` (run the step at ``state``), ``approval_decided``
    (an approval for this version was granted: move past the approval state),
    ``retry`` (the retry is due: run the step at ``state`` again), ``finished`` (the run
    ended), ``stop`` (it is being cancelled: settle open operations, write nothing else),
    or ``wait`` (nothing is due: a person or the clock has to act first)."""

    run_id: str
    version: int
    status: str
    state: str
    due: bool
    command: str
    reason: str
    approval_request_id: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def run_next_command(*, run: Run) -> NextCommand:
    """The run's next command as of now. Reads only."""
    facts = {
        "run_id": str(run.pk),
        "version": run.version,
        "status": run.status,
        "state": run.state,
    }
    now = timezone.now()
    if run.status in TERMINAL_STATUSES:
        return NextCommand(**facts, due=True, command="finished", reason=run.status_reason)
    if run.status == RunStatus.CANCELLING:
        return NextCommand(**facts, due=True, command="stop", reason=run.status_reason)
    if run.paused:
        # An operator's hold: no step until it is lifted (runtime.services.pause).
        return NextCommand(**facts, due=False, command="wait", reason=run.pause_reason)
    if run.status == RunStatus.RUNNING:
        return NextCommand(**facts, due=True, command="step", reason="")
    if run.status == RunStatus.WAITING_RETRY:
        if run.next_eligible_at is None or run.next_eligible_at <= now:
            return NextCommand(**facts, due=True, command="retry", reason=run.status_reason)
        return NextCommand(
            **facts,
            due=False,
            command="wait",
            reason=f"the retry is due at {run.next_eligible_at.isoformat()}",
        )
    if run.status == RunStatus.WAITING_APPROVAL:
        approved = approvals_port().approved_request_id(run=run)
        if approved is not None:
            return NextCommand(
                **facts,
                due=True,
                command="approval_decided",
                reason="approved",
                approval_request_id=str(approved),
            )
        return NextCommand(**facts, due=False, command="wait", reason="waiting for a decision")
    return NextCommand(
        **facts,
        due=False,
        command="wait",
        reason=run.status_reason or f"the run is {run.status}",
    )


def run_wait_next(*, tenant: Tenant, run_id: UUID | str, wait_seconds: int) -> NextCommand:
    """Answer the run's next command as soon as it is due, or after ``wait_seconds`` (0-30)
    with ``due`` false. Each look is a fresh read outside any transaction, so a decision
    committed by another process is seen within a fraction of a second. Raises NotFound or
    InvalidRequest (a wait outside 0-30)."""
    if not isinstance(wait_seconds, int) or not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
        raise InvalidRequest(
            f"wait is a whole number of seconds from 0 to {MAX_WAIT_SECONDS}.",
            fields={"wait": f"0-{MAX_WAIT_SECONDS}"},
        )
    deadline = time.monotonic() + wait_seconds
    run = run_get(tenant=tenant, run_id=run_id)
    while True:
        answer = run_next_command(run=run)
        if answer.due or time.monotonic() >= deadline:
            return answer
        time.sleep(POLL_SECONDS)
        run = run_get(tenant=tenant, run_id=run_id)
