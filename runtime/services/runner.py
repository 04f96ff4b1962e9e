"""What an externally driven run's runner should do next, and waiting until it is due.

A runner long-polls ``GET /api/v1/runs/{id}/next?wait=30`` instead of polling in a loop:
the answer comes as soon as the run's next command is due (a decision was made, a retry
came due, an operator resumed it) or when the wait is over (``due`` false).

The wait sleeps on a notification of the run's change (``checkpoints.services.changes``),
reading the run only when woken, when a retry comes due and when the wait is over. A wait
holds its server thread while it sleeps (gunicorn's threads), so one tenant holds at most
``CAIRN_WAITS_PER_TENANT`` waits per web process; past that it gets TooManyWaits (429,
``Retry-After``) and the other threads stay free for everybody else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from uuid import UUID

from django.conf import settings
from django.utils import timezone

from cairn.errors import InvalidRequest, TooManyWaits
from checkpoints.approvals_port import approvals_port
from checkpoints.models import TERMINAL_STATUSES, Run, RunStatus
from checkpoints.services.changes import recheck_seconds, run_change_awaited
from checkpoints.services.reads import run_get
from tenants.models import Tenant

MAX_WAIT_SECONDS = 30
WAIT_RETRY_AFTER_SECONDS = 2

_slots_lock = threading.Lock()
_slots: dict[object, int] = {}  # tenant id → waits held in this process


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


@contextmanager
def _wait_slot(tenant: Tenant) -> Iterator[None]:
    """One of the tenant's waits in this process, or TooManyWaits past the cap."""
    cap = settings.CAIRN_WAITS_PER_TENANT
    with _slots_lock:
        held = _slots.get(tenant.pk, 0)
        if held >= cap:
            raise TooManyWaits(
                f"This tenant already holds {held} waiting requests on this server, the "
                f"limit (CAIRN_WAITS_PER_TENANT). Wait on fewer runs at once, or ask again "
                f"after {WAIT_RETRY_AFTER_SECONDS} seconds.",
            )
        _slots[tenant.pk] = held + 1
    try:
        yield
    finally:
        with _slots_lock:
            left = _slots[tenant.pk] - 1
            if left:
                _slots[tenant.pk] = left
            else:
                del _slots[tenant.pk]


def run_wait_next(*, tenant: Tenant, run_id: UUID | str, wait_seconds: int) -> NextCommand:
    """Answer the run's next command as soon as it is due, or after ``wait_seconds`` (0-30)
    with ``due`` false. It sleeps on the run's change notification; each look is a fresh
    read outside any transaction, so a change committed by another process is seen as soon
    as it is announced. Raises NotFound, InvalidRequest (a wait outside 0-30) or
    TooManyWaits (the tenant holds ``CAIRN_WAITS_PER_TENANT`` waits here already)."""
    if not isinstance(wait_seconds, int) or not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
        raise InvalidRequest(
            f"wait is a whole number of seconds from 0 to {MAX_WAIT_SECONDS}.",
            fields={"wait": f"0-{MAX_WAIT_SECONDS}"},
        )
    deadline = time.monotonic() + wait_seconds
    run = run_get(tenant=tenant, run_id=run_id)
    answer = run_next_command(run=run)
    if answer.due or wait_seconds == 0:
        return answer
    with _wait_slot(tenant), run_change_awaited(run.pk) as changed:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return answer
            timeout = min(left, recheck_seconds())
            if run.status == RunStatus.WAITING_RETRY and run.next_eligible_at is not None:
                due_in = (run.next_eligible_at - timezone.now()).total_seconds()
                timeout = max(0.0, min(timeout, due_in + 0.01))
            changed.wait(timeout)
            changed.clear()
            run = run_get(tenant=tenant, run_id=run_id)
            answer = run_next_command(run=run)
            if answer.due:
                return answer
