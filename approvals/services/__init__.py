"""Hash-bound approvals: request, decide, consume, expire.

An approval is valid only for the run version, action and artifact sha256 it names, before
its expiry, decided by someone allowed to review who is not the requester, and it is used
at most once. Every service owns its transaction and writes its audit events in it;
notification signals (``approvals.signals``) go out only after commit.
"""

from approvals.services._common import may_review, run_starter
from approvals.services.decisions import approval_decide
from approvals.services.expiry import approval_expire_due
from approvals.services.gate import (
    GateVerdict,
    approval_commit_check,
    approval_consume,
    approval_gate,
)
from approvals.services.requests import approval_request_create
from approvals.services.standing import ApprovalAsk, ApprovalStanding, approval_standing

__all__ = [
    "ApprovalAsk",
    "ApprovalStanding",
    "GateVerdict",
    "approval_commit_check",
    "approval_consume",
    "approval_decide",
    "approval_expire_due",
    "approval_gate",
    "approval_request_create",
    "approval_standing",
    "may_review",
    "run_starter",
]
