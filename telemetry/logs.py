"""One JSON line per run transition, written only once the transition has committed.

``checkpoint_commit`` logs its own "checkpoint committed" line; this covers the other
transitions: a run's start (its genesis checkpoint) and status changes that write no
checkpoint (operator actions, cancellation, a pause for review).
"""

from __future__ import annotations

import logging

from django.db import transaction

log = logging.getLogger("cairn.transitions")


def transition_log(
    *, event: str, run_id: object, tenant: str, sequence: int, state: str, step: str, status: str
) -> None:
    """Log after the surrounding transaction commits (at once outside a transaction);
    nothing is logged for a transition that rolls back."""
    extra = {
        "run": str(run_id),
        "tenant": tenant,
        "sequence": sequence,
        "state": state,
        "step": step,
        "status": str(status),
    }
    transaction.on_commit(lambda: log.info(event, extra=extra))
