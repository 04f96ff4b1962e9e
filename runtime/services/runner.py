"""What an externally driven run's runner should do next, and waiting until it is due.

A runner long-polls ``GET /api/v1/runs/{id}/next?wait=30`` instead of polling in a loop:
the answer comes as soon as the run's next command is due (a decision was made, a retry
came due, an operator resumed it) or when the wait is over (``due`` false).

The wait sleeps on a notification of the run's change (``checkpoints.services.changes``),
reading the run only when woken, when a retry comes due and when the wait is over. Served
by the web process (``cairn.asgi``), it sleeps on the event loop and holds no thread: the
view begins it (``run_wait_begin``) and hands it over (``WaitHandoff``). Served any other
way (a test client), ``run_wait_next`` sleeps in the calling thread. Each wait holds one of
its tenant's ``CAIRN_WAITS_PER_TENANT`` slots per web process; past that the tenant gets
TooManyWaits (429, ``Retry-After``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.utils import timezone

from cairn.errors import InvalidRequest, TooManyWaits
from checkpoints.approvals_port import approvals_port
from checkpoints.models import TERMINAL_STATUSES, Run, RunStatus
from checkpoints.services.changes import (
    recheck_seconds,
    run_change_listen,
    run_change_subscribed,
)
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


class WaitSlot:
    """One of a tenant's waits in this process, held until ``release()`` (idempotent)."""

    def __init__(self, tenant: Tenant) -> None:
        cap = settings.CAIRN_WAITS_PER_TENANT
        with _slots_lock:
            held = _slots.get(tenant.pk, 0)
            if held >= cap:
                raise TooManyWaits(
                    f"This tenant already holds {held} waiting requests on this server, the "
                    f"limit (CAIRN_WAITS_PER_TENANT). Wait on fewer runs at once, or ask "
                    f"again after {WAIT_RETRY_AFTER_SECONDS} seconds.",
                )
            _slots[tenant.pk] = held + 1
        self.tenant_pk = tenant.pk
        self.held = True

    def release(self) -> None:
        with _slots_lock:
            if not self.held:
                return
            self.held = False
            left = _slots[self.tenant_pk] - 1
            if left:
                _slots[self.tenant_pk] = left
            else:
                del _slots[self.tenant_pk]


@dataclass(frozen=True)
class RunWait:
    """A wait on a run's next command: the answer as of the last look, and, while it sleeps
    for a better one, the tenant's ``slot`` (None: ``answer`` is final, as it is due or the
    wait was for 0 seconds). ``deadline`` is on ``time.monotonic()``."""

    tenant: Tenant
    run_id: str
    answer: NextCommand
    deadline: float
    retry_due_at: datetime | None = None
    slot: WaitSlot | None = None

    def sleep_seconds(self) -> float:
        """How long to sleep before the next look (0: the wait is over): until the
        deadline, a retry coming due, or the change notifications' safety re-check."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return 0.0
        seconds = min(left, recheck_seconds())
        if self.retry_due_at is not None:
            due_in = (self.retry_due_at - timezone.now()).total_seconds()
            seconds = min(seconds, max(0.0, due_in + 0.01))
        return seconds


def _looked(run: Run) -> dict[str, Any]:
    """The answer as of ``run``, and when a retry it waits for comes due."""
    retrying = run.status == RunStatus.WAITING_RETRY and run.next_eligible_at is not None
    return {
        "answer": run_next_command(run=run),
        "retry_due_at": run.next_eligible_at if retrying else None,
    }


def run_wait_begin(*, tenant: Tenant, run_id: UUID | str, wait_seconds: int) -> RunWait:
    """The first look of a wait of ``wait_seconds`` (0-30). When the answer is not due and
    the caller may wait, the tenant's slot is taken and held by the returned wait until its
    ``slot.release()``: the caller then sleeps on the run's change notification
    (``checkpoints.services.changes``, subscribed before this look) and looks again with
    ``run_wait_look``. Raises NotFound, InvalidRequest (a wait outside 0-30) or
    TooManyWaits (the tenant holds ``CAIRN_WAITS_PER_TENANT`` waits here already)."""
    if not isinstance(wait_seconds, int) or not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
        raise InvalidRequest(
            f"wait is a whole number of seconds from 0 to {MAX_WAIT_SECONDS}.",
            fields={"wait": f"0-{MAX_WAIT_SECONDS}"},
        )
    deadline = time.monotonic() + wait_seconds
    if wait_seconds:
        run_change_listen()  # other processes' changes are heard before this look
    run = run_get(tenant=tenant, run_id=run_id)
    wait = RunWait(tenant=tenant, run_id=str(run.pk), deadline=deadline, **_looked(run))
    if wait.answer.due or wait_seconds == 0:
        return wait
    return replace(wait, slot=WaitSlot(tenant))


def run_wait_look(*, wait: RunWait) -> RunWait:
    """Look at the run again (one read, outside any transaction, so a change committed by
    another process is seen): the same wait with the answer as of now."""
    return replace(wait, **_looked(run_get(tenant=wait.tenant, run_id=wait.run_id)))


def run_wait_next(*, tenant: Tenant, run_id: UUID | str, wait_seconds: int) -> NextCommand:
    """Answer the run's next command as soon as it is due, or after ``wait_seconds`` (0-30)
    with ``due`` false, sleeping on the run's change notification and holding the calling
    thread meanwhile (a request served without ``cairn.asgi``'s event loop, a test). Raises
    what ``run_wait_begin`` raises."""
    with run_change_subscribed(run_id, threading.Event()) as changed:
        wait = run_wait_begin(tenant=tenant, run_id=run_id, wait_seconds=wait_seconds)
        if wait.slot is None:
            return wait.answer
        try:
            while (timeout := wait.sleep_seconds()) > 0:
                changed.wait(timeout)
                changed.clear()
                wait = run_wait_look(wait=wait)
                if wait.answer.due:
                    break
            return wait.answer
        finally:
            wait.slot.release()


class WaitHandoff:
    """How the web process's event loop (``cairn.asgi``) takes a wait over from the view
    that began it, so that the wait sleeps holding no thread: the loop puts one in the
    request's ASGI scope under ``SCOPE_KEY`` (no client can), the view ``take``s the wait it
    began, and the loop sleeps, looks, releases the slot and asks for the answer again."""

    SCOPE_KEY = "cairn.run_wait"

    def __init__(self) -> None:
        self.wait: RunWait | None = None

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> WaitHandoff | None:
        """The handoff of the request whose WSGI environ is ``meta``, if the loop made one."""
        scope = meta.get("asgi.scope")
        handoff = scope.get(cls.SCOPE_KEY) if isinstance(scope, dict) else None
        return handoff if isinstance(handoff, cls) else None

    def take(self, wait: RunWait) -> None:
        if wait.slot is not None:
            self.wait = wait
