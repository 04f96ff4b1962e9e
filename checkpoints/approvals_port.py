"""The approvals port: what the store and the engine ask of approvals, named here, below both.

Approvals sit above the store (``checkpoints``) and the engine (``runtime``): a request is
bound to a run's version and an artifact's hash, so the approvals app depends on both. Yet
both have to ask approvals something: the one-statement commit refuses to leave an approval
state without a valid approval and consumes it in its own transaction; the worker's restore
asks whether a run at an approval state may go on; operator actions close the requests a
run can no longer use; a runner's next command names the approved request it may act on;
``verify`` holds a run's chain to the approvals it consumed.

So the lower layers own the contract (``ApprovalsPort``, with the value types it speaks in)
and the project wires the implementation: ``settings.CAIRN_APPROVALS_PORT`` names it by
import path, as ``AUTHENTICATION_BACKENDS`` names authentication backends, and
``approvals_port()`` imports it. Nothing registers itself; the setting is the one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, Literal, Protocol
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import QuerySet
from django.utils.module_loading import import_string

from checkpoints.models import Run
from tenants.services import Actor


class CommitRun(Protocol):
    """The run as the commit read it (a Run or the commit's head): the state and version
    being left."""

    id: UUID
    tenant_id: UUID
    state: str
    version: int


class ApprovalState(Protocol):
    """A workflow's approval state as the restore sees it (``runtime.definition.ApprovalSpec``):
    ``artifact`` names the evidence artifact under review (None: the newest draft)."""

    state: str
    action: str
    artifact: str | None


@dataclass(frozen=True)
class ApprovalUse:
    """An approved request the commit must consume, in its own transaction."""

    request_id: UUID
    action: str
    artifact_sha256: str


@dataclass(frozen=True)
class ConsumedApproval:
    """An approval a run consumed, as the chain check reads it: the checkpoint it was bound
    to (the one the run left under it), its action and the artifact it approved."""

    request_id: UUID
    action: str
    artifact_sha256: str
    checkpoint_sequence: int
    checkpoint_sha256: str


@dataclass(frozen=True)
class ApprovalOutcome:
    """``wait`` keeps the run in ``waiting_approval``; ``approved`` moves it to the approval
    spec's ``next`` state, ``rejected`` to its ``rejected`` state (or fails it). ``evidence``
    is merged into the committed checkpoint: ``validators`` (list), ``control`` (dict,
    e.g. ``approval_request_id``) and ``artifacts`` (list of references, each replacing the
    evidence artifact of its name: a reviewer's edit of the artifact under review)."""

    decision: str  # "wait" | "approved" | "rejected"
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def wait(cls, reason: str = "") -> ApprovalOutcome:
        return cls("wait", reason)


@dataclass(frozen=True)
class AwaitedApproval:
    """The request a waiting run is bound to, as an operator needs to hear about it."""

    request_id: UUID
    status: str  # pending, approved, rejected, consumed, expired, closed
    expires_at: datetime
    decided: bool  # approved, rejected or consumed: only the run's command is missing


class ApprovalsPort(Protocol):
    """Exactly what the layers below approvals need of it."""

    def commit_approval_check(
        self,
        *,
        run: CommitRun,
        action: str,
        state: str,
        evidence: dict[str, Any],
        control: dict[str, Any],
    ) -> ApprovalUse | None:
        """A commit leaves the approval state ``run.state`` for ``state``: the approval of
        ``action`` that allows it, bound to ``run.version`` and to an artifact ``evidence``
        names (``control.approval_request_id`` names it, else the newest that counts).
        Reads only. Returns the approved request the commit must consume, or None when it
        was consumed for this version already (the same one use). Raises ApprovalRequired,
        ApprovalStale, ApprovalHashMismatch, ApprovalExpired or ApprovalClosed."""
        ...

    def commit_approval_consume(self, *, use: ApprovalUse, run: CommitRun, actor: Actor) -> None:
        """Consume ``use`` for the run at the version being left, joining the caller's
        transaction (the commit's), so the approval is used if and only if the run moves.
        Raises ApprovalExpired, ApprovalStale, ApprovalHashMismatch or ApprovalClosed."""
        ...

    def restore_approval_outcome(
        self, *, run: Run, spec: ApprovalState, envelope: dict[str, Any]
    ) -> ApprovalOutcome:
        """The restore's gate at an approval state (the run leased, ``envelope`` its latest):
        may the run go on? Raises the request when there is none, re-evaluates expiry, and
        answers approved only with a valid approval for the run's version, the action the
        stored definition declares and the artifact sha256. The commit that moves the run on
        consumes it (``commit_approval_check``/``commit_approval_consume``), once."""
        ...

    def approval_requests_close(
        self,
        *,
        run: Run,
        reason: str,
        actor: Actor,
        status: Literal["closed", "superseded"] = "closed",
    ) -> int:
        """Close the run's live requests (it was cancelled, or ``superseded``: its version
        moves and it will ask again) with the sentence ``reason``, joining the caller's
        transaction (the one that moves the run). Returns how many were closed."""
        ...

    def approved_request_id(self, *, run: Run) -> UUID | None:
        """The approved, unexpired request bound to the run's current version and the action
        its approval state declares, that a runner may move past the approval state under,
        else None. Reads only."""
        ...

    def approvals_consumed(self, *, run_id: UUID) -> list[ConsumedApproval]:
        """Every approval the run consumed, oldest first: what ``verify`` holds its chain
        to. Reads only."""
        ...

    def runs_with_unused_decision(self, *, runs: QuerySet[Run]) -> QuerySet[Run]:
        """``runs`` narrowed to those with a decision bound to their current version that no
        commit has acted on yet: a request approved, rejected, or consumed for this version by
        an older gate whose commit never came. Such a run needs only its command to go on
        (the rescue, an operator's resume). A filter, not a read: one statement with the
        caller's."""
        ...

    def approval_awaited(self, *, run: Run) -> AwaitedApproval | None:
        """The request a run at an approval state waits on: the newest bound to its current
        version (superseded ones aside), else None. Reads only."""
        ...


OPERATIONS = (
    "commit_approval_check",
    "commit_approval_consume",
    "restore_approval_outcome",
    "approval_requests_close",
    "approved_request_id",
    "runs_with_unused_decision",
    "approval_awaited",
    "approvals_consumed",
)


def approvals_port() -> ApprovalsPort:
    """The approvals implementation ``settings.CAIRN_APPROVALS_PORT`` names, imported once
    per setting value (so ``override_settings`` takes effect). Raises ImproperlyConfigured,
    naming the setting, when it is unset, cannot be imported or lacks an operation."""
    path = getattr(settings, "CAIRN_APPROVALS_PORT", None)
    if not isinstance(path, str) or not path:
        raise ImproperlyConfigured(
            "CAIRN_APPROVALS_PORT is not set: name the approvals implementation by import "
            'path in the settings, e.g. CAIRN_APPROVALS_PORT = "approvals.port.port".'
        )
    return _port_load(path)


@lru_cache(maxsize=8)
def _port_load(path: str) -> ApprovalsPort:
    try:
        port = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"CAIRN_APPROVALS_PORT names '{path}', which cannot be imported ({exc})."
        ) from exc
    missing = [name for name in OPERATIONS if not callable(getattr(port, name, None))]
    if missing:
        raise ImproperlyConfigured(
            f"CAIRN_APPROVALS_PORT names '{path}', which lacks the approvals operation(s) "
            f"{', '.join(missing)} (see checkpoints.approvals_port.ApprovalsPort)."
        )
    return port
