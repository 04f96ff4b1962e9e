"""Retention policies, what compaction removed, and the few rows the metrics need.

A checkpoint's artifact references are indexed here (``ArtifactReference``) when the
checkpoint is written, because envelopes are encrypted: without the index, knowing whether
an artifact is still referenced would mean decrypting every envelope of the tenant.
"""

from __future__ import annotations

from django.db import models

from checkpoints.models import Artifact, Checkpoint, Run
from tenants.models import Tenant


class RetentionPolicy(models.Model):
    """How long a tenant keeps history; ``workflow_type`` blank is the tenant's default.

    Every period is in days and counts from the moment a run ended (its last update) —
    except ``model_context_days``, which counts from the artifact's creation. Empty means
    keep forever.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="retention_policies")
    workflow_type = models.CharField(max_length=100, blank=True)
    intermediate_days = models.PositiveIntegerField(null=True, blank=True)
    model_context_days = models.PositiveIntegerField(null=True, blank=True)
    failed_run_days = models.PositiveIntegerField(null=True, blank=True)
    run_expiry_days = models.PositiveIntegerField(null=True, blank=True)
    updated_by = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "workflow_type"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "workflow_type"], name="retention_one_policy_per_scope"
            )
        ]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        scope = self.workflow_type or "default"
        return f"{self.tenant.slug}/{scope}"


class CompactionReason(models.TextChoices):
    INTERMEDIATE = "intermediate"  # the run's intermediate checkpoints passed their period
    EXPIRY = "expiry"  # the whole run expired


class CompactionRecord(models.Model):
    """Checkpoints one retention batch removed from one run, with their hashes.

    ``removed`` lists ``{"sequence", "sha256", "parent_sha256", "state", "step",
    "created_at"}`` for each removed checkpoint, so ``run_verify`` can still link the kept
    checkpoints on either side of the gap.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="compactions")
    policy = models.ForeignKey(RetentionPolicy, null=True, on_delete=models.SET_NULL)
    policy_label = models.CharField(max_length=200)  # survives the policy's deletion
    reason = models.CharField(max_length=16, choices=CompactionReason.choices)
    first_sequence = models.PositiveBigIntegerField()
    last_sequence = models.PositiveBigIntegerField()
    removed = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "first_sequence"]
        indexes = [models.Index(fields=["run", "first_sequence"])]

    def __str__(self) -> str:
        return f"compaction of {self.run_id} {self.first_sequence}-{self.last_sequence}"


class ArtifactReference(models.Model):
    """Checkpoint → artifact, written in the commit transaction (``references_record``).

    ``artifact`` is PROTECT with a real foreign key, so the database itself refuses to delete
    an artifact that a checkpoint still names.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="+")
    artifact = models.ForeignKey(Artifact, on_delete=models.PROTECT, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["checkpoint", "artifact"], name="artifact_reference_once"
            )
        ]
        indexes = [models.Index(fields=["artifact"])]

    def __str__(self) -> str:
        return f"{self.checkpoint_id} → {self.artifact_id}"


class PendingFileDeletion(models.Model):
    """An artifact file whose row is gone; the file is removed after the commit.

    Written in the transaction that deletes the artifact row, so a job killed between the
    commit and the file deletion leaves a row the next run finishes, never a lost file name.
    """

    id = models.BigAutoField(primary_key=True)
    storage_name = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.storage_name
