"""Domain errors. Each carries the API's machine code and HTTP status, and a sentence."""

from __future__ import annotations


class CairnError(Exception):
    code = "error"
    status = 400
    retry_after: int | None = None  # seconds, sent as Retry-After (a 503 the client may retry)

    def __init__(self, detail: str, *, fields: dict | None = None):
        self.detail = detail
        self.fields = fields
        super().__init__(detail)


class InvalidRequest(CairnError):
    code, status = "invalid_request", 400


class NotFound(CairnError):
    code, status = "not_found", 404


class PayloadTooLarge(CairnError):
    code, status = "payload_too_large", 413


class ConcurrentCheckpointWrite(CairnError):
    code, status = "concurrent_checkpoint_write", 409


class RunNotActive(CairnError):
    code, status = "run_not_active", 409


class LeaseHeld(CairnError):
    code, status = "lease_held", 409


class DefinitionConflict(CairnError):
    code, status = "definition_conflict", 409


class IdempotencyKeyReused(CairnError):
    code, status = "idempotency_key_reused", 409


class OperationStateConflict(CairnError):
    code, status = "operation_state_conflict", 409


class IllegalTransition(CairnError):
    code, status = "illegal_transition", 422


class InvalidEnvelope(CairnError):
    code, status = "invalid_envelope", 422


class InvalidDefinition(CairnError):
    code, status = "invalid_definition", 422


class ArtifactHashMismatch(CairnError):
    code, status = "artifact_hash_mismatch", 422


class SecretInEnvelope(CairnError):
    code, status = "secret_in_envelope", 422


class UnknownWorkflow(CairnError):
    code, status = "unknown_workflow", 422


class BudgetExhausted(CairnError):
    code, status = "budget_exhausted", 409


class StorageUnavailable(CairnError):
    """The artifact storage cannot take a write right now (a full or read-only disk, a bucket
    that cannot be reached); nothing was stored, and the same request may be sent again."""

    code, status = "storage_unavailable", 503
    retry_after = 30


class SigningKeyUnavailable(CairnError):
    """The deployment's evidence signing key is not configured or cannot be read."""

    code, status = "key_unavailable", 503


class TooManyWaits(CairnError):
    """A tenant holds as many long-polls on this web process as it may."""

    code, status = "too_many_waits", 429
    retry_after = 2


class IntegrityFailure(CairnError):
    """Stored data failed its hash or authentication check (tampering or damage)."""

    code, status = "integrity_failure", 409


class ActionNotAllowed(CairnError):
    """An operator action that the run's current status does not permit."""

    code, status = "action_not_allowed", 409


class UnknownStep(CairnError):
    code, status = "unknown_step", 422


class UnknownCheckpoint(CairnError):
    code, status = "unknown_checkpoint", 422


# --- approvals (approvals app) -------------------------------------------------------------
class ApprovalExpired(CairnError):
    code, status = "approval_expired", 409


class ApprovalHashMismatch(ArtifactHashMismatch):
    """The hash a reviewer saw is not the bound one: a conflict with the request, not bad input."""

    code, status = "artifact_hash_mismatch", 409


class ApprovalRequired(CairnError):
    """A commit leaves an approval state without a granted approval for the run's version."""

    code, status = "approval_required", 409


class ApprovalStale(CairnError):
    code, status = "approval_stale", 409


class SelfApprovalForbidden(CairnError):
    code, status = "self_approval_forbidden", 409


class AlreadyDecided(CairnError):
    code, status = "already_decided", 409


class ApprovalClosed(CairnError):
    """The request was already decided (by others) or used; it takes no more decisions."""

    code, status = "approval_closed", 409


class ReviewNotAllowed(CairnError):
    """The caller holds no review role in the tenant (the services check it, not only views)."""

    code, status = "permission_denied", 403


# --- tenants: members, tokens, grants (tenants app) ------------------------------------------
class LastAdmin(CairnError):
    """The change would leave a tenant without an admin, and so without anyone to fix it."""

    code, status = "last_admin", 409


class TokenNotYours(CairnError):
    """A person asked for an API token in someone else's name."""

    code, status = "permission_denied", 403


class AlreadyMember(CairnError):
    code, status = "already_member", 409


class GroupExists(CairnError):
    """A reviewer group of that name already exists in the tenant."""

    code, status = "group_exists", 409


class LegalHoldActive(CairnError):
    """A deletion was asked for data under legal hold (a run's or the whole tenant's)."""

    code, status = "legal_hold", 409
