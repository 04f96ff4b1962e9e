"""Hash-bound approvals: a request names exactly what is to be approved, a decision is final.

A request binds the run, the run version and checkpoint at request time, the artifact id
and sha256 under review and the action it would allow. It is valid only for that binding
and before its expiry; the services enforce it (``approvals.services``).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from checkpoints.models import Artifact, Checkpoint, Run
from tenants.models import Tenant


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"  # waiting for decisions
    APPROVED = "approved"  # enough approvals; waiting for the run to use it
    REJECTED = "rejected"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"  # a newer request (a new draft) replaced it
    CONSUMED = "consumed"  # the run continued under it; it cannot be used again
    CLOSED = "closed"  # the run was cancelled or finished without it


# A request in one of these statuses can still let the run continue.
LIVE_STATUSES = (ApprovalStatus.PENDING, ApprovalStatus.APPROVED)


class ApprovalRequest(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approval_requests")
    run_version = models.PositiveBigIntegerField()
    # Retention may delete old checkpoints; the sequence and hash keep the binding readable.
    checkpoint = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    checkpoint_sequence = models.PositiveBigIntegerField()
    checkpoint_sha256 = models.CharField(max_length=64, blank=True)
    artifact = models.ForeignKey(Artifact, on_delete=models.PROTECT, related_name="+")
    artifact_sha256 = models.CharField(max_length=64)
    action = models.CharField(max_length=100)
    requester = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="approval_requests",
    )
    requester_label = models.CharField(max_length=200)  # username, or a worker's name
    # The quorum: approvals by this many distinct reviewers grant the request.
    required_approvals = models.PositiveSmallIntegerField(default=1)
    # Who may decide, as the approval state declared it when the request was raised: a role
    # ("reviewer", "admin") or a reviewer group of the tenant, by name; both blank: anyone
    # who may review the run (``approvals.services.standing.reviewer_refusal``).
    reviewer_role = models.CharField(max_length=16, blank=True)
    reviewer_group = models.CharField(max_length=64, blank=True)
    # 0: raised to the declared reviewers; n: the n-th escalation ("escalation.to[n-1]"),
    # raised after the previous level expired with no decision (its reason: status_reason).
    escalation_level = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(
        max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    status_reason = models.TextField(blank=True)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    # When its reviewers were told it is about to expire (``approvals.notify``), once.
    reminded_at = models.DateTimeField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    # The request this one replaced (an expired or superseded one), for the reviewer's diff.
    previous = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Approve with edits: a reviewer edited the artifact of the request this one replaced
    # (``previous``); ``artifact`` holds the edited bytes, derived from ``edited_from`` (the
    # artifact the reviewer was shown) and uploaded by ``edited_by``, whose approval is this
    # request's first. Renewing or escalating the request keeps them.
    edited_from = models.ForeignKey(
        Artifact, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    edited_from_sha256 = models.CharField(max_length=64, blank=True)
    edited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "status", "-created_at"]),
            models.Index(fields=["run", "-created_at"]),
            models.Index(fields=["status", "expires_at"]),
        ]
        constraints = [
            # One live request per run and action: a new one supersedes the old in the
            # same transaction, so two approvals can never race for one state.
            models.UniqueConstraint(
                fields=["run", "action"],
                condition=Q(status__in=["pending", "approved"]),
                name="approval_one_live_per_run_action",
            ),
            models.CheckConstraint(
                condition=Q(required_approvals__gte=1), name="approval_requires_one_or_more"
            ),
        ]

    def __str__(self) -> str:
        return f"approval {self.id} ({self.action} {self.artifact_sha256[:12]}, {self.status})"


class DecisionKind(models.TextChoices):
    APPROVE = "approve"
    REJECT = "reject"


class ImmutableDecision(Exception):
    pass


class ApprovalDecision(models.Model):
    """One reviewer's final word on one request. Never updated, never deleted."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="decisions")
    approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approval_decisions"
    )
    decision = models.CharField(max_length=8, choices=DecisionKind.choices)
    # Decided through a delegation: the vote is this reviewer's (the delegator's).
    on_behalf_of = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="approval_decisions_delegated",
    )
    artifact_sha256 = models.CharField(max_length=64)  # the hash the reviewer was shown
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["request", "approver"], name="approval_one_decision_per_reviewer"
            )
        ]

    def __str__(self) -> str:
        return f"{self.decision} by {self.approver_id} on {self.request_id}"

    def save(self, *args, **kwargs):  # noqa: ANN002, ANN003
        if not self._state.adding:
            raise ImmutableDecision("approval decisions are immutable")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):  # noqa: ANN002, ANN003
        raise ImmutableDecision("approval decisions are never deleted")


class NotificationPreference(models.Model):
    """How one member of one tenant wants to be told that a request waits for them: by
    email (to their account's address) and/or a chat message to a Slack-compatible
    incoming-webhook URL. No row: email on, chat off."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    email = models.BooleanField(default=True)
    chat = models.BooleanField(default=False)
    # A Slack-compatible webhook URL is its own credential: sealed at rest, bound to this
    # row (approvals.services.preferences), never shown back in full, never logged.
    chat_url_sealed = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="notification_pref_one")
        ]

    def __str__(self) -> str:
        return f"preferences of {self.user_id} in {self.tenant_id}"


class NotificationChannel(models.TextChoices):
    EMAIL = "email"
    CHAT = "chat"


class ApprovalNotification(models.Model):
    """One message to one reviewer about one request, on one channel, for one event. The
    unique key is what makes delivery "never twice": planning the same event again finds
    the row; a second delivery of it finds it sent (or claimed) and does nothing."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    request = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="notifications"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    channel = models.CharField(max_length=8, choices=NotificationChannel.choices)
    event = models.CharField(max_length=16)  # requested, expiring
    created_at = models.DateTimeField(auto_now_add=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["request", "user", "channel", "event"], name="notification_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.channel} to {self.user_id} for {self.request_id} ({self.event})"


class Delegation(models.Model):
    """A reviewer lets another reviewer of the tenant decide in their place for a period:
    the delegate may decide what the delegator may decide (their role or reviewer group),
    never a request the delegator is involved in (four eyes), and a decision made so
    counts as the delegator's one vote toward a quorum. Revoking sets ``revoked_at``."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    delegator = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="delegations_given"
    )
    delegate = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="delegations_received"
    )
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "delegate", "ends_at"])]

    def __str__(self) -> str:
        return f"{self.delegator_id} → {self.delegate_id} until {self.ends_at}"
